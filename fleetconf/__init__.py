"""One configuration loader for fleetd and fleet-agent: defaults, then a TOML file, then
<PREFIX>_<NAME> environment variables, then explicit overrides, into a dataclass.

Both programs import this package and nothing of each other (the agent never imports the
server). Tables flatten to `<table>_<key>`; unknown keys are an error, so that a typo never
falls back to a default silently; values from the environment are text and are converted by
the field's type (a bool takes true/false, yes/no, on/off, 1/0, nothing else).
"""

import dataclasses
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def read_toml(path, error):
    """The TOML file's tables flattened to {table_key: value}; `error` (an exception class) on an
    unreadable or invalid file."""
    try:
        with open(path, "rb") as fh:
            return flatten(tomllib.load(fh))
    except OSError as exc:
        raise error(f"cannot read config {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"config {path} is not valid TOML: {exc}") from None


def flatten(data, prefix="", keep=("labels",)):
    """{"a": {"b": 1}} -> {"a_b": 1}; tables named in `keep` stay tables."""
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name not in keep:
            out.update(flatten(value, name + "_"))
        else:
            out[name] = value
    return out


def convert(name, kind, raw, error):
    """`raw` (from TOML or the environment) as a `kind` (bool, int, float, str)."""
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in TRUE:
            return True
        if text in FALSE:
            return False
        raise error(f"{name} must be true or false, got {raw!r}")
    if kind is int and isinstance(raw, float) and not raw.is_integer():
        raise error(f"{name} must be int, got {raw!r}")
    try:
        return kind(raw)
    except (TypeError, ValueError):
        raise error(f"{name} must be {kind.__name__}, got {raw!r}") from None


def load(cls, prefix, values, environ, overrides, error, special=None, where="config"):
    """cls(**converted) from file `values`, then `prefix`+NAME variables, then `overrides`.

    `special`: {field name: fn(raw) -> value} for fields whose text has a syntax of its own.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise error(f"unknown key(s) in {where}: " + ", ".join(unknown))
    values = dict(values)
    for name in fields:
        raw = environ.get(prefix + name.upper())
        if raw is not None and raw != "":
            values[name] = raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise error("unknown setting(s): " + ", ".join(unknown))
    special = special or {}
    out = {}
    for name, raw in values.items():
        if name in special:
            out[name] = special[name](raw)
        else:
            field = fields[name]
            kind = type(field.default) if field.default is not dataclasses.MISSING else dict
            out[name] = convert(name, kind, raw, error)
    return cls(**out)


def parse_host_port(value, error, what="address", default_host=None):
    """'host:port' (IPv6 as '[::1]:8001') -> (host, port 0-65535); an empty host is
    `default_host` (an error when None)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise error(f"{what} must be HOST:PORT, got {value!r}")
    host = host.strip("[]") or default_host
    if not host:
        raise error(f"{what} must be HOST:PORT, got {value!r}")
    return host, int(port)
