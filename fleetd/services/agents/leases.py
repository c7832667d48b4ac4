"""Leases: a node's running tasks renewed by its heartbeats, what it reports checked against what
fleetd holds, and the tasks whose lease ran out ended."""

import datetime as dt

from fleetd.clock import isoformat
from fleetd.db import write_transaction
from fleetd.models import (
    Task,
    TaskState,
)
from fleetd.services.agents.work import after_task_end, must_stop, stop_rows
from fleetd.services.workloads.lifecycle import ACTIVE_TASK_STATES
from fleetd.services.workloads.runs import end_task
from fleetd.sql import Statement


def _renewed_elsewhere(rt, task, now):
    """True when another replica wrote down a renewal of the task's lease within its TTL."""
    return (
        rt.leader.shared
        and task.renewed_at is not None
        and (now - task.renewed_at).total_seconds() <= rt.leases.ttl
    )


def record_lease_renewals(renewals):
    """Write down lease renewals this replica saw ({task id: (epoch, time)}) for the leader."""
    if not renewals:
        return 0
    with write_transaction():
        for task_id, (epoch, at) in renewals.items():
            _RENEWED.execute(at=at, id=task_id, epoch=epoch)
    return len(renewals)


_RENEWED = Statement(
    lambda v: Task.update(renewed_at=v("at", Task.renewed_at)).where(
        (Task.id == v("id")) & (Task.epoch == v("epoch"))
    )
)


def reconcile_reported_tasks(rt, node, reported):
    """`reported`: the heartbeat's TaskReports (fleetwire.heartbeat). Renew the leases of tasks this
    node really holds; return the ids it must stop (the fallback for stops that its acquire did not
    deliver). A task of a cancelling job is not renewed: if its node never reports the end, its
    lease expires and settles it."""
    if not reported:
        return []
    current = {row["id"]: row for row in stop_rows([r.id for r in reported])}
    cancel = []
    for r in reported:
        verdict = must_stop(current.get(r.id), node.id, r.epoch, superseded=False)
        if verdict is None:
            rt.leases.renew(r.id, r.epoch)
        elif verdict:
            cancel.append(r.id)
        # False: the task runs again on this node at a newer epoch; a stop by id would end the new
        # run, and the new assignment ends the old process anyway.
    return cancel


DELIVERY_GRACE_INTERVALS = (
    2  # heartbeats a node may send, after a task reached it, before it lists the task
)


def expire_leases(rt):
    """End `lost` the active tasks that their node no longer holds; their jobs retry or fail.

    Two verdicts of one sweep: the lease expired (no renewal for its TTL: the node is silent or
    cut off), or, sooner, reconciliation (the node is alive, and its heartbeats have stopped
    listing the task: its agent lost or forgot it). With replicas, a renewal another replica wrote
    down (Task.renewed_at) counts too. Returns how many tasks ended by each verdict.
    """
    if rt.liveness.in_failover_grace():
        return {"expired": 0, "reconciled": 0}
    now = rt.clock.now()
    grace = DELIVERY_GRACE_INTERVALS * rt.liveness.longest_interval()
    active = list(
        Task.select(
            Task.id,
            Task.epoch,
            Task.node,
            Task.state,
            Task.delivered_at,
            Task.started_at,
            Task.renewed_at,
        ).where(Task.state.in_(ACTIVE_TASK_STATES))
    )
    verdicts = []
    for t in active:
        if rt.leases.expired(t.id, t.epoch) and not _renewed_elsewhere(rt, t, now):
            verdicts.append((t, "expired", f"lease expired: node {t.node_id} stopped renewing it"))
            continue
        unlisted = _unlisted(rt, t, grace)
        if unlisted is not None:
            since, heard = unlisted
            verdicts.append(
                (
                    t,
                    "reconciled",
                    f"reconciled: node {t.node_id} is alive and has not listed the task "
                    f"since {isoformat(since)} (its heartbeat at {isoformat(heard)} did "
                    "not)",
                )
            )
    ended, counts = set(), {"expired": 0, "reconciled": 0}  # (job id, the node its task ended on)
    for stale, kind, reason in verdicts:
        with write_transaction():
            rt.leader.fence()
            task = Task.get_or_none(Task.id == stale.id)
            if task is None or task.epoch != stale.epoch or task.state not in ACTIVE_TASK_STATES:
                continue
            end_task(rt, task, TaskState.LOST, reason, now)
            ended.add((task.job_id, task.node_id))
        counts[kind] += 1
        rt.leases.forget(stale.id)
    for job_id, node_id in sorted(ended):
        after_task_end(rt, job_id, node_id)
    return counts


def _unlisted(rt, task, grace):
    """(since, heard) when the node holding this active task is alive but no longer lists it: its
    latest heartbeat (heard then) did not, and came more than `grace` after the last sign of the
    task (`since`: its delivery, start or last listing, here or on another replica). None when it
    may still list it: an assignment is listed only from the first heartbeat sent after it arrived,
    and one not yet delivered is the lease's to judge."""
    if task.delivered_at is None and task.state == TaskState.ASSIGNED.value:
        return None
    seen = rt.liveness.get(task.node_id)
    if seen is None or any(listed.id == task.id for listed in seen.tasks):
        return None
    if seen.monotonic - rt.leases.last_renewed(task.id, task.epoch) <= grace:
        return None
    signs = [at for at in (task.delivered_at, task.started_at, task.renewed_at) if at is not None]
    since = max(signs) if signs else None
    if since is None or (seen.at - since).total_seconds() <= grace:
        return None
    renewed_ago = rt.clock.monotonic() - rt.leases.last_renewed(task.id, task.epoch)
    since = max(
        since, rt.clock.now() - dt.timedelta(seconds=renewed_ago)
    )  # a listing renews in memory only
    return since, seen.at
