"""The agent's side of the agent protocol (API.md "Agent protocol", X-Fleet-Protocol: 1)."""

import requests
from requests.adapters import HTTPAdapter

PROTOCOL_HEADER = "X-Fleet-Protocol"
PROTOCOL_VERSION = "1"


class FleetdError(Exception):
    """fleetd answered with an error (or not at all)."""

    def __init__(self, message, status=None, code=None, retry_after=None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


class Unreachable(FleetdError):
    """Worth retrying: no connection, a timeout, 429, or a 5xx."""


class Rejected(FleetdError):
    """Not worth retrying with the same credentials: 401 (revoked, replaced or unknown session)."""


class _PinnedAdapter(HTTPAdapter):
    """Accepts exactly one server certificate, by its SHA-256 fingerprint."""

    def __init__(self, fingerprint, **kwargs):
        self.fingerprint = fingerprint
        super().__init__(**kwargs)

    def init_poolmanager(self, *args, **kwargs):
        kwargs["assert_fingerprint"] = self.fingerprint
        super().init_poolmanager(*args, **kwargs)


class FleetClient:
    """Calls to fleetd's /api/v1/agent routes."""

    def __init__(self, server_url, session_token=None, ca_file="", tls_pin="", timeout=10.0):
        self.base = server_url.rstrip("/")
        self.session_token = session_token
        self.timeout = timeout
        self.http = requests.Session()
        self.http.headers[PROTOCOL_HEADER] = PROTOCOL_VERSION
        self.http.trust_env = False  # never send node credentials through an environment proxy
        if tls_pin:
            # The pin replaces CA validation (self-signed fleetd); urllib3 checks the fingerprint.
            self.http.verify = False
            self.http.mount("https://", _PinnedAdapter(tls_pin.replace(":", "").lower()))
        elif ca_file:
            self.http.verify = ca_file

    def close(self):
        """Close pooled connections."""
        self.http.close()

    def register(self, join_token, body):
        """POST /agent/register with a join token -> {node_id, fleet, session_token, heartbeat_interval_seconds}."""
        return self._post("/api/v1/agent/register", body, join_token)

    def heartbeat(self, body):
        """POST /agent/heartbeat -> {status, drain, revoked, cancel, heartbeat_interval_seconds}."""
        return self._post("/api/v1/agent/heartbeat", body, self.session_token)

    def deregister(self):
        """POST /agent/deregister: leave the fleet."""
        self._post("/api/v1/agent/deregister", {}, self.session_token)

    def _post(self, path, body, token):
        try:
            resp = self.http.post(self.base + path, json=body, timeout=self.timeout,
                                  headers={"Authorization": f"Bearer {token}"})
        except requests.exceptions.SSLError as exc:
            raise Unreachable(f"TLS error talking to fleetd: {_short(exc)}") from None
        except requests.RequestException as exc:
            raise Unreachable(f"fleetd unreachable: {_short(exc)}") from None
        if resp.status_code in (200, 201):
            return resp.json()
        if resp.status_code == 204:
            return None
        code, message = _error(resp)
        if resp.status_code == 401:
            raise Rejected(message, resp.status_code, code)
        if resp.status_code == 429 or resp.status_code >= 500:
            retry_after = resp.headers.get("Retry-After")
            raise Unreachable(f"fleetd answered {resp.status_code} {code}: {message}", resp.status_code, code,
                              float(retry_after) if retry_after and retry_after.isdigit() else None)
        raise FleetdError(f"fleetd answered {resp.status_code} {code}: {message}", resp.status_code, code)


def _error(resp):
    try:
        err = resp.json()["error"]
        return err.get("code", ""), err.get("message", "")
    except (ValueError, KeyError, TypeError):
        return "", resp.text[:200]


def _short(exc):
    # requests nests the reason deep inside; the innermost text is the useful part.
    reason = exc
    while getattr(reason, "args", None) and isinstance(reason.args[0], BaseException):
        reason = reason.args[0]
    return str(getattr(reason, "reason", None) or reason)[:300]
