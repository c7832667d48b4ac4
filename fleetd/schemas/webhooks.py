"""Schemas of webhooks and their deliveries. The secret is accepted, never shown."""

import urllib.parse

from marshmallow import Schema, ValidationError, fields, validate, validates

from fleetd.models import WEBHOOK_KINDS as KINDS
from fleetd.schemas.common import Text, Time, page_schema


def valid_url(url):
    """An error message for a URL a webhook cannot use, or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (the signature authenticates fleetd)"
    if parts.fragment:
        return "must not have a fragment"
    return None


class WebhookCreateSchema(Schema):
    url = Text(
        required=True, min_length=1, max_length=2048, validate=[validate.Regexp(r"^https?://")]
    )
    secret = Text(required=True, min_length=16, max_length=256, load_only=True)
    events = fields.List(
        fields.String(validate=validate.OneOf(KINDS)),
        required=True,
        validate=validate.Length(min=1, max=len(KINDS) * 4),
        metadata={"description": "event kinds: " + ", ".join(KINDS)},
    )

    @validates("url")
    def _url(self, value, **_):
        problem = valid_url(value)
        if problem:
            raise ValidationError(problem)


class WebhookSchema(Schema):
    id = fields.String()
    url = fields.String()
    events = fields.List(fields.String())
    created_at = Time()
    created_by = fields.String()


WebhookPageSchema = page_schema(WebhookSchema, "WebhookPage")


class DeliverySchema(Schema):
    id = fields.String()
    event = fields.String(attribute="kind")
    at = Time()
    status_code = fields.Integer(allow_none=True)
    attempts = fields.Integer()
    error = fields.String()
    state = fields.String(metadata={"description": "pending, delivered or failed (given up)"})
    next_attempt_at = Time(metadata={"description": "when a pending delivery is tried next"})


DeliveryPageSchema = page_schema(DeliverySchema, "WebhookDeliveryPage")
