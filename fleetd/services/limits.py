"""Per-owner limits: what one API token may hold (active jobs, instances, stored artifact bytes) and
how large one of its specs may be. Each limit is the token's own when an admin set it
(`api_token.limits`), else the `limits_*` setting. The request rate is checked per request
(auth.RequestRates), not here.

A check runs inside the transaction that writes what it counts, after `hold_owner` has taken the
owner's lock: on SQLite every writer already queues up front (BEGIN IMMEDIATE); on PostgreSQL the
token's row is locked (SELECT ... FOR UPDATE), so two submits of one owner count one after the other
and cannot both pass the last free place."""

import json

import peewee

from fleetd.db import database
from fleetd.errors import LimitExceeded, NotFound
from fleetd.models import LIMIT_NAMES, ApiToken, Artifact, ArtifactUpload, Instance, InstanceState, Job, JobState

ACTIVE_JOB_STATES = [s.value for s in JobState if not s.is_terminal()]
_COUNT = peewee.fn.COUNT(peewee.SQL("*"))


def effective(settings, own):
    """{name: value} of every limit: the token's own (`own`, as stored; None or missing: the setting)."""
    own = own or {}
    return {name: own[name] if own.get(name) is not None else getattr(settings, f"limits_{name}")
            for name in LIMIT_NAMES}


def hold_owner(settings, principal):
    """Inside a write transaction: lock this API token's row (PostgreSQL) and return its limits read
    afresh (an admin may have changed them since the request was authenticated)."""
    query = ApiToken.select(ApiToken.limits).where(ApiToken.id == principal.id)
    if not isinstance(database.obj, peewee.SqliteDatabase):
        query = query.for_update()
    row = query.first()
    if row is None:
        raise NotFound(f"token {principal.id} not found")
    return effective(settings, row.limits)


def spec_bytes(spec):
    """The size of a spec as it is stored (models.JSONText's form)."""
    return len(json.dumps(spec.to_dict(), sort_keys=True).encode())


def check_spec(limits, spec, what):
    """LimitExceeded when this spec is larger than the owner may store."""
    size = spec_bytes(spec)
    if size > limits["max_spec_bytes"]:
        raise LimitExceeded("max_spec_bytes", limits["max_spec_bytes"], size, f"{what} refused: its spec is too large")


def check_new_job(limits, principal):
    """LimitExceeded when this owner already has as many active jobs as it may."""
    use = active_jobs(principal.id)
    if use + 1 > limits["max_active_jobs"]:
        raise LimitExceeded("max_active_jobs", limits["max_active_jobs"], use,
                            "job refused: you have as many queued and running jobs as you may")


def check_new_instance(limits, principal):
    """LimitExceeded when this owner already holds as many instances as it may."""
    use = instances(principal.id)
    if use + 1 > limits["max_instances"]:
        raise LimitExceeded("max_instances", limits["max_instances"], use,
                            "instance refused: you hold as many instances as you may (delete one first)")


def check_new_artifact(limits, principal, sha256, size):
    """LimitExceeded when storing `size` more bytes would pass the owner's artifact bytes; bytes it
    uploaded before cost nothing again."""
    mine = ArtifactUpload.select().where((ArtifactUpload.token_id == principal.id)
                                         & (ArtifactUpload.sha256 == sha256)).exists()
    if mine:
        return
    use = artifact_bytes(principal.id)
    if use + size > limits["max_artifact_bytes"]:
        raise LimitExceeded("max_artifact_bytes", limits["max_artifact_bytes"], use,
                            f"artifact of {size} bytes refused: your uploads would pass the bytes you may store")


def active_jobs(token_id):
    """The owner's jobs not yet ended (queued, running, cancelling), runs of instances aside."""
    return Job.select(_COUNT).where((Job.owner_token_id == token_id) & Job.state.in_(ACTIVE_JOB_STATES)
                                    & Job.instance_id.is_null()).scalar()


def instances(token_id):
    """The owner's instances that are not deleted."""
    return Instance.select(_COUNT).where((Instance.owner_token_id == token_id)
                                         & (Instance.state != InstanceState.DELETED.value)).scalar()


def artifact_bytes(token_id):
    """The bytes of every artifact the owner uploaded, each counted as if it were its alone."""
    total = (ArtifactUpload.select(peewee.fn.COALESCE(peewee.fn.SUM(Artifact.size), 0))
             .join(Artifact, on=(Artifact.sha256 == ArtifactUpload.sha256))
             .where(ArtifactUpload.token_id == token_id).scalar())
    return int(total or 0)


def owner_use(token_id):
    """What the owner holds of what its limits count."""
    return {"active_jobs": active_jobs(token_id), "instances": instances(token_id),
            "artifact_bytes": artifact_bytes(token_id)}


def limits_of(settings, principal):
    """{token_id, limits, use} of an API token principal (whoami); nulls for a node or a join token."""
    if principal.kind != "api":
        return {"token_id": None, "limits": None, "use": None}
    row = ApiToken.get_or_none_by_id(principal.id)
    return {"token_id": principal.id, "limits": effective(settings, row.limits if row else None),
            "use": owner_use(principal.id)}
