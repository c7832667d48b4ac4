"""Schemas of API tokens and identity."""

from marshmallow import Schema, ValidationError, fields, validate

from fleetd.credentials import TOKEN_NAME_MAX, TOKEN_NAME_PATTERN, token_name_problem
from fleetd.models import LIMIT_NAMES, Role
from fleetd.names import LOGIN
from fleetd.schemas.common import Bool, FullRegexp, Int, Text, Time, page_schema

POSIX_USER = FullRegexp(
    r"^[a-z_][a-z0-9_-]{0,31}$",
    error="a POSIX user name: a lowercase letter or _, then at most 31 of a-z 0-9 _ -",
)


def token_name(name):
    problem = token_name_problem(name)
    if problem:
        raise ValidationError(problem)


def _not_root(name):
    if name == "root":
        raise ValidationError(
            "tasks never run as root through a token; a fleet's allow_root_tasks lets admins' "
            "work run as root"
        )


class LimitsSchema(Schema):
    """A token's own limits; a limit left out (or null) is the server's setting."""

    max_active_jobs = Int(
        maximum=10**9,
        allow_none=True,
        metadata={"description": "its jobs that have not ended (queued, running, cancelling)"},
    )
    max_instances = Int(
        maximum=10**6,
        allow_none=True,
        metadata={"description": "its instances that are not deleted"},
    )
    max_spec_bytes = Int(
        maximum=1024**3,
        allow_none=True,
        metadata={
            "description": (
                "one job or instance spec as stored (a request body is at most 1 MiB anyway)"
            )
        },
    )
    max_stored_spec_bytes = Int(
        maximum=2**60,
        allow_none=True,
        metadata={
            "description": (
                "the bytes of the specs its jobs, instances and their runs store; ended jobs and "
                "deleted instances count until the gc deletes them"
            )
        },
    )
    max_artifact_bytes = Int(
        maximum=2**60,
        allow_none=True,
        metadata={
            "description": (
                "the bytes of what it uploaded, each artifact counted as if no one else had it"
            )
        },
    )
    requests_per_second = fields.Float(
        allow_none=True,
        validate=validate.Range(min=0.01, max=1e6),
        metadata={
            "description": "its API requests per second (with a burst of a few seconds' worth)"
        },
    )


class TokenCreateSchema(Schema):
    name = Text(
        required=True,
        min_length=1,
        max_length=TOKEN_NAME_MAX,
        validate=[token_name],
        metadata={
            "pattern": TOKEN_NAME_PATTERN,
            "description": "printable text on one line, no space at either end, "
            "letters of one script, in NFKC form; unique among the "
            "tokens that are neither revoked nor expired",
        },
    )
    role = fields.String(required=True, validate=validate.OneOf([r.value for r in Role]))
    team = Text(max_length=200, load_default=None, allow_none=True)
    expires_in_seconds = Int(
        minimum=60, maximum=10 * 365 * 86400, load_default=None, allow_none=True
    )
    unix_user = fields.String(
        validate=[POSIX_USER, _not_root],
        load_default=None,
        allow_none=True,
        metadata={
            "description": (
                "the host user this token's tasks run as (it must exist on the nodes); none: a uid "
                "fleetd allocates for the token. Not a system account (uid below 1000, or nobody) "
                "unless the server's tokens_allow_system_users names it; not another live token's "
                "user unless share_unix_user"
            )
        },
    )
    share_unix_user = Bool(
        load_default=False,
        load_only=True,
        metadata={
            "description": (
                "true: take a unix_user that a live token already has (409 otherwise): both tokens "
                "are one tenant on the hosts, whose tasks read each other's files"
            )
        },
    )
    limits = fields.Nested(
        LimitsSchema,
        load_default=None,
        allow_none=True,
        metadata={
            "description": "this token's own limits; those left out are the server's settings"
        },
    )
    user = fields.String(
        validate=FullRegexp(
            LOGIN, error="a login: a lower-case letter or _, then at most 63 of a-z 0-9 _ . -"
        ),
        load_default=None,
        allow_none=True,
        metadata={
            "description": "the login of the user that owns it (made if none has it): all "
            "its tokens are one owner; none: the token owns its work itself"
        },
    )


class TokenUpdateSchema(Schema):
    limits = fields.Nested(
        LimitsSchema,
        required=True,
        metadata={
            "description": (
                "the limits to change: a value sets it for this token, null gives it back to the "
                "setting; limits left out stay as they are"
            )
        },
    )


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
    user_id = fields.String(
        allow_none=True, metadata={"description": "the id of the user that owns it"}
    )
    project = fields.String(
        allow_none=True, metadata={"description": "a service account's project"}
    )
    limits = fields.Function(
        lambda t: {name: (t.limits or {}).get(name) for name in LIMIT_NAMES},
        metadata={"description": "the limits set on this token; null: the server's setting"},
    )


class TokenCreatedSchema(TokenSchema):
    token = fields.String(metadata={"description": "The secret; shown only in this response."})


TokenPageSchema = page_schema(TokenSchema, "TokenPage")


class OwnerUseSchema(Schema):
    active_jobs = fields.Integer()
    instances = fields.Integer()
    stored_spec_bytes = fields.Integer(
        metadata={"description": "what max_stored_spec_bytes counts"}
    )
    artifact_bytes = fields.Integer()


class HealthSchema(Schema):
    status = fields.String()
    version = fields.String()
    replica_id = fields.String(metadata={"description": "this fleetd process among the replicas"})
    leader = fields.Boolean(
        metadata={"description": "whether this replica leads (schedules, decides liveness)"}
    )
    leader_epoch = fields.Integer(
        metadata={"description": "the leader lease's fencing epoch, as last seen"}
    )
