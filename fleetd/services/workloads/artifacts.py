"""Content-addressed artifacts on fleetd's disk: streamed upload, verified, downloaded by sha256.

The bytes are stored once (Artifact), whoever uploads them; what an owner calls them (name, kind)
and who may read them are each owner's own record (ArtifactUpload): uploading bytes someone else
uploaded tells nothing about them."""

import hashlib
import os
import tempfile

from fleetd.credentials import ADMIN
from fleetd.db import write_transaction
from fleetd.errors import Forbidden, NotFound, PayloadTooLarge
from fleetd.models import Artifact, ArtifactUpload, Job, Task, TaskState
from fleetd.services.identity import limits

CHUNK = 1024 * 1024
_ACTIVE = [s.value for s in TaskState if s.is_active()]


def store_dir(settings):
    return os.path.join(os.path.abspath(settings.data_dir), "artifacts")


def artifact_path(settings, sha256):
    return os.path.join(store_dir(settings), sha256[:2], sha256)


def store_artifact(settings, now, stream, name, kind, principal):
    """Read `stream` to the end into the store (at most artifact_max_bytes); returns this owner's
    view of it, {sha256, name, kind, size}, which it may read from then on (the same bytes uploaded
    by two tokens: both, each under its own name; uploading them again renames them for this owner).
    LimitExceeded, with nothing stored, when it would pass the owner's artifact bytes."""
    limit = settings.artifact_max_bytes
    os.makedirs(store_dir(settings), mode=0o700, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    tmp: str | None  # the upload's file, until it is the artifact's
    fd, tmp = tempfile.mkstemp(dir=store_dir(settings), prefix=".upload-")
    try:
        with os.fdopen(fd, "wb") as out:
            for _ in range(
                limit // CHUNK + 2
            ):  # bounded: one chunk past the limit is enough to refuse
                chunk = stream.read(CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(
                        f"artifact larger than the limit of {limit} bytes", {"limit": limit}
                    )
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        sha256 = digest.hexdigest()
        with write_transaction():
            # The owner's limit first: refused, the bytes never reach the store (the upload is
            # dropped).
            limits.check_new_artifact(
                limits.hold_owner(settings, principal), principal, sha256, size
            )
            final = artifact_path(settings, sha256)
            os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
            os.replace(tmp, final)
            tmp = None
            if Artifact.get_or_none(Artifact.sha256 == sha256) is None:
                Artifact.create(sha256=sha256, size=size, created_at=now)
            mine = (ArtifactUpload.sha256 == sha256) & (
                ArtifactUpload.token_id == principal.owner_id
            )
            if not ArtifactUpload.update(name=name, kind=kind).where(mine).execute():
                ArtifactUpload.create(
                    sha256=sha256,
                    token_id=principal.owner_id,
                    uploaded_at=now,
                    name=name,
                    kind=kind,
                )
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return {"sha256": sha256, "name": name, "kind": kind, "size": size}


def unreferenced(cutoff, keep_jobs_except=()):
    """Shas of artifacts stored before `cutoff` that no job (but those in `keep_jobs_except`,
    about to go) refers to."""
    going = set(keep_jobs_except)
    referenced = {
        a["sha256"]
        for job in Job.select(Job.id, Job.spec)
        if job.id not in going
        for a in job.job_spec.artifacts
    }
    return [
        a.sha256
        for a in Artifact.select(Artifact.sha256).where(Artifact.created_at < cutoff)
        if a.sha256 not in referenced
    ]


def delete_records(shas):
    """Forget these artifacts and who uploaded them (their files are the caller's to remove)."""
    for start in range(0, len(shas), 500):
        chunk = shas[start : start + 500]
        Artifact.delete().where(Artifact.sha256.in_(chunk)).execute()
        ArtifactUpload.delete().where(ArtifactUpload.sha256.in_(chunk)).execute()


def readable_artifacts(principal, shas):
    """The subset of `shas` that exist and this API token may read (and use in its jobs): admins
    any, a submitter those it uploaded."""
    shas = sorted(set(shas))
    if not shas:
        return set()
    if principal.role == ADMIN:
        return {
            row.sha256 for row in Artifact.select(Artifact.sha256).where(Artifact.sha256.in_(shas))
        }
    rows = ArtifactUpload.select(ArtifactUpload.sha256).where(
        (ArtifactUpload.token_id == principal.owner_id) & ArtifactUpload.sha256.in_(shas)
    )
    return {row.sha256 for row in rows}


def open_artifact(settings, principal, sha256):
    """(file name, path) if this principal may read it; a node only for artifacts of its current
    tasks. The file name is the caller's own name for it, else (an admin's or a node's read of
    someone else's upload) the sha256: an owner's name is never shown to another."""
    row = Artifact.get_or_none(Artifact.sha256 == sha256)
    if row is None or not os.path.exists(artifact_path(settings, sha256)):
        raise NotFound(f"artifact {sha256} not found")
    if principal.kind == "node":
        if not _needed_by_node(principal.node_id, sha256):
            raise Forbidden("this node runs no task that uses this artifact")
    elif sha256 not in readable_artifacts(principal, [sha256]):
        raise NotFound(
            f"artifact {sha256} not found"
        )  # whether others uploaded it is not this token's business
    own = None
    if principal.kind == "api":
        own = ArtifactUpload.get_or_none(
            (ArtifactUpload.sha256 == sha256) & (ArtifactUpload.token_id == principal.owner_id)
        )
    return (own.name if own is not None and own.name else sha256), artifact_path(settings, sha256)


def _needed_by_node(node_id, sha256):
    query = Job.select(Job.spec).join(Task).where((Task.node == node_id) & Task.state.in_(_ACTIVE))
    return any(a.sha256 == sha256 for job in query for a in job.job_spec.artifacts)
