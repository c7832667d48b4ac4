"""Schemas of API tokens and identity."""

from marshmallow import Schema, ValidationError, fields, validate

from fleetd.models import Role
from fleetd.schemas.common import Int, Text, Time, page_schema

POSIX_USER = validate.Regexp(r"^[a-z_][a-z0-9_-]{0,31}$", error="a POSIX user name: a lowercase letter or _, then at most 31 of a-z 0-9 _ -")


def _not_root(name):
    if name == "root":
        raise ValidationError("tasks never run as root through a token; a fleet's allow_root_tasks lets admins' "
                              "work run as root")


class TokenCreateSchema(Schema):
    name = Text(required=True, min_length=1, max_length=200)
    role = fields.String(required=True, validate=validate.OneOf([r.value for r in Role]))
    team = Text(max_length=200, load_default=None, allow_none=True)
    expires_in_seconds = Int(minimum=60, maximum=10 * 365 * 86400, load_default=None, allow_none=True)
    unix_user = fields.String(validate=[POSIX_USER, _not_root], load_default=None, allow_none=True, metadata={
        "description": "the host user this token's tasks run as (it must exist on the nodes); none: a uid fleetd "
                       "allocates for the token"})


class TokenSchema(Schema):
    id = fields.String()
    name = fields.String()
    role = fields.String()
    team = fields.String(allow_none=True)
    unix_user = fields.String(allow_none=True)
    created_at = Time()
    expires_at = Time()
    revoked_at = Time()
    revoked = fields.Function(lambda t: t.revoked_at is not None)


class TokenCreatedSchema(TokenSchema):
    token = fields.String(metadata={"description": "The secret; shown only in this response."})


TokenPageSchema = page_schema(TokenSchema, "TokenPage")


class WhoamiSchema(Schema):
    principal = fields.String()
    role = fields.String()
    team = fields.String(allow_none=True)
    node_id = fields.String(allow_none=True)


class HealthSchema(Schema):
    status = fields.String()
    version = fields.String()
    replica_id = fields.String(metadata={"description": "this fleetd process among the replicas"})
    leader = fields.Boolean(metadata={"description": "whether this replica leads (schedules, decides liveness)"})
    leader_epoch = fields.Integer(metadata={"description": "the leader lease's fencing epoch, as last seen"})
