"""The effective configuration (GET /api/v1/config): every setting as this process uses it, with
secrets redacted."""

import dataclasses
import os
import urllib.parse

REDACTED = "(redacted)"
# Settings whose value is a secret as a whole; a URL setting keeps its shape but loses its password.
_SECRET_WORDS = ("secret", "password", "passwd", "private_key", "api_key")
_URL_SETTINGS = ("db_url", "database_url", "public_url")


def _redacted_url(url):
    """`url` with the password of its user info replaced (postgresql://fleetd:(redacted)@db/fleetd)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return REDACTED
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username}:{REDACTED}@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


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
    derived = {"database_url": database_url, "failover_grace_seconds": settings.failover_grace,
               "policy_by_fleet": settings.policy_by_fleet}
    return {"settings": values, "derived": derived, "config_file": environ.get("FLEETD_CONFIG") or None,
            "redacted": sorted(redacted)}
