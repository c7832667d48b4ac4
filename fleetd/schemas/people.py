"""Schemas of users, projects, their members and service accounts."""

from marshmallow import Schema, fields, validate

from fleetd.credentials import PROJECT_ROLES, TOKEN_NAME_MAX, TOKEN_NAME_PATTERN, USER_ROLES
from fleetd.names import PROJECT_KEY
from fleetd.schemas.common import Bool, FullRegexp, Int, PageQuerySchema, Text, Time, page_schema
from fleetd.schemas.tokens import LimitsSchema, OwnerUseSchema, token_name


class OwnTokenSchema(Schema):
    id = fields.String()
    name = fields.String()
    role = fields.String()
    created_at = Time()
    expires_at = Time(allow_none=True)
    last_used_at = Time(allow_none=True)


_KEY = FullRegexp(
    PROJECT_KEY,
    error="a key is 2 to 32 characters: lower-case letters, digits and '-', a letter first",
)


class PosixSchema(Schema):
    uid = fields.Integer(allow_none=True)
    gid = fields.Integer(allow_none=True)
    groups = fields.List(fields.Integer())


class UserSchema(Schema):
    login = fields.String()
    display_name = fields.String()
    email = fields.String(allow_none=True)
    active = fields.Boolean()
    role = fields.String(metadata={"enum": list(USER_ROLES)})
    team = fields.String(allow_none=True)
    default_project = fields.String(allow_none=True)
    posix = fields.Nested(
        PosixSchema,
        allow_none=True,
        metadata={"description": "the POSIX identity its provider sends, where it sends one"},
    )
    unix_user = fields.String(
        allow_none=True, metadata={"description": "the host user its tasks run as, if set"}
    )
    source = fields.String(
        metadata={
            "enum": ["oidc", "jwt", "scim", "token"],
            "description": "how fleetd came to know it",
        }
    )
    created_at = Time()
    deactivated_at = Time(allow_none=True)


UserPageSchema = page_schema(UserSchema, "UserPage")


class UserQuerySchema(PageQuerySchema):
    active = fields.Boolean(
        truthy={"true"}, falsy={"false"}, load_default=None
    )  # a query string: true or false


class UserPatchSchema(Schema):
    active = Bool(
        metadata={"description": "false: its sessions end and its tokens are revoked at once"}
    )
    role = fields.String(validate=validate.OneOf(USER_ROLES))
    default_project = fields.String(validate=_KEY, allow_none=True)


class ProjectSchema(Schema):
    key = fields.String()
    name = fields.String()
    display_name = fields.String()
    team = fields.String(
        allow_none=True, metadata={"description": "the team its work runs as (budgets, quotas)"}
    )
    description = fields.String()
    created_at = Time()


ProjectPageSchema = page_schema(ProjectSchema, "ProjectPage")


class ProjectCreateSchema(Schema):
    key = fields.String(required=True, validate=_KEY)
    name = Text(max_length=200, load_default=None, allow_none=True)
    display_name = Text(max_length=200, load_default=None, allow_none=True)
    team = Text(max_length=200, load_default=None, allow_none=True)
    description = Text(max_length=2000, load_default="", allow_none=True)


class ProjectPatchSchema(Schema):
    name = Text(max_length=200, min_length=1)
    display_name = Text(max_length=200, min_length=1)
    team = Text(max_length=200, allow_none=True)
    description = Text(max_length=2000, allow_none=True)


class MemberSchema(Schema):
    project = fields.String()
    login = fields.String()
    display_name = fields.String()
    role = fields.String(metadata={"enum": list(PROJECT_ROLES)})


class MemberListSchema(Schema):
    items = fields.List(fields.Nested(MemberSchema))


class MemberPutSchema(Schema):
    role = fields.String(required=True, validate=validate.OneOf(PROJECT_ROLES))


class ServiceAccountCreateSchema(Schema):
    name = Text(
        required=True,
        min_length=1,
        max_length=TOKEN_NAME_MAX,
        validate=[token_name],
        metadata={"pattern": TOKEN_NAME_PATTERN, "description": "as an API token's name"},
    )
    expires_in_seconds = Int(
        required=True,
        minimum=60,
        maximum=366 * 86400,
        metadata={"description": "a service account always expires (at most a year)"},
    )


class ServiceAccountSchema(Schema):
    id = fields.String()
    name = fields.String()
    project = fields.String()
    created_at = Time()
    expires_at = Time(allow_none=True)
    revoked_at = Time(allow_none=True)


class ServiceAccountCreatedSchema(ServiceAccountSchema):
    token = fields.String(metadata={"description": "shown this once; fleetd keeps only its hash"})


class ServiceAccountListSchema(Schema):
    items = fields.List(fields.Nested(ServiceAccountSchema))


class ProjectRoleSchema(Schema):
    key = fields.String()
    role = fields.String()


class WhoamiUserSchema(Schema):
    login = fields.String()
    display_name = fields.String()
    email = fields.String(allow_none=True)


class WhoamiSchema(Schema):
    principal = fields.String(metadata={"description": "user:<login>, token:<name> or node:<id>"})
    user = fields.Nested(
        WhoamiUserSchema, allow_none=True, metadata={"description": "null: no user owns it"}
    )
    role = fields.String()
    team = fields.String(allow_none=True)
    projects = fields.List(fields.Nested(ProjectRoleSchema))
    default_project = fields.String(allow_none=True)
    auth = fields.String(allow_none=True, metadata={"enum": ["session", "token", "jwt"]})
    node_id = fields.String(allow_none=True)
    token_id = fields.String(
        allow_none=True, metadata={"description": "the API token's id; null for a node"}
    )
    limits = fields.Nested(
        LimitsSchema,
        allow_none=True,
        metadata={
            "description": (
                "the limits that hold for this token (its own, else its user's, else the server's "
                "settings)"
            )
        },
    )
    use = fields.Nested(
        OwnerUseSchema,
        allow_none=True,
        metadata={"description": "what it holds of what they count"},
    )
    tokens = fields.List(
        fields.Nested(OwnTokenSchema),
        metadata={"description": "a user's live API tokens (never their secrets); [] otherwise"},
    )
