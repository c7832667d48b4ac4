"""Share links: a job's owner (an admin of its project, or an admin) makes a read-only link to it
that needs no token, and revokes it. The link's token is random and shown once; only its SHA-256
is stored, as for API tokens. What the link shows is fixed here: the job's name, state and
outcome, its ranks' exit codes, its times and the tail of its output; never its spec (command,
environment), owner or nodes."""

import datetime as dt
import secrets

from fleetd.clock import isoformat
from fleetd.credentials import hash_token
from fleetd.db import write_transaction
from fleetd.errors import Forbidden, NotFound
from fleetd.models import Job, Share, TaskState, new_id
from fleetd.services.identity import access
from fleetd.services.notify.events import record_event
from fleetd.services.workloads.jobs import find_visible_job, logs_tail
from fleetd.services.workloads.runs import TASKS_OF_JOB

# What a link shows of the job's output: its last lines, at most this many and this many bytes.
TAIL_LINES = 200
TAIL_BYTES = 64 * 1024
TOKEN_MAX = 128  # a longer one was never issued: refused before it is hashed
EXPIRES_MAX_SECONDS = 366 * 86400


def _check_change(principal, job, verb):
    """Forbidden unless this principal may change the job (its owner, an admin of its project, an
    admin)."""
    if not access.may_change(principal, job.owner_token_id, job.project):
        raise Forbidden(
            f"only its owner, an admin of project {job.project} or an admin may {verb} job "
            f"{job.id}",
            {"job_id": job.id},
        )


def create_share(now, principal, job_id, expires_in_seconds=None):
    """Make a read-only link to a job; returns (row, token). The token is never stored or shown
    again. Without `expires_in_seconds` the link works until it is revoked (or the job is
    deleted)."""
    token = secrets.token_urlsafe(32)
    expires_at = now + dt.timedelta(seconds=expires_in_seconds) if expires_in_seconds else None
    with write_transaction():
        job = find_visible_job(principal, job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        _check_change(principal, job, "share")
        row = Share.create(
            id=new_id(),
            token_hash=hash_token(token),
            job_id=job.id,
            created_by=principal.label,
            created_at=now,
            expires_at=expires_at,
        )
        until = f" until {isoformat(expires_at)}" if expires_at else ""
        record_event(
            now,
            "job.shared",
            "job",
            job.id,
            f"read-only link {row.id} made by {principal.label}{until}",
            actor=principal.label,
        )
    return row, token


def _find_share(token):
    """The share of this token, or None (whatever it is: unknown, too long, not text)."""
    if not token or len(token) > TOKEN_MAX:
        return None
    return Share.get_or_none(Share.token_hash == hash_token(token))


def revoke_share(now, principal, token):
    """Revoke a link: it stops working at once. NotFound for a token that is not a link to a job
    this principal may read; revoking twice is harmless."""
    with write_transaction():
        share = _find_share(token)
        job = find_visible_job(principal, share.job_id) if share is not None else None
        if job is None:
            raise NotFound("share link not found")
        _check_change(principal, job, "revoke a link to")
        if share.revoked_at is None:
            share.revoked_at = now
            share.save()
            record_event(
                now,
                "job.unshared",
                "job",
                share.job_id,
                f"read-only link {share.id} revoked by {principal.label}",
                actor=principal.label,
            )
    return share


def _live(share, now):
    return (
        share is not None
        and share.revoked_at is None
        and (share.expires_at is None or share.expires_at > now)
    )


def shared_job(now, token):
    """What a link shows, for anyone who holds it. An unknown, revoked or expired link, or one to a
    job deleted since, is one NotFound: the answer tells none of them apart."""
    share = _find_share(token)
    job = Job.get_or_none_by_id(share.job_id) if _live(share, now) else None
    if job is None:
        raise NotFound("share link not found")
    tasks = TASKS_OF_JOB.rows(job_id=job.id)
    lines, truncated = output_tail(job.id)
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "outcome": job.outcome,
        "outcome_reason": job.outcome_reason,
        "exit_code": _exit_code(tasks),
        "attempt": job.attempt,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "tasks": [
            {
                "rank": t.rank,
                "state": t.state,
                "exit_code": t.exit_code if TaskState(t.state).is_terminal() else None,
            }
            for t in tasks
        ],
        "logs": lines,
        "logs_truncated": truncated,
        "expires_at": share.expires_at,
    }


def _exit_code(tasks):
    """The job's exit code: rank 0's once it ended (the others are in `tasks`)."""
    first = tasks[0] if tasks else None
    if first is None or not TaskState(first.state).is_terminal():
        return None
    return first.exit_code


def output_tail(job_id, lines=TAIL_LINES, size=TAIL_BYTES):
    """The last lines of a job's output, oldest first, at most `lines` of them and `size` bytes of
    text (a longer last line keeps its end); and whether anything before them was left out."""
    rows = logs_tail(job_id, lines + 1)
    truncated = len(rows) > lines
    rows = rows[-lines:]
    kept: list[dict] = []
    used = 0
    for row in reversed(rows):
        text = row.text
        room = size - used
        encoded = text.encode("utf-8")
        if len(encoded) > room:
            truncated = True
            if kept:
                break
            text = encoded[-room:].decode("utf-8", "ignore")  # the end of one long line
            encoded = text.encode("utf-8")
        used += len(encoded)
        kept.append(
            {"seq": row.id, "at": row.at, "rank": row.rank, "stream": row.stream, "text": text}
        )
    kept.reverse()
    return kept, truncated


def ended_before(cutoff):
    """(model, condition) of the links revoked or expired before `cutoff`: the retention
    collection forgets them."""
    return Share, (Share.revoked_at < cutoff) | (Share.expires_at < cutoff)
