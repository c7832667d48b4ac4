"""The effective configuration (GET /api/v1/config): every setting as this process uses it, with
secrets redacted."""

import dataclasses
import os
import urllib.parse

REDACTED = "(redacted)"
# Settings whose value is a secret as a whole; a URL setting keeps its shape but loses its password.
_SECRET_WORDS = ("secret", "password", "passwd", "private_key", "api_key")
_URL_SETTINGS = ("db_url", "database_url", "public_url")


# Query parameters that carry a secret (libpq takes ?password= and ?sslpassword= as well as user
# info).
_SECRET_PARAMETERS = (*_SECRET_WORDS, "token")


def _redacted_url(url):
    """`url` with the password of its user info and the values of its secret query parameters
    replaced (postgresql://fleetd:(redacted)@db/fleetd, ...?sslmode=require&password=(redacted))."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
        port = parts.port
    except ValueError:
        return REDACTED
    if password is not None:
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        parts = parts._replace(
            netloc=f"{parts.username}:{REDACTED}@{host}" + (f":{port}" if port else "")
        )
    pairs, hidden = [], password is not None
    for pair in parts.query.split("&") if parts.query else ():
        name = pair.partition("=")[0]
        secret = any(word in urllib.parse.unquote_plus(name).lower() for word in _SECRET_PARAMETERS)
        pairs.append(f"{name}={REDACTED}" if secret else pair)
        hidden = hidden or secret
    # Rebuilt only when something was hidden: urlunsplit drops the empty host of sqlite:///path.
    return urllib.parse.urlunsplit(parts._replace(query="&".join(pairs))) if hidden else url


def _value(name, value):
    if isinstance(value, str) and value and any(word in name for word in _SECRET_WORDS):
        return REDACTED, True
    if isinstance(value, str) and name in _URL_SETTINGS:
        shown = _redacted_url(value)
        return shown, shown != value
    return value, False


def effective_config(settings, environ=None):
    """{settings: {name: value}, derived: {...}, config_file, redacted: [names]} of `settings`."""
    environ = os.environ if environ is None else environ
    values, redacted = {}, []
    for field in dataclasses.fields(settings):
        values[field.name], hidden = _value(field.name, getattr(settings, field.name))
        if hidden:
            redacted.append(field.name)
    database_url, hidden = _value("database_url", settings.database_url)
    if hidden and "database_url" not in redacted:
        redacted.append("database_url")
    derived = {
        "database_url": database_url,
        "failover_grace_seconds": settings.failover_grace,
        "policy_by_fleet": settings.policy_by_fleet,
    }
    return {
        "settings": values,
        "derived": derived,
        "config_file": environ.get("FLEETD_CONFIG") or None,
        "redacted": sorted(redacted),
    }
