"""Field types and schemas shared by every resource: bounded, strict, NUL-free."""

import re

from marshmallow import Schema, ValidationError, fields, validate

from fleetd.clock import isoformat

MAX_INT = 2**63 - 1
MAX_LABELS = 64
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?$")


class Text(fields.String):
    """A string with a maximum length and no NUL characters (PostgreSQL refuses them)."""

    def __init__(self, *, max_length=255, min_length=0, **kwargs):
        validators = list(kwargs.pop("validate", []) or [])
        validators.append(validate.Length(min=min_length, max=max_length))
        super().__init__(validate=validators, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        value = super()._deserialize(value, attr, data, **kwargs)
        if "\x00" in value:
            raise ValidationError("must not contain NUL characters")
        return value


class FullRegexp(validate.Regexp):
    """marshmallow's Regexp read in full: its `match` lets a pattern that ends in `$` take a
    trailing newline ("alice\n"). The pattern itself stays as written (`^...$`), as OpenAPI
    documents it."""

    def __call__(self, value):
        if self.regex.fullmatch(value) is None:
            raise ValidationError(self._format_error(value))
        return value


class Int(fields.Integer):
    """A strict integer (no strings, no floats) within the range of a database BIGINT."""

    def __init__(self, *, minimum=0, maximum=MAX_INT, strict=True, **kwargs):
        super().__init__(strict=strict, validate=validate.Range(min=minimum, max=maximum), **kwargs)


class Bool(fields.Boolean):
    """A JSON true or false, nothing else (marshmallow's Boolean also takes 0, 1, "yes",
    "on"...)."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise ValidationError("true or false")
        return value


class Time(fields.Field):
    """A naive-UTC datetime rendered as an RFC 3339 string."""

    def _serialize(self, value, attr, obj, **kwargs):
        return isoformat(value)


def check_labels(labels):
    if len(labels) > MAX_LABELS:
        raise ValidationError(f"at most {MAX_LABELS} labels")
    for key in labels:
        if not LABEL_KEY_RE.match(key):
            raise ValidationError(
                f"invalid label key {key[:64]!r}: letters, digits and ._/- (at most 128)"
            )


def Labels(**kwargs):
    """A {key: value} map of strings with bounded size."""
    return fields.Dict(
        keys=fields.String(), values=Text(max_length=255), validate=check_labels, **kwargs
    )


class PageQuerySchema(Schema):
    """?limit= and ?cursor= of every list."""

    limit = Int(minimum=1, maximum=1000, load_default=100, strict=False)  # query strings are text
    cursor = Text(max_length=512, load_default=None)


def page_schema(item_schema, name):
    """A {items, next_cursor} list schema for `item_schema`."""
    return Schema.from_dict(
        {
            "items": fields.List(fields.Nested(item_schema)),
            "next_cursor": fields.String(allow_none=True),
        },
        name=name,
    )


class ErrorDetailSchema(Schema):
    code = fields.String(required=True)
    message = fields.String(required=True)
    details = fields.Dict()


class ErrorSchema(Schema):
    """The error envelope of every failure."""

    error = fields.Nested(ErrorDetailSchema, required=True)
