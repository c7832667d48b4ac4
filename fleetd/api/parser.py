"""Request bodies: strict JSON that only holds values every database and the scheduler can take.

Python's json module accepts NaN, Infinity and -Infinity (not JSON), turns 1e400 into
infinity, decodes "\\ud800" into an unpaired surrogate that no database can encode, and
gives up with a RecursionError or a ValueError on deep nesting or huge integers. Each of
those reached a 500 or, worse, a stored job that broke every scheduling pass. It also keeps
the last of two equal keys in one object, so that what a proxy or an audit log read
(`{"name": "a", "name": "b"}`: the first, to many parsers) is not what fleetd did. Here each is
a 400 with the error envelope before any schema sees the body.
"""

import json
import math
import re

import flask_smorest
from webargs import core
from webargs.flaskparser import FlaskParser, is_json_request

from fleetd.errors import InvalidRequest

MAX_DEPTH = 32  # the deepest schema nests 4 levels; metrics maps a few more
MAX_INT_DIGITS = 20  # every integer field is a BIGINT: 19 digits and a sign
_FORBIDDEN_CHARS = re.compile("[\x00\ud800-\udfff]")


class BadJson(ValueError):
    """The body is JSON that fleetd does not take."""


def _no_constant(name):
    raise BadJson(f"{name} is not a number (JSON has no NaN or Infinity)")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise BadJson(f"the number {text[:40]} is out of range")
    return value


def _unique_keys(pairs):
    """An object's members as a dict; BadJson naming the first key that appears twice."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen = set()
        for key, _item in pairs:
            if key in seen:
                raise BadJson(f"the key {key[:64]!r} appears more than once in one object")
            seen.add(key)
    return value


def _bounded_int(text):
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise BadJson(f"an integer of {len(text)} digits is out of range")
    return int(text)


def forbidden_text(text):
    """True when `text` holds a NUL or an unpaired surrogate (no database stores either)."""
    return _FORBIDDEN_CHARS.search(text) is not None


def _check(value, depth=0):
    """Refuse nesting deeper than MAX_DEPTH and strings with NUL or unpaired surrogates."""
    if depth > MAX_DEPTH:
        raise BadJson(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if forbidden_text(value):
            raise BadJson("a string holds a NUL character or an unpaired surrogate")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check(key, depth + 1)
            _check(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth + 1)


def loads(body):
    """Parse a request body (bytes or str) as strict JSON; BadJson says why it is refused."""
    try:
        text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else body
    except UnicodeDecodeError as exc:
        raise BadJson(f"the body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(
            text,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
            object_pairs_hook=_unique_keys,
        )
    except RecursionError:
        raise BadJson(f"nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise BadJson(
            f"the body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    # Only an escape can make a NUL or a surrogate (the decoder refuses raw control characters
    # and the UTF-8 decode above refuses encoded surrogates); only brackets can nest.
    if "\\u" in text or text.count("[") + text.count("{") > MAX_DEPTH:
        _check(value)
    return value


class StrictParser(FlaskParser):
    """webargs' Flask parser with fleetd's strict JSON bodies."""

    def load_json(self, req, schema):
        """The request's JSON body, or `missing` when it has none (or is not JSON)."""
        body = req.get_data(cache=True)
        if not body:  # whitespace alone is not JSON: refused as any other text is
            return core.missing
        if not is_json_request(req):
            raise InvalidRequest(
                "the body must be JSON, sent with Content-Type: application/json",
                {"fields": {"json": ["not JSON"]}},
            )
        try:
            return loads(body)
        except BadJson as exc:
            raise InvalidRequest(str(exc), {"fields": {"json": [str(exc)]}}) from None


def null_means_null(self, field, ret):
    """An apispec attribute function: a nullable nested schema is that schema or null.

    apispec writes the null branch for OpenAPI 3.0 as {"type": "object", "nullable": true}, which
    any object matches, so the document would allow every object where fleetd takes one shape.
    """
    branches = ret.get("anyOf")
    if not branches or {"type": "object", "nullable": True} not in branches:
        return {}
    return {
        "anyOf": [
            dict(b, enum=[None]) if b == {"type": "object", "nullable": True} else b
            for b in branches
        ]
    }


class Blueprint(flask_smorest.Blueprint):
    """flask-smorest's Blueprint, parsing bodies with the strict parser."""

    ARGUMENTS_PARSER = StrictParser()
