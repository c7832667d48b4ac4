"""Option values the commands parse: durations, sizes, GPU counts, KEY=VALUE labels, spec files."""

import re

import click

_DURATION_RE = re.compile(r"^(\d+)([smhdw]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value):
    """'90s', '30m', '24h', '7d', '2w' or plain seconds -> seconds."""
    match = _DURATION_RE.match(value.strip().lower())
    if not match:
        raise click.BadParameter(f"{value!r} is not a duration like 90s, 30m, 24h or 7d")
    return int(match.group(1)) * _UNITS[match.group(2)]


class Duration(click.ParamType):
    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_duration(value)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)$")
_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}


def parse_size(value):
    """'10G', '512Mi', '1.5TiB' or plain bytes -> bytes; K, M, G, T, P are powers of 1024."""
    match = _SIZE_RE.match(value.strip().lower())
    if not match or (match.group(3) and not match.group(2) and match.group(3) != "b"):
        raise click.BadParameter(
            f"{value!r} is not a size like 512M, 10G or 2T (binary units: 10G = 10 GiB)"
        )
    number = float(match.group(1)) * _SIZE_UNITS[match.group(2)]
    if not number.is_integer():
        raise click.BadParameter(f"{value!r} is not a whole number of bytes")
    return int(number)


class Size(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


class GpuCount(click.ParamType):
    name = "gpus"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of GPUs", param, ctx)
        if number >= 1 and number != int(number):
            return number  # fleetd refuses it, with the rule in its message
        return int(number) if number >= 1 or number == 0 else number


def parse_labels(values):
    """KEY=VALUE options (--label, --env) -> {KEY: VALUE}."""
    labels = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--label")
        labels[key] = value
    return labels


def load_spec(path):
    """The spec file of -f/--file (YAML or JSON) as a dict."""
    import yaml

    try:
        with open(path) as fh:
            spec = yaml.safe_load(fh)  # YAML is a superset of JSON: both work
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {path}: {exc.strerror}", param_hint="SPEC_FILE"
        ) from None
    except yaml.YAMLError as exc:
        raise click.BadParameter(
            f"{path} is not YAML or JSON: {exc}", param_hint="SPEC_FILE"
        ) from None
    if not isinstance(spec, dict):
        raise click.BadParameter(f"{path} must hold a JobSpec object", param_hint="SPEC_FILE")
    return spec
