"""A small REST client for fleetd, used by the CLI (and handy in scripts)."""

import os
import re
import sys
from urllib.parse import urlsplit, urlunsplit

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

    def field_errors(self):
        """Each validation error of `details.fields` as "resources.gpus: why", in order."""
        return field_errors(self.details.get("fields"))


_LOCATIONS = ("json", "query", "path", "headers", "form", "files", "cookies")


def field_errors(fields):
    """Flatten flask-smorest's nested {"json": {"resources": {"gpus": ["..."]}}} into lines."""
    if not isinstance(fields, dict):
        return []
    lines = []

    def walk(node, path):
        if isinstance(node, dict):
            for key in sorted(
                node,
                key=lambda k: (not str(k).isdigit(), int(k) if str(k).isdigit() else 0, str(k)),
            ):
                part = f"[{key}]" if str(key).isdigit() else (f".{key}" if path else str(key))
                walk(node[key], path + part)
        elif isinstance(node, (list, tuple)):
            for item in node:
                walk(item, path)
        elif node is not None:
            lines.append(f"{path or 'body'}: {node}")

    for key in fields:
        # The location (body, query) is the transport's business, not the user's.
        walk(fields[key], "" if key in _LOCATIONS else str(key))
    return lines


def normalise_url(url):
    """fleetd's base URL from what a user typed: the scheme is required, a trailing /api/v1 (copied
    from the API docs) is dropped; ClientError says what is wrong and how to fix it."""
    text = (url or "").strip()
    if not text:
        raise ClientError("no fleetd URL: give --url or FLEETD_URL, e.g. http://127.0.0.1:8080")
    if "://" not in text:
        raise ClientError(
            f"fleetd URL {text!r} has no scheme: use http://{text} (or https:// when fleetd is "
            "served with TLS)"
        )
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ClientError(
            f"fleetd URL {text!r} must start with http:// or https://, not {parts.scheme}://"
        )
    if not parts.hostname:
        raise ClientError(f"fleetd URL {text!r} names no host, e.g. http://127.0.0.1:8080")
    try:
        _ = parts.port  # urllib checks the port only when asked for it
    except ValueError:
        raise ClientError(f"fleetd URL {text!r} has a bad port") from None
    path = parts.path.rstrip("/")
    if path.endswith("/api/v1"):
        path = path[: -len("/api/v1")]  # the client adds it to every route itself
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


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
    return {k: v for k, v in data.items() if k in SAVED and isinstance(v, str)}


SAVED = ("url", "token", "refresh_token", "expires_at")  # what `fleetd login` keeps
REFRESH_AHEAD_SECONDS = 60  # a saved session this close to its end is refreshed before a command


def save_config(url, token, path=None, refresh_token=None, expires_at=None):
    """Save the URL and token (with a session's refresh token and end), readable by this user only
    (0600)."""
    import json

    path = path or config_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    values = {"url": url, "token": token, "refresh_token": refresh_token, "expires_at": expires_at}
    with os.fdopen(fd, "w") as fh:
        # JSON strings of printable ASCII are valid TOML basic strings.
        fh.write("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items() if v is not None))
    os.replace(path + ".tmp", path)
    return path


def fresh_session(saved, now=None, ahead=REFRESH_AHEAD_SECONDS):
    """The saved config, with its session refreshed first (and saved) when it ends within `ahead`
    seconds (a minute); a config without a refresh token (an API token) as it is."""
    import datetime as dt

    if not saved.get("refresh_token") or not saved.get("expires_at"):
        return saved
    now = now or dt.datetime.now(dt.timezone.utc)
    try:
        ends = dt.datetime.fromisoformat(saved["expires_at"].replace("Z", "+00:00"))
    except ValueError:
        return saved
    if (ends - now).total_seconds() > ahead:
        return saved
    session = Client(saved.get("url") or DEFAULT_URL).post(
        "/api/v1/auth/refresh", {"refresh_token": saved["refresh_token"]}
    )
    save_config(
        saved["url"],
        session["token"],
        refresh_token=session["refresh_token"],
        expires_at=session["expires_at"],
    )
    return {
        **saved,
        "token": session["token"],
        "refresh_token": session["refresh_token"],
        "expires_at": session["expires_at"],
    }


def credentials(url=None, token=None, ahead=REFRESH_AHEAD_SECONDS):
    """(url, token) for a command: those given (--url/--token, FLEETD_URL/FLEETD_TOKEN), else what
    `fleetd login` saved, its session refreshed first (and saved) when it ends within `ahead`
    seconds. token None when there is none; ClientError when the saved config cannot be read or
    its session refreshed."""
    saved = {}
    if not url or not token:
        saved = load_config()
        # The saved session is for the saved URL: refreshed only when it is the one to call.
        if not token and saved.get("url") == (url or saved.get("url")):
            saved = fresh_session(saved, ahead=ahead)
    return url or saved.get("url") or DEFAULT_URL, token or saved.get("token")


class Client:
    """Calls the fleetd API with a bearer token; raises ClientError on any failure."""

    def __init__(self, url, token=None, timeout=30.0):
        try:
            self.url, self._url_error = normalise_url(url), None
        except ClientError as exc:  # raised by the first call, where callers handle ClientError
            self.url, self._url_error = (url or "").rstrip("/"), exc
        self.token = token
        self.timeout = timeout
        self.session = requests.Session()

    def request(self, method, path, json=None, params=None, expect_json=True):
        """One call; returns the decoded JSON body (None for 204)."""
        resp = self._send(method, path, json=json, params=params)
        if resp.status_code == 204 or not expect_json:
            if resp.status_code >= 400:
                raise self._error(resp)
            return None
        if resp.status_code >= 400:
            raise self._error(resp)
        try:
            return resp.json()
        except ValueError:
            raise ClientError(
                f"{self.url} answered {resp.status_code} with a body that is not JSON; is it "
                f"fleetd?"
            ) from None

    def download(self, path, out, **params):
        """GET `path` and write its body to the binary file `out` as it comes (compressed on the
        wire, written as it is meant); returns the bytes written."""
        params = {k: v for k, v in params.items() if v is not None}
        resp = self._send("GET", path, params=params, stream=True)
        with resp:
            if resp.status_code >= 400:
                raise self._error(resp)
            written = 0
            try:
                for piece in resp.iter_content(chunk_size=1 << 20):
                    out.write(piece)
                    written += len(piece)
            except requests.RequestException as exc:
                raise ClientError(f"the download from {self.url} broke off: {exc}") from None
        return written

    def _send(self, method, path, json=None, params=None, stream=False):
        if self._url_error is not None:
            raise self._url_error
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            return self.session.request(
                method,
                self.url + path,
                json=json,
                params=params,
                headers=headers,
                timeout=self.timeout,
                stream=stream,
            )
        except requests.exceptions.SSLError as exc:
            raise ClientError(self._tls_problem(exc)) from None
        except requests.ConnectionError:
            raise ClientError(
                f"cannot connect to fleetd at {self.url} (is it running? check --url/FLEETD_URL)"
            ) from None
        except requests.Timeout:
            raise ClientError(
                f"fleetd at {self.url} did not answer within {self.timeout:.0f}s"
            ) from None
        except requests.RequestException as exc:
            raise ClientError(f"request to {self.url} failed: {exc}") from None

    def _tls_problem(self, exc):
        """Why a TLS handshake failed, in words: most often an https:// URL of a plain-HTTP
        server."""
        plain = urlunsplit(urlsplit(self.url)._replace(scheme="http"))
        try:
            answer = requests.get(plain + "/api/v1/health", timeout=min(self.timeout, 5.0))  # nosec B113  # it has one: at most 5 s
        except requests.RequestException:
            answer = None
        if answer is not None:
            return f"{self.url} speaks plain HTTP, not TLS: use {plain}"
        reason = str(exc)
        untrusted = re.search(r"certificate verify failed: ([^(')]+)", reason)
        if untrusted:
            return (
                f"the TLS certificate of {self.url} is not trusted ({untrusted.group(1).strip()}): "
                "point REQUESTS_CA_BUNDLE at the CA file that signed it"
            )
        return f"TLS with {self.url} failed: {reason}"

    def _error(self, resp):
        try:
            err = resp.json()["error"]
            message, code, details = err["message"], err["code"], err.get("details")
        except (ValueError, KeyError, TypeError):
            message, code, details = f"HTTP {resp.status_code}", None, None
            return ClientError(
                f"HTTP {resp.status_code}, not an answer of fleetd's (is {self.url} fleetd's URL, "
                "and is fleetd running behind it?)",
                resp.status_code,
                code,
                details,
            )
        if resp.status_code == 404 and message.startswith("The requested URL was not found"):
            # Flask's own 404: no such route, so the base URL is wrong (a path too many or too few).
            message = (
                f"{self.url} has no fleetd API at {urlsplit(resp.url).path}: the URL must be "
                "fleetd's root, like http://HOST:8080"
            )
        return ClientError(message, resp.status_code, code, details)

    def get(self, path, **params):
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path, body=None):
        return self.request("POST", path, json=body if body is not None else {})

    def patch(self, path, body):
        return self.request("PATCH", path, json=body)

    def put(self, path, body):
        return self.request("PUT", path, json=body)

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
