"""The FleetdError hierarchy and the one handler that renders every error as the API envelope."""

import logging

import peewee
from playhouse.pool import MaxConnectionsExceeded
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class FleetdError(Exception):
    """An error with an HTTP status and a stable code (docs/api.md)."""

    http_status = 500
    code = "internal"

    def __init__(self, message, details=None, headers=None):
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers or {}


class InvalidRequest(FleetdError):
    http_status, code = 400, "invalid_request"


class ProtocolMismatch(FleetdError):
    http_status, code = 400, "protocol_mismatch"


class Unauthorized(FleetdError):
    http_status, code = 401, "unauthorized"


class Forbidden(FleetdError):
    http_status, code = 403, "forbidden"


class NotFound(FleetdError):
    http_status, code = 404, "not_found"


class Conflict(FleetdError):
    http_status, code = 409, "conflict"


class LimitExceeded(FleetdError):
    """An owner's limit (services.identity.limits) would be passed: `limit` names it, `value` is
    what it allows, `use` what the owner holds (or would, for one spec's size); nothing was
    stored."""

    http_status, code = 409, "limit_exceeded"

    def __init__(self, limit, value, use, what):
        super().__init__(
            f"{what}: over the limit {limit} of {value} (use: {use})",
            {"limit": limit, "value": value, "use": use},
        )


class PayloadTooLarge(FleetdError):
    http_status, code = 413, "payload_too_large"


class RateLimited(FleetdError):
    http_status, code = 429, "rate_limited"

    def __init__(self, message, retry_after):
        super().__init__(message, headers={"Retry-After": str(max(1, int(retry_after + 0.999)))})


class Timeout(FleetdError):
    http_status, code = 504, "timeout"


class StoreUnavailable(FleetdError):
    """The output store cannot take a write now (its disk is full, its mount gone): the writer
    keeps what it has and tries again after Retry-After."""

    http_status, code = 503, "unavailable"

    def __init__(self, message, retry_after=30):
        super().__init__(message, headers={"Retry-After": str(retry_after)})


_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "invalid_request",
    409: "conflict",
    413: "payload_too_large",
    415: "invalid_request",
    422: "invalid_request",
    429: "rate_limited",
    503: "unavailable",
    504: "timeout",
}


def envelope(code, message, details=None):
    """The JSON body of every error response."""
    body = {"code": code, "message": message}
    if details:
        body["details"] = details
    return {"error": body}


def _from_http_exception(error):
    """Translate a werkzeug/webargs HTTPException into (status, body, headers)."""
    status = error.code or 500
    # webargs validation failures arrive as 422 with the messages in error.data.
    data = getattr(error, "data", None) or {}
    messages = data.get("messages")
    if status == 422:
        status = 400
    if status >= 500:
        return 500, envelope("internal", "internal server error"), {}
    code = _HTTP_CODES.get(status, "invalid_request")
    message = error.description if isinstance(error.description, str) else error.name
    details = {"fields": messages} if messages else None
    if messages:
        message = "the request did not validate"
    headers = {}
    if status == 405 and error.valid_methods:
        headers["Allow"] = ", ".join(error.valid_methods)
        details = {"allowed_methods": list(error.valid_methods)}
    return status, envelope(code, message, details), headers


def handle_error(error):
    """Render any exception as the error envelope; unexpected ones are logged, never shown."""
    if isinstance(error, FleetdError):
        status = error.http_status
        body = envelope(error.code, error.message, error.details)
        headers = error.headers
    elif isinstance(error, HTTPException):
        original = getattr(error, "original_exception", None)
        if error.code == 500 and original is not None:
            log.error("unhandled error", exc_info=original)
        status, body, headers = _from_http_exception(error)
    elif isinstance(error, (peewee.OperationalError, MaxConnectionsExceeded)):
        # The database is busy or unreachable: the client may retry; nothing was committed.
        log.warning("database unavailable: %s", error)
        status, body, headers = (
            503,
            envelope("unavailable", "database unavailable; retry later"),
            {"Retry-After": "1"},
        )
    else:
        log.error("unhandled error", exc_info=error)
        status, body, headers = 500, envelope("internal", "internal server error"), {}
    return body, status, headers


class SignInError(FleetdError):
    """A sign-in through an identity provider that did not (yet) give a session, with the
    provider's own code: 428 authorization_pending or 429 slow_down while a device sign-in waits
    for its user (RFC 8628), 400 expired_token or access_denied when it ended without one."""

    def __init__(self, code, message, details=None):
        super().__init__(message, details)
        self.code = code
        self.http_status = {"authorization_pending": 428, "slow_down": 429}.get(code, 400)


class ProviderUnavailable(FleetdError):
    """The identity provider did not answer (or answered nonsense): a new sign-in cannot be
    checked now; sessions already made keep working until they expire."""

    http_status, code = 503, "provider_unavailable"
