"""Who acts: API tokens and their roles, admin UI sessions, owners' uids and stored spec bytes."""

import enum

import peewee

from fleetd.models.base import BaseModel, JSONText


class Role(str, enum.Enum):
    """Roles of API tokens (docs/api.md, Roles)."""

    ADMIN = "admin"
    # reads what members read; meant for cordon, drain, rollouts, node labels; no tokens or prices
    OPERATOR = "operator"
    MEMBER = "member"  # submits and manages its own work
    SUBMITTER = "submitter"  # what a member may: the name tokens made before users keep
    VIEWER = "viewer"  # reads what members read
    METRICS = "metrics"
    SCIM = "scim"  # an identity provider's SCIM client: /scim/v2 only


# The limits an admin can set on an API token (`ApiToken.limits`; services.identity.limits checks
# them).
LIMIT_NAMES = (
    "max_active_jobs",
    "max_instances",
    "max_spec_bytes",
    "max_stored_spec_bytes",
    "max_artifact_bytes",
    "requests_per_second",
)


class ApiToken(BaseModel):
    """An API token (fla_<id>.<secret>); only the SHA-256 of the whole token is kept."""

    id = peewee.CharField(primary_key=True, max_length=32)
    name = peewee.CharField(max_length=200)
    role = peewee.CharField(max_length=20)
    team = peewee.CharField(max_length=200, null=True)
    token_hash = peewee.CharField(max_length=64)
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField(null=True, index=True)
    revoked_at = peewee.DateTimeField(null=True)
    last_used_at = peewee.DateTimeField(null=True)
    unix_user = peewee.CharField(
        max_length=32, null=True
    )  # tasks of this token run as this host user
    # Its owner: a user (migration 0031 made one per token name), or, for a service account, the
    # project it belongs to (user_id null). The owner of work is `owner_id`: the user's id, or a
    # service account's own token id.
    user_id = peewee.CharField(max_length=32, null=True, index=True)
    project = peewee.CharField(max_length=32, null=True)

    @property
    def owner_id(self):
        return self.user_id or self.id

    limits = JSONText(
        null=True
    )  # {limit name: value} an admin set; a name not there is the setting's (migration 0018)


class OwnerSpecBytes(BaseModel):
    """The bytes of the specs an owner's jobs, instances and runs of instances store (their `spec`
    column, as stored), kept as the rows come and go (services.identity.limits; migration 0029): so
    that `max_stored_spec_bytes` is checked without summing the owner's rows at every submit."""

    token_id = peewee.CharField(primary_key=True, max_length=32)
    bytes = peewee.BigIntegerField(default=0)

    class Meta:
        table_name = "owner_spec_bytes"


class UiSession(BaseModel):
    """A signed-in admin UI session; signing out deletes it, which ends the cookie at once. It
    acts as the API token it signed in with (`token_id`) or as the user's session a sign-in with
    an identity provider made (`auth_session_id`; migration 0035): exactly one of the two."""

    id = peewee.CharField(primary_key=True, max_length=64)
    token_id = peewee.CharField(max_length=32, index=True, null=True)
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField(index=True)
    auth_session_id = peewee.CharField(max_length=32, index=True, null=True)


class SignInAttempt(BaseModel):
    """A browser's sign-in with an identity provider under way (the authorization code flow with
    PKCE; services.identity.browser): made when fleetd sends the browser to the provider, deleted
    when the provider sends it back (whatever the outcome) or when it expires. `id` is the hash of
    the `state` sent; `browser_hash` the hash of the cookie that binds it to the browser."""

    id = peewee.CharField(primary_key=True, max_length=64)
    provider = peewee.CharField(max_length=64)
    nonce = peewee.CharField(max_length=64)
    code_verifier = peewee.CharField(max_length=128)
    browser_hash = peewee.CharField(max_length=64)
    redirect_uri = peewee.CharField(max_length=1000)
    next_path = peewee.CharField(max_length=1000, null=True)
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField(index=True)

    class Meta:
        table_name = "sign_in_attempt"


class OwnerUid(BaseModel):
    """The host uid whose tasks an owner (an API token, by id) runs as when it has no unix_user:
    allocated once from the configured range, the same on every node, never changed or reused."""

    token_id = peewee.CharField(primary_key=True, max_length=32)
    uid = peewee.IntegerField(unique=True)
    allocated_at = peewee.DateTimeField()


class User(BaseModel):
    """A person (or a migrated token's name): one owner for its work, usage, limits and uid on the
    nodes, whichever of its tokens or sessions acts. A user made from a token by migration 0031 has
    that token's id, so the work, usage and uid recorded under the token's id are the user's."""

    id = peewee.CharField(primary_key=True, max_length=32)
    login = peewee.CharField(max_length=64, unique=True)
    display_name = peewee.CharField(max_length=200, default="")
    email = peewee.CharField(max_length=320, null=True)
    active = peewee.BooleanField(default=True)
    role = peewee.CharField(max_length=20)
    team = peewee.CharField(max_length=200, null=True)
    default_project = peewee.CharField(max_length=32, null=True)
    unix_user = peewee.CharField(
        max_length=32, null=True
    )  # an admin-set host user (a migrated token's)
    posix = JSONText(
        null=True
    )  # {uid, gid, groups} from the provider's claims, where it sends them
    limits = JSONText(null=True)  # {limit name: value} an admin set (a migrated token's own)
    source = peewee.CharField(max_length=8)  # "token", "oidc" or "scim"
    provider = peewee.CharField(max_length=64, null=True)  # the OIDC provider it signs in with
    subject = peewee.CharField(max_length=255, null=True)  # its `sub` there
    scim_id = peewee.CharField(max_length=64, null=True, unique=True)
    external_id = peewee.CharField(max_length=255, null=True)
    groups = JSONText(null=True)  # the provider's (or SCIM's) groups at its last sign-in or update
    created_at = peewee.DateTimeField()
    deactivated_at = peewee.DateTimeField(null=True)

    class Meta:
        indexes = ((("provider", "subject"), True),)


class Project(BaseModel):
    """A group of work inside one team: every job and instance belongs to exactly one."""

    key = peewee.CharField(primary_key=True, max_length=32)
    name = peewee.CharField(max_length=200)
    display_name = peewee.CharField(max_length=200)
    team = peewee.CharField(max_length=200, null=True)
    description = peewee.TextField(default="")
    created_at = peewee.DateTimeField()


class ProjectMember(BaseModel):
    """A user's role in a project (admin, member or viewer); `bound`: set by the binding rules at
    sign-in (and taken away by them), not by an admin."""

    project = peewee.CharField(max_length=32)
    user_id = peewee.CharField(max_length=32, index=True)
    role = peewee.CharField(max_length=8)
    bound = peewee.BooleanField(default=False)

    class Meta:
        primary_key = peewee.CompositeKey("project", "user_id")


class AuthSession(BaseModel):
    """A signed-in user's session (fls_<id>.<secret>) and its refresh token; only hashes are
    kept."""

    id = peewee.CharField(primary_key=True, max_length=32)
    user_id = peewee.CharField(max_length=32, index=True)
    provider = peewee.CharField(max_length=64, null=True)
    token_hash = peewee.CharField(max_length=64)
    refresh_hash = peewee.CharField(max_length=64, unique=True)
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField()
    refresh_expires_at = peewee.DateTimeField(index=True)
    ended_at = peewee.DateTimeField(null=True)
    # The provider's own refresh token, to ask it again at each refresh (binding rules see the
    # groups of now); it cannot be hashed, since fleetd presents it. Dropped when the session ends.
    upstream_refresh = peewee.TextField(null=True)


class AuthProvider(BaseModel):
    """An OpenID Connect provider users sign in with, or an issuer whose JWTs are bearers."""

    name = peewee.CharField(primary_key=True, max_length=64)
    kind = peewee.CharField(max_length=8)  # "oidc" or "jwt"
    issuer = peewee.CharField(max_length=500)
    client_id = peewee.CharField(max_length=255, null=True)
    client_secret = peewee.CharField(max_length=500, null=True)  # write-only through the API
    audience = peewee.CharField(max_length=255, null=True)
    jwks_url = peewee.CharField(max_length=500, null=True)
    scopes = JSONText(null=True)
    claims = JSONText(null=True)
    created_at = peewee.DateTimeField()


class ScimUser(BaseModel):
    """A user an identity provider made through SCIM (services.identity.scim): its resource as the
    provider last wrote it. Its SCIM id is its user's id; `user_name_key` is its userName in lower
    case (SCIM compares userNames case-insensitively)."""

    user_id = peewee.CharField(primary_key=True, max_length=32)
    user_name_key = peewee.CharField(max_length=255, unique=True)
    doc = JSONText()
    created_at = peewee.DateTimeField()
    updated_at = peewee.DateTimeField()

    class Meta:
        table_name = "scim_user"


class ScimGroup(BaseModel):
    """A group an identity provider made through SCIM: its members' groups feed the binding rules
    (claim `scim_groups`)."""

    id = peewee.CharField(primary_key=True, max_length=32)
    display_name = peewee.CharField(max_length=255, index=True)
    doc = JSONText()  # the resource as written, less its members (ScimGroupMember)
    created_at = peewee.DateTimeField()
    updated_at = peewee.DateTimeField()

    class Meta:
        table_name = "scim_group"


class ScimGroupMember(BaseModel):
    """A member of a SCIM group: a SCIM user or another group, by id."""

    group_id = peewee.CharField(max_length=32)
    member_id = peewee.CharField(max_length=32, index=True)
    kind = peewee.CharField(max_length=8)  # "User" or "Group"

    class Meta:
        table_name = "scim_group_member"
        primary_key = peewee.CompositeKey("group_id", "member_id")
