"""Per-owner limits: what one owner (a user, or a service account) may hold (active jobs, instances,
stored spec bytes, stored artifact bytes) and how large one of its specs may be. Each limit is the
calling token's own when an admin set it (`api_token.limits`), else the user's (`user.limits`), else
the `limits_*` setting. The request rate is checked per request
(auth.RequestRates), not here.

Stored spec bytes are the bytes of the `spec` column of the owner's jobs, instances and runs of
instances, ended ones included until the gc deletes them: what its submits make the database hold,
whatever their state. They are kept in `owner_spec_bytes` (one row per owner) as the rows are
written and deleted, so a submit reads one row and writes one, never sums the owner's rows. The row
is written last in a transaction (after the jobs and instances it counts), so on PostgreSQL a pass
that queues a run of an instance (and counts it) never waits for a submit that waits for that
instance.

A check runs inside the transaction that writes what it counts, after `hold_owner` has taken the
owner's lock: on SQLite every writer already queues up front (BEGIN IMMEDIATE); on PostgreSQL the
owner's row (its user's, or a service account's token's) is locked (SELECT ... FOR UPDATE), so two
submits of one owner count one after the other and cannot both pass the last free place."""

import json

import peewee

from fleetd.db import database
from fleetd.errors import LimitExceeded, NotFound
from fleetd.models import (
    LIMIT_NAMES,
    ApiToken,
    Artifact,
    ArtifactUpload,
    Instance,
    InstanceState,
    Job,
    JobState,
    OwnerSpecBytes,
    User,
)
from fleetd.sql import Statement

ACTIVE_JOB_STATES = [s.value for s in JobState if not s.is_terminal()]
_COUNT = peewee.fn.COUNT(peewee.SQL("*"))


def effective(settings, own, owners=None):
    """{name: value} of every limit: the token's own (`own`, as stored; None or missing: the user's,
    `owners`), else the setting."""
    merged = {**(owners or {}), **{k: v for k, v in (own or {}).items() if v is not None}}
    return {
        name: merged[name] if merged.get(name) is not None else getattr(settings, f"limits_{name}")
        for name in LIMIT_NAMES
    }


def hold_owner(settings, principal):
    """Inside a write transaction: lock the owner's row (PostgreSQL: its user's, or a service
    account's token's) and return the limits read afresh (an admin may have changed them since the
    request was authenticated)."""
    locking = not isinstance(database.obj, peewee.SqliteDatabase)
    own = None
    if principal.kind == "api":
        lock = locking and principal.user_id is None
        row = (_TOKEN_LIMITS_LOCKED if lock else _TOKEN_LIMITS).first(id=principal.id)
        if row is None:
            raise NotFound(f"token {principal.id} not found")
        own = row.limits
    if principal.user_id is None:
        return effective(settings, own)
    user = (_USER_LIMITS_LOCKED if locking else _USER_LIMITS).first(id=principal.user_id)
    if user is None:
        raise NotFound(f"user {principal.login} not found")
    return effective(settings, own, user.limits)


# Compiled once (fleetd.sql): every submit reads them.
_TOKEN_LIMITS = Statement(
    lambda v: ApiToken.select(ApiToken.limits).where(ApiToken.id == v("id")).limit(1)
)
_TOKEN_LIMITS_LOCKED = Statement(
    lambda v: ApiToken.select(ApiToken.limits).where(ApiToken.id == v("id")).limit(1).for_update()
)
_USER_LIMITS = Statement(lambda v: User.select(User.limits).where(User.id == v("id")).limit(1))
_USER_LIMITS_LOCKED = Statement(
    lambda v: User.select(User.limits).where(User.id == v("id")).limit(1).for_update()
)


def stored_size(stored):
    """The bytes a `spec` column takes for this value: models.JSONText writes sort-keyed JSON with
    everything past ASCII escaped, so its characters are its bytes (and the database's LENGTH
    agrees)."""
    return len(json.dumps(stored, sort_keys=True))


def spec_bytes(spec):
    """The size of a spec as it is stored (models.JSONText's form)."""
    return stored_size(spec.to_dict())


def check_spec(limits, principal, spec, what, stored=None):
    """LimitExceeded when this spec is larger than one spec may be, or when storing it would pass
    the spec bytes the owner may store (`stored`: the bytes its rows will take, by default the
    spec's own size: an instance also stores its first run's). Returns the spec's size."""
    size = spec_bytes(spec)
    if size > limits["max_spec_bytes"]:
        raise LimitExceeded(
            "max_spec_bytes",
            limits["max_spec_bytes"],
            size,
            f"{what} refused: its spec is too large",
        )
    check_stored(limits, principal, size if stored is None else stored, what)
    return size


def check_stored(limits, principal, adding, what):
    """LimitExceeded when `adding` more bytes of specs would pass what the owner may store."""
    use = stored_spec_bytes(principal.owner_id)
    if use + adding > limits["max_stored_spec_bytes"]:
        raise LimitExceeded(
            "max_stored_spec_bytes",
            limits["max_stored_spec_bytes"],
            use,
            f"{what} refused: the specs of your jobs and instances would pass the bytes you may "
            "store; ended jobs and deleted instances count until the gc deletes them "
            "(job_retention_seconds)",
        )


def count_stored(token_id, size):
    """Inside the transaction that stored (or, with a negative size, shrank) an owner's specs: add
    `size` to what it stores. Call it after the rows it counts are written (see the module's
    doc)."""
    if not size or token_id is None:
        return
    _COUNT_STORED.execute(token_id=token_id, first=max(size, 0), size=size)


def release_stored(model, ids):
    """Inside the transaction that deletes these rows of `model` (Job or Instance), before it does:
    take their specs off their owners' stored bytes (one statement per owner among them)."""
    sizes = (
        model.select(model.owner_token_id, peewee.fn.SUM(peewee.fn.LENGTH(model.spec)))
        .where(model.id.in_(ids))
        .group_by(model.owner_token_id)
        .tuples()
    )
    for token_id, size in list(sizes):
        if token_id is not None and size:
            OwnerSpecBytes.update(bytes=_at_least_zero(OwnerSpecBytes.bytes - int(size))).where(
                OwnerSpecBytes.token_id == token_id
            ).execute()


def _at_least_zero(expression):
    """The expression, or 0 where it is negative (rows stored before the count by other means)."""
    return peewee.Case(None, [(expression > 0, expression)], 0)


def stored_spec_bytes(token_id):
    """The bytes of the specs the owner's jobs, instances and runs store (one row read)."""
    rows = _STORED.raw_tuples(token_id=token_id)
    return int(rows[0][0]) if rows else 0


# Compiled once (fleetd.sql): a submit runs both, and peewee's query building would cost more than
# they do.
_STORED = Statement(
    lambda v: OwnerSpecBytes.select(OwnerSpecBytes.bytes).where(
        OwnerSpecBytes.token_id == v("token_id")
    )
)
_COUNT_STORED = Statement(
    lambda v: OwnerSpecBytes.insert(token_id=v("token_id"), bytes=v("first")).on_conflict(
        conflict_target=[OwnerSpecBytes.token_id],
        update={OwnerSpecBytes.bytes: _at_least_zero(OwnerSpecBytes.bytes + v("size"))},
    )
)


def check_new_job(limits, principal):
    """LimitExceeded when this owner already has as many active jobs as it may."""
    use = active_jobs(principal.owner_id)
    if use + 1 > limits["max_active_jobs"]:
        raise LimitExceeded(
            "max_active_jobs",
            limits["max_active_jobs"],
            use,
            "job refused: you have as many queued and running jobs as you may",
        )


def check_new_instance(limits, principal):
    """LimitExceeded when this owner already holds as many instances as it may."""
    use = instances(principal.owner_id)
    if use + 1 > limits["max_instances"]:
        raise LimitExceeded(
            "max_instances",
            limits["max_instances"],
            use,
            "instance refused: you hold as many instances as you may (delete one first)",
        )


def check_new_artifact(limits, principal, sha256, size):
    """LimitExceeded when storing `size` more bytes would pass the owner's artifact bytes; bytes it
    uploaded before cost nothing again."""
    mine = (
        ArtifactUpload.select()
        .where((ArtifactUpload.token_id == principal.owner_id) & (ArtifactUpload.sha256 == sha256))
        .exists()
    )
    if mine:
        return
    use = artifact_bytes(principal.owner_id)
    if use + size > limits["max_artifact_bytes"]:
        raise LimitExceeded(
            "max_artifact_bytes",
            limits["max_artifact_bytes"],
            use,
            f"artifact of {size} bytes refused: your uploads would pass the bytes you may store",
        )


def active_jobs(token_id):
    """The owner's jobs not yet ended (queued, running, cancelling), runs of instances aside."""
    rows = _ACTIVE_JOBS.raw_tuples(token_id=token_id)
    return int(rows[0][0]) if rows else 0


_ACTIVE_JOBS = Statement(
    lambda v: Job.select(_COUNT).where(
        (Job.owner_token_id == v("token_id"))
        & Job.state.in_(ACTIVE_JOB_STATES)
        & Job.instance_id.is_null()
    )
)


def instances(token_id):
    """The owner's instances that are not deleted."""
    return (
        Instance.select(_COUNT)
        .where(
            (Instance.owner_token_id == token_id) & (Instance.state != InstanceState.DELETED.value)
        )
        .scalar()
    )


def artifact_bytes(token_id):
    """The bytes of every artifact the owner uploaded, each counted as if it were its alone."""
    total = (
        ArtifactUpload.select(peewee.fn.COALESCE(peewee.fn.SUM(Artifact.size), 0))
        .join(Artifact, on=(Artifact.sha256 == ArtifactUpload.sha256))
        .where(ArtifactUpload.token_id == token_id)
        .scalar()
    )
    return int(total or 0)


def owner_use(token_id):
    """What the owner holds of what its limits count."""
    return {
        "active_jobs": active_jobs(token_id),
        "instances": instances(token_id),
        "stored_spec_bytes": stored_spec_bytes(token_id),
        "artifact_bytes": artifact_bytes(token_id),
    }


def limits_of(settings, principal):
    """{token_id, limits, use} of a token's or a session's principal (whoami); nulls for a node or a
    join token."""
    if principal.kind not in ("api", "session", "jwt"):
        return {"token_id": None, "limits": None, "use": None}
    row = ApiToken.get_or_none_by_id(principal.id) if principal.kind == "api" else None
    user = User.get_or_none_by_id(principal.user_id) if principal.user_id else None
    return {
        "token_id": principal.token_id,
        "limits": effective(settings, row.limits if row else None, user.limits if user else None),
        "use": owner_use(principal.owner_id),
    }
