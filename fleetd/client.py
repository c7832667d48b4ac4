"""A small REST client for fleetd, used by the CLI (and handy in scripts)."""

import os
import sys

import requests

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_URL = "http://127.0.0.1:8080"
MAX_PAGES = 1000


class ClientError(Exception):
    """A failed call: an error envelope from fleetd, or no answer at all."""

    def __init__(self, message, status=None, code=None, details=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.details = details or {}


def config_path():
    """Where `fleetd login` keeps the server URL and token."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "fleetd", "config.toml")


def load_config(path=None):
    """The saved {url, token}, or {} when there is none."""
    path = path or config_path()
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ClientError(f"cannot read {path}: {exc}") from None
    return {k: v for k, v in data.items() if k in ("url", "token") and isinstance(v, str)}


def save_config(url, token, path=None):
    """Save the URL and token, readable by this user only (0600)."""
    import json

    path = path or config_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        # JSON strings of printable ASCII are valid TOML basic strings.
        fh.write(f"url = {json.dumps(url)}\ntoken = {json.dumps(token)}\n")
    os.replace(path + ".tmp", path)
    return path


class Client:
    """Calls the fleetd API with a bearer token; raises ClientError on any failure."""

    def __init__(self, url, token=None, timeout=30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.session = requests.Session()

    def request(self, method, path, json=None, params=None, expect_json=True):
        """One call; returns the decoded JSON body (None for 204)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            resp = self.session.request(
                method, self.url + path, json=json, params=params, headers=headers, timeout=self.timeout
            )
        except requests.ConnectionError:
            raise ClientError(f"cannot connect to fleetd at {self.url} (is it running? check --url/FLEETD_URL)") from None
        except requests.Timeout:
            raise ClientError(f"fleetd at {self.url} did not answer within {self.timeout:.0f}s") from None
        except requests.RequestException as exc:
            raise ClientError(f"request to {self.url} failed: {exc}") from None
        if resp.status_code == 204 or not expect_json:
            if resp.status_code >= 400:
                raise self._error(resp)
            return None
        if resp.status_code >= 400:
            raise self._error(resp)
        try:
            return resp.json()
        except ValueError:
            raise ClientError(f"{self.url} answered {resp.status_code} with a body that is not JSON; is it fleetd?") from None

    @staticmethod
    def _error(resp):
        try:
            err = resp.json()["error"]
            message, code, details = err["message"], err["code"], err.get("details")
        except (ValueError, KeyError, TypeError):
            message, code, details = f"HTTP {resp.status_code}", None, None
        return ClientError(message, resp.status_code, code, details)

    def get(self, path, **params):
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path, body=None):
        return self.request("POST", path, json=body if body is not None else {})

    def patch(self, path, body):
        return self.request("PATCH", path, json=body)

    def delete(self, path):
        return self.request("DELETE", path)

    def paginate(self, path, **params):
        """Every item of a list, following next_cursor."""
        params = {k: v for k, v in params.items() if v is not None}
        for _ in range(MAX_PAGES):
            page = self.request("GET", path, params=params)
            yield from page["items"]
            if not page.get("next_cursor"):
                return
            params["cursor"] = page["next_cursor"]
        raise ClientError(f"more than {MAX_PAGES} pages from {path}; narrow the query")
