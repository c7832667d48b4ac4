"""Schemas of fleets and join tokens."""

from marshmallow import Schema, ValidationError, fields, validate

from fleetd import windows

from fleetd.schemas.common import Int, Labels, Text, Time, page_schema

FLEET_NAME = validate.Regexp(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", error="lowercase letters, digits and '-', at most 63, like a DNS label"
)


def _availability(value):
    try:
        windows.validate(value)
    except windows.WindowError as exc:
        raise ValidationError(str(exc)) from None


Availability = lambda **kw: fields.Dict(  # noqa: E731 - one definition for create and update
    allow_none=True, validate=_availability,
    metadata={"description": "None: always open; else {timezone, windows: [{start, end, days?}]}"}, **kw)


class FleetCreateSchema(Schema):
    name = fields.String(required=True, validate=FLEET_NAME)
    description = Text(max_length=2000, load_default="")
    labels = Labels(load_default=dict)
    availability = Availability(load_default=None)


class FleetUpdateSchema(Schema):
    description = Text(max_length=2000)
    labels = Labels()
    availability = Availability()


class FleetSchema(Schema):
    name = fields.String()
    description = fields.String()
    labels = fields.Dict()
    node_count = fields.Integer()
    gpu_count = fields.Integer()
    created_at = Time()
    availability = fields.Dict(allow_none=True)


FleetPageSchema = page_schema(FleetSchema, "FleetPage")


class JoinTokenCreateSchema(Schema):
    ttl_seconds = Int(minimum=60, maximum=365 * 86400, load_default=86400)
    max_uses = Int(minimum=1, maximum=1_000_000, load_default=None, allow_none=True)
    description = Text(max_length=500, load_default="")


class JoinTokenSchema(Schema):
    id = fields.String()
    fleet = fields.String(attribute="fleet_id")
    description = fields.String()
    created_at = Time()
    expires_at = Time()
    max_uses = fields.Integer(allow_none=True)
    uses = fields.Integer()
    revoked = fields.Boolean()


class JoinTokenCreatedSchema(JoinTokenSchema):
    token = fields.String(metadata={"description": "The secret; shown only in this response."})
    join_command = fields.String()


JoinTokenPageSchema = page_schema(JoinTokenSchema, "JoinTokenPage")
