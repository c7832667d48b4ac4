"""Who acts: API tokens and their roles, admin UI sessions, owners' uids and stored spec bytes."""

import enum

import peewee

from fleetd.models.base import BaseModel, JSONText


class Role(str, enum.Enum):
    """Roles of API tokens (docs/api.md, Roles)."""

    ADMIN = "admin"
    SUBMITTER = "submitter"
    METRICS = "metrics"


# The limits an admin can set on an API token (`ApiToken.limits`; services.identity.limits checks them).
LIMIT_NAMES = ("max_active_jobs", "max_instances", "max_spec_bytes", "max_stored_spec_bytes", "max_artifact_bytes",
               "requests_per_second")


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
    unix_user = peewee.CharField(max_length=32, null=True)  # tasks of this token run as this host user
    limits = JSONText(null=True)  # {limit name: value} an admin set; a name not there is the setting's (migration 0018)


class OwnerSpecBytes(BaseModel):
    """The bytes of the specs an owner's jobs, instances and runs of instances store (their `spec`
    column, as stored), kept as the rows come and go (services.identity.limits; migration 0029): so that
    `max_stored_spec_bytes` is checked without summing the owner's rows at every submit."""

    token_id = peewee.CharField(primary_key=True, max_length=32)
    bytes = peewee.BigIntegerField(default=0)

    class Meta:
        table_name = "owner_spec_bytes"


class UiSession(BaseModel):
    """A signed-in admin UI session; signing out deletes it, which ends the cookie at once."""

    id = peewee.CharField(primary_key=True, max_length=64)
    token_id = peewee.CharField(max_length=32, index=True)
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField(index=True)


class OwnerUid(BaseModel):
    """The host uid whose tasks an owner (an API token, by id) runs as when it has no unix_user:
    allocated once from the configured range, the same on every node, never changed or reused."""

    token_id = peewee.CharField(primary_key=True, max_length=32)
    uid = peewee.IntegerField(unique=True)
    allocated_at = peewee.DateTimeField()


