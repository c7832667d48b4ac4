"""Each owner's notification feed: written where something the owner cares about happens (its job
ended, its team's budget crossed a threshold), read and marked read by the owner, pruned by the
retention collection.

A feed belongs to an owner id (Principal.owner_id: a user's id, or a service account's own token
id), the id work is kept under, so that a job's end notifies its owner with one INSERT and no
lookup."""

import datetime as dt

from fleetd.db import write_transaction
from fleetd.models import JobState, Notification, ProjectMember, User
from fleetd.services.pagination import paginate
from fleetd.sql import insert_row, insert_rows

TEXT_MAX = 1000
NAME_MAX = 200
JOB_ENDS = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


def _row(now, owner_id, kind, subject_kind, subject_id, name, text):
    return {
        "owner_id": owner_id,
        "at": now,
        "kind": kind,
        "subject_kind": subject_kind,
        "subject_id": subject_id,
        "subject_name": name[:NAME_MAX],
        "text": text[:TEXT_MAX],
        "read": False,
    }


def job_ended(job, state, reason, now):
    """Tell a job's owner that it ended (inside the transaction that ended it): one compiled
    INSERT, nothing read. Runs of instances are not jobs to their users and notify nobody."""
    if job.instance_id is not None or state not in JOB_ENDS:
        return
    text = f"job {job.name} {state.value}" + (f": {reason}" if reason else "")
    insert_row(
        Notification,
        _row(now, job.owner_token_id, f"job.{state.value}", "job", job.id, job.name, text),
    )


def budget_threshold(team, text, now):
    """Tell every active user of `team` that its budget crossed a threshold (inside the transaction
    that records the notice; at most three times a team and month). Returns how many were told."""
    owners = [u.id for u in User.select(User.id).where((User.team == team) & User.active)]
    insert_rows(
        Notification,
        [_row(now, owner, "budget.threshold", "team", team, team, text) for owner in owners],
    )
    return len(owners)


def project_budget_threshold(project, text, now):
    """Tell the active members of `project` that its budget crossed a threshold (inside the
    transaction that records it; at most three times a project and month). Returns how many were
    told."""
    owners = [
        u.id
        for u in User.select(User.id)
        .join(ProjectMember, on=ProjectMember.user_id == User.id)
        .where((ProjectMember.project == project) & User.active)
    ]
    insert_rows(
        Notification,
        [
            _row(now, owner, "budget.threshold", "project", project, project, text)
            for owner in owners
        ],
    )
    return len(owners)


def list_notifications(owner_id, limit, cursor=None, after=None):
    """One page of an owner's notifications, oldest first; `after`: only those with a greater
    id."""
    query = Notification.select().where(Notification.owner_id == owner_id)
    if after is not None:
        query = query.where(Notification.id > after)
    return paginate(query, Notification.id, limit, cursor)


def mark_read(owner_id, up_to):
    """Mark an owner's notifications up to this id (included) read; returns how many changed."""
    with write_transaction():
        return (
            Notification.update(read=True)
            .where(
                (Notification.owner_id == owner_id)
                & (Notification.id <= up_to)
                & (Notification.read == False)  # noqa: E712 - SQL, not Python
            )
            .execute()
        )


def expired(settings, now):
    """(model, condition) of the notifications past retention."""
    cutoff = now - dt.timedelta(seconds=settings.notification_retention_seconds)
    return Notification, Notification.at < cutoff
