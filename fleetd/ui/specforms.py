"""Create forms: the fields a person fills in -> the API's request body, checked by the API's own
schema.

A form is turned into exactly the JSON body the REST API takes (POST /api/v1/instances,
POST /api/v1/jobs), which then goes through the same marshmallow schema and the same service
call. Text that does not parse (a port of "abc") is passed on as it is, so the schema refuses it
with the API's own words. Each message is shown beside the form field it is about.
"""

import math
import shlex

import yaml
from marshmallow import ValidationError

from fleetd.errors import FleetdError
from fleetd.ui.forms import FormError, parse_number

GIB = 2**30
MAX_SPEC_CHARS = 256 * 1024  # a spec box holds what an API body may (the body limit is larger)
GENERAL = "_form"  # errors about the whole form: shown above it


def flatten(messages, prefix=""):
    """marshmallow's nested messages -> {"resources.gpus": [text, ...], ...}."""
    out: dict[str, list[str]] = {}
    if isinstance(messages, dict):
        for key, value in messages.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            for sub, texts in flatten(value, path).items():
                out.setdefault(sub, []).extend(texts)
    elif isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        out[prefix or GENERAL] = list(messages)
    elif isinstance(messages, list):
        for i, value in enumerate(messages):
            for sub, texts in flatten(value, f"{prefix}.{i}" if prefix else str(i)).items():
                out.setdefault(sub, []).extend(texts)
    else:
        out[prefix or GENERAL] = [str(messages)]
    return out


def to_fields(messages, field_of):
    """Flattened schema messages -> {form field: [text]}: a path goes to the field `field_of` names
    for its longest known prefix; a message about a nested item keeps its path in the text.
    `field_of` a string: every message goes beside that one field (a spec box), each with its whole
    path."""
    out: dict[str, list[str]] = {}
    if isinstance(field_of, str):
        return {
            field_of: [
                f"{path}: {t}" if path != GENERAL else t
                for path, texts in flatten(messages).items()
                for t in texts
            ]
        }
    for path, texts in flatten(messages).items():
        parts = path.split(".")
        target = None
        for n in range(len(parts), 0, -1):
            target = field_of.get(".".join(parts[:n]))
            if target:
                rest = ".".join(parts[n:])
                break
        if target is None:
            target, rest = (GENERAL if parts[0] == "_schema" else parts[0]), ".".join(parts[1:])
        out.setdefault(target, []).extend(
            f"{rest}: {t}" if rest and not rest.isdigit() else t for t in texts
        )
    return out


def service_errors(error, field_of):
    """A service's refusal (FleetdError) of a form -> {form field: [text]}: its `fields` details
    beside their fields, a taken name or a refused team beside that field, anything else above the
    form."""
    details = error.details if isinstance(error.details, dict) else {}
    if isinstance(details.get("fields"), dict):
        named = details["fields"]
        if isinstance(
            named.get("json"), dict
        ):  # where the API found it (the body); a form has no body
            named = named["json"]
        return to_fields(named, field_of)
    # A taken name (409), a team the token may not name or a project it may not submit to (403).
    for field in ("name", "team", "project"):
        if field in details:
            return {field_of if isinstance(field_of, str) else field: [error.message]}
    return {GENERAL: [error.message]}


def load(schema, body, field_of):
    """schema.load(body), or FormError with messages per form field."""
    try:
        return schema.load(body)
    except ValidationError as exc:
        raise FormError(to_fields(exc.messages, field_of)) from None


def run_service(call, field_of):
    """call(), or FormError when the service refuses what the form says (a 4xx: a bid under the
    minimum, a team the token may not name, a taken name): the form is shown again with the
    service's words. Server errors, a session that ended (401) and too many requests (429) pass."""
    try:
        return call()
    except FleetdError as exc:
        if exc.http_status >= 500 or exc.http_status in (401, 429):
            raise
        raise FormError(service_errors(exc, field_of)) from None


# ---------------------------------------------------------------- text fields -> body values


def number(raw):
    """A form's number as int or float; text that is not one (nor finite) is passed on for the
    schema to refuse."""
    raw = (raw or "").strip()
    value = parse_number(raw) if raw else None
    if isinstance(value, float) and not math.isfinite(value):
        return raw
    return value


def command(raw):
    """A command line as the shell splits it (quotes keep spaces); FormError on unbalanced
    quotes."""
    raw = (raw or "").strip()
    if not raw:
        return []
    try:
        return shlex.split(raw)
    except ValueError as exc:
        raise FormError({"command": [f"cannot split it into arguments: {exc}"]}) from None


def ports(raw):
    """'8888/http, 22/tcp' or '8000' (http) -> [{port, protocol}]."""
    out = []
    for item in (raw or "").replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        port, _, protocol = item.partition("/")
        out.append({"port": number(port), "protocol": protocol.strip() or "http"})
    return out


def env(form, prefix="env"):
    """Rows env_name / env_value (repeated inputs) -> {name: value}; a row without a name is ignored
    unless it has a value."""
    names, values = form.getlist(f"{prefix}_name"), form.getlist(f"{prefix}_value")
    out = {}
    for i, name in enumerate(names):
        name = name.strip()
        value = values[i] if i < len(values) else ""
        if name or value:
            out[name] = value
    return out


def env_rows(form, spare=2, prefix="env"):
    """The env rows to show again after a refused post (values included: they are the sender's own),
    and `spare` empty ones."""
    names, values = form.getlist(f"{prefix}_name"), form.getlist(f"{prefix}_value")
    rows = [(n, values[i] if i < len(values) else "") for i, n in enumerate(names) if n.strip()]
    return rows + [("", "")] * spare


MAX_SPEC_DEPTH = 32  # deeper than any JobSpec field goes
MAX_SPEC_VALUES = 100_000  # values in a spec, aliases counted each time they are used


def spec_text(raw):
    """A YAML or JSON spec from a text box -> a mapping; FormError beside the box when it is not
    one."""
    raw = raw or ""
    if len(raw) > MAX_SPEC_CHARS:
        raise FormError({"spec": [f"at most {MAX_SPEC_CHARS} characters"]})
    if _flow_depth(raw) > MAX_SPEC_DEPTH:  # before the parser, whose time grows fast with [[[[ ...
        raise FormError({"spec": [f"nested more than {MAX_SPEC_DEPTH} levels deep"]})
    try:
        data = yaml.safe_load(raw)  # YAML is a superset of JSON: both work
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise FormError({"spec": [f"not YAML or JSON: {where}{problem}"]}) from None
    except RecursionError:
        raise FormError({"spec": [f"nested more than {MAX_SPEC_DEPTH} levels deep"]}) from None
    if not isinstance(data, dict):
        raise FormError({"spec": ["a spec is a mapping of fields (name, command, resources, ...)"]})
    _check_size(data)
    return data


def _flow_depth(text):
    """How deep [ and { nest in a text, quoted or not: a cheap upper bound of a YAML or JSON
    document's flow nesting (a spec holding more than a few brackets in its strings is not a JobSpec
    anyone writes)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def _check_size(data):
    """FormError when a loaded spec nests too deep or holds too many values: YAML aliases can make a
    short text stand for a huge document."""
    stack, seen = [(data, 1)], 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if depth > MAX_SPEC_DEPTH:
            raise FormError({"spec": [f"nested more than {MAX_SPEC_DEPTH} levels deep"]})
        if seen > MAX_SPEC_VALUES:
            raise FormError(
                {
                    "spec": [
                        f"more than {MAX_SPEC_VALUES} values (aliases count each time they are "
                        f"used)"
                    ]
                }
            )
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
            stack.extend((k, depth + 1) for k in value)
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def scaled(raw, factor, whole=False):
    """A form's number in another unit (minutes -> seconds: 60); None when empty; text the schema
    refuses when it is not a number or the result is not finite."""
    value = number(raw)
    if not isinstance(value, (int, float)):
        return value
    result = value * factor
    if isinstance(result, float) and not math.isfinite(result):
        return str(raw).strip()
    if whole or (isinstance(result, float) and result.is_integer()):
        return int(result)
    return result


def gib_to_bytes(raw):
    """GiB as typed -> bytes (whole)."""
    return scaled(raw, GIB, whole=True)


def labels(raw, field="labels"):
    """'gpu=h100, zone=a' -> {"gpu": "h100", "zone": "a"}; FormError beside `field` for an item
    without '='."""
    out = {}
    for item in (raw or "").replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise FormError({field: [f"{item!r}: write each label as key=value"]})
        out[key.strip()] = value.strip()
    return out


def windows(raw):
    """Lines 'HH:MM-HH:MM [mon,tue,...]' -> [{start, end, days?}] (text that does not parse is
    passed on for the schema to refuse with its own words)."""
    out = []
    for line in (raw or "").splitlines():
        line = line.strip()
        if not line:
            continue
        span, _, days = line.partition(" ")
        start, _, end = span.partition("-")
        window = {"start": start.strip(), "end": end.strip()}
        if days.strip():
            window["days"] = [
                d.strip().lower() for d in days.replace(" ", ",").split(",") if d.strip()
            ]
        out.append(window)
    return out


def checked(form, name):
    """A checkbox: on when sent."""
    return form.get(name) in ("on", "true", "1", "yes")
