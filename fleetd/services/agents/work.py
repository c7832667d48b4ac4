"""The worker side of the agent protocol: acquire, start, rendezvous, logs, finish, leases."""

import datetime as dt
import time

from fleetd.clock import isoformat
from fleetd.db import released, savepoint, write_transaction
from fleetd.errors import Conflict, FleetdError, NotFound, envelope
from fleetd.models import (
    DEFAULT_TASK_MEMORY_BYTES,
    DEFAULT_TASK_PATH,
    DEFAULT_TASK_PIDS_MAX,
    Fleet,
    Job,
    JobState,
    Node,
    Task,
    TaskState,
)
from fleetd.services.placement import parking
from fleetd.services.workloads import output
from fleetd.services.workloads.lifecycle import ACTIVE_TASK_STATES, switch_task_state
from fleetd.services.workloads.runs import end_task, run_restarting, run_started
from fleetd.sql import Statement
from fleetwire import MAX_ASSIGNMENTS
from fleetwire.assignment import AssignedInstance, Assignment
from fleetwire.finish import FinishResult
from fleetwire.output import DEFAULT_OUTPUT_CAP_BYTES, OutputBatch

_NEXT_ASSIGNED = Statement(
    lambda v: (
        Task.select()
        .where(
            (Task.node == v("node_id"))
            & (Task.state == TaskState.ASSIGNED.value)
            & Task.delivered_at.is_null()
        )
        .order_by(Task.assigned_at, Task.id)
        .limit(MAX_ASSIGNMENTS)
    )
)
_DELIVER = Statement(
    lambda v: Task.update(delivered_at=v("now", Task.delivered_at)).where(
        (Task.id == v("id"))
        & (Task.epoch == v("epoch"))
        & Task.delivered_at.is_null()
        & (Task.state == TaskState.ASSIGNED.value)
    )
)


CONFIRM_POLL_SECONDS = 0.02  # how often a waiting acquire looks for a stop's commit


def acquire(rt, node_id, wait_seconds, limit=1):
    """Work for this node: {"assignments": up to `limit` undelivered assignments, oldest first,
    each delivered once; "cancel": ids of tasks whose processes the node must stop now (cancel,
    preemption, a drain's deadline), each told once}. Waits up to `wait_seconds` for either;
    a stop owed to the node wakes the wait at once, as does a reader that waits for a task's
    output ("flush_output": seal the open chunk and upload it now)."""

    def take_assignments():
        # Read first: most checks find nothing, and a read takes no write lock.
        for _ in range(3):  # another acquire of the same node may win the race for these tasks
            tasks = _NEXT_ASSIGNED.rows(node_id=node_id)[:limit]
            if not tasks:
                return []
            now = rt.clock.now()
            with write_transaction():
                taken = [t for t in tasks if _DELIVER.execute(now=now, id=t.id, epoch=t.epoch)]
            if taken:
                for task in taken:
                    rt.leases.renew(task.id, task.epoch)
                jobs = {
                    job.id: job for job in Job.select().where(Job.id.in_({t.job_id for t in taken}))
                }
                fleet = _TASK_DEFAULTS.first(node_id=node_id)  # one node: one fleet's defaults
                return [assignment(task, jobs[task.job_id], fleet) for task in taken]
        return []

    def take():
        cancel = _take_stops(rt.stops, node_id)
        found = take_assignments()
        flush = rt.flushes.take(node_id)
        if not (found or cancel or flush):
            return None
        return {"assignments": found, "cancel": cancel, "flush_output": flush}

    wait_seconds = min(wait_seconds, rt.settings.long_poll_max_seconds)
    found = released(take)
    if found or wait_seconds <= 0:
        return found or {"assignments": [], "cancel": []}
    deadline = time.monotonic() + wait_seconds
    with rt.stops.watching(node_id, rt.notifier):
        for _ in range(
            1_000_000
        ):  # bounded; each round waits for a notify, a commit to look for, or the end
            remaining = deadline - time.monotonic()
            if remaining <= 0 or rt.notifier.closed:  # shutting down: answer now, do not spin
                break
            # A stop is owed from inside the transaction that ends its task: until that commits,
            # look for it again shortly rather than wait for the next notify.
            pause = min(remaining, CONFIRM_POLL_SECONDS) if rt.stops.owed(node_id) else remaining
            found = rt.notifier.wait(("node", node_id), pause, lambda: released(take))
            if found:
                return found
    return {"assignments": [], "cancel": []}


def _take_stops(stops, node_id):
    """Ids of the tasks this node must stop, from the stops owed to it that the database confirms;
    those are forgotten, and so are those it will never confirm (see NodeStops)."""
    owed = stops.owed(node_id)
    if not owed:
        return []
    rows = {row["id"]: row for row in stop_rows(list(owed))}
    cancel, done = [], {}
    now = time.monotonic()
    for task_id, (epoch, since) in owed.items():
        verdict = must_stop(rows.get(task_id), node_id, epoch, superseded=False)
        if verdict is None and now - since < stops.confirm_seconds:
            continue  # not committed yet
        done[task_id] = epoch
        if verdict:
            cancel.append(task_id)
    stops.discard(node_id, done)
    return cancel


def stop_rows(ids):
    """[{id, node, epoch, state, job_state}] of these tasks."""
    return list(
        Task.select(Task.id, Task.node, Task.epoch, Task.state, Job.state.alias("job_state"))
        .join(Job, on=(Task.job == Job.id))
        .where(Task.id.in_(ids))
        .dicts()
    )


def must_stop(row, node_id, epoch, superseded=True):
    """Must this node stop its process of (task, epoch)? `row`: the task's id, node, epoch, state
    and job_state (None: no such task). True: stop it; None: the node may run it; False (only
    when not `superseded`): the task runs again on this node at a newer epoch, whose assignment
    ends the old process anyway, and a stop by id would end the new one."""
    if row is None or row["node"] != node_id:
        return True
    if row["epoch"] != epoch:
        return True if superseded or row["state"] not in ACTIVE_TASK_STATES else False
    if row["state"] not in ACTIVE_TASK_STATES or row["job_state"] == JobState.CANCELLING.value:
        return True
    return None


# The task defaults of the fleet of a task's node (one indexed read per assignment handed out).
_TASK_DEFAULTS = Statement(
    lambda v: (
        Fleet.select(
            Fleet.task_pids_max,
            Fleet.task_memory_default_bytes,
            Fleet.task_path,
            Fleet.output_cap_bytes,
        )
        .join(Node, on=(Node.fleet == Fleet.name))
        .where(Node.id == v("node_id"))
        .limit(1)
    )
)


def task_limits(spec, fleet):
    """{memory_bytes, memory_default, pids, task_path} of a task of `spec` on a node of `fleet` (its
    _TASK_DEFAULTS row, None when unknown): the spec's own memory_bytes, else the fleet's
    task_memory_default_bytes; the spec's pids up to the fleet's task_pids_max (which is also the
    default); the fleet's PATH."""
    pids_max = fleet.task_pids_max if fleet is not None else DEFAULT_TASK_PIDS_MAX
    default_memory = (
        fleet.task_memory_default_bytes if fleet is not None else DEFAULT_TASK_MEMORY_BYTES
    )
    asked = spec.resources.memory_bytes or None
    return {
        "memory_bytes": asked or default_memory,
        "memory_default": asked is None,
        "pids": min(spec.resources.pids or pids_max, pids_max),
        "task_path": fleet.task_path if fleet is not None else DEFAULT_TASK_PATH,
    }


def output_cap(spec, fleet):
    """The most output a task of `spec` keeps on a node of `fleet`: the job's cap, else the
    fleet's."""
    if spec.output_cap_bytes is not None:
        return spec.output_cap_bytes
    return fleet.output_cap_bytes if fleet is not None else DEFAULT_OUTPUT_CAP_BYTES


def assignment(task, job, fleet):
    """The Assignment (docs/api.md) for a task, built through its one definition (fleetwire);
    `fleet`: the _TASK_DEFAULTS row of its node's fleet."""
    spec = job.job_spec
    run = spec.instance
    instance = (
        None
        if run is None
        else AssignedInstance(
            id=job.instance_id,
            name=job.name,
            restart=run.restart,
            ports=tuple((p.port, p.protocol) for p in run.ports),
            volume_bytes=run.volume_bytes,
            volume_mount_path=run.volume_mount_path,
            image=run.image,
            idle_below_percent=run.idle_stop.gpu_util_below_percent if run.idle_stop else None,
            idle_for_seconds=run.idle_stop.for_seconds if run.idle_stop else None,
            scratch_bytes=run.scratch_bytes,
            runtime_args=run.runtime_args,
        )
    )
    return Assignment(
        task_id=task.id,
        job_id=job.id,
        epoch=task.epoch,
        attempt=job.attempt,
        rank=task.rank,
        num_nodes=job.num_nodes,
        command=list(spec.command),
        env=dict(spec.env),
        workdir=spec.workdir or "",
        gpus=[
            {
                k: v
                for k, v in g.items()
                if k in ("uuid", "memory_limit_bytes", "compute_percent", "mig_device")
            }
            for g in task.gpus
        ],
        isolation=spec.isolation
        or ("shared" if any(not g.get("exclusive") for g in task.gpus) else "exclusive"),
        max_runtime_seconds=spec.max_runtime_seconds,
        artifacts=[a.to_dict() for a in spec.artifacts],
        cpus=spec.resources.cpus or None,
        **task_limits(spec, fleet),  # memory_bytes, memory_default, pids, task_path
        priority_class=spec.priority_class,
        bid=spec.bid,
        instance=instance,
        run_as=task.run_as,  # decided when the scheduler placed it (services.identity.identities)
        output_cap_bytes=output_cap(spec, fleet),
    ).to_wire()


def leased_task(node_id, task_id, epoch):
    """The task if this node holds its lease at this epoch; 409 (fencing) otherwise."""
    task = Task.get_or_none_by_id(task_id)
    if task is None:
        raise NotFound(f"task {task_id} not found")
    if task.node_id != node_id or task.epoch != epoch or task.state == TaskState.PENDING.value:
        raise Conflict(
            f"stale lease for task {task_id}: epoch {epoch} is not current on this node",
            {"task_id": task_id, "epoch": epoch},
        )
    return task


def start_task(
    rt, node_id, task_id, epoch, pid=None, ports=None, restarts=0, started_seconds_ago=None
):
    """The agent started the process of an assigned task (an instance's run: with the host ports
    its node assigned to the declared ports; `restarts` > 0: a restart of its process), which
    started `started_seconds_ago` before now when the agent says so (never before its
    assignment)."""
    now = rt.clock.now()
    with write_transaction():
        task = leased_task(node_id, task_id, epoch)
        if task.state == TaskState.RUNNING.value:
            if restarts:
                run_started(
                    rt, task, ports, now
                )  # restarting -> running; a retried report changes nothing
            return  # a retried start whose first answer was lost: same node, same epoch
        if task.state != TaskState.ASSIGNED.value:
            raise Conflict(f"task {task_id} is {task.state}, not assigned", {"state": task.state})
        _mark_started(rt, task, pid, now, _started_at(task, now, started_seconds_ago), ports=ports)
    rt.leases.renew(task_id, epoch)


def restart_task(rt, node_id, task_id, epoch, last_exit):
    """The process of an instance's run ended and its node's restart policy starts it again after
    `last_exit['backoff_seconds']`: the instance is restarting (docs/api.md, Instance)."""
    now = rt.clock.now()
    with write_transaction():
        task = leased_task(node_id, task_id, epoch)
        if task.state not in ACTIVE_TASK_STATES:
            raise Conflict(f"task {task_id} is {task.state}, not running", {"state": task.state})
        if Job.select(Job.instance_id).where(Job.id == task.job_id).scalar() is None:
            raise Conflict(
                f"task {task_id} is a job's, not an instance's run: it has no restart policy",
                {"state": task.state},
            )
        if task.state == TaskState.ASSIGNED.value:  # it ended before its start was reported
            task.started_at = now
            switch_task_state(rt, task, TaskState.RUNNING, "started", now)
        run_restarting(rt, task, dict(last_exit, at=isoformat(now)), now)
    rt.leases.renew(task_id, epoch)


def _started_at(task, now, started_seconds_ago):
    """When a task's process started, by its agent's report: `started_seconds_ago` before now, but
    never before its assignment (the interval comes from another host); None: now."""
    if started_seconds_ago is None:
        return None
    return max(now - dt.timedelta(seconds=started_seconds_ago), task.assigned_at or now)


def _mark_started(rt, task, pid, now, started_at=None, save=True, ports=None, job=None):
    task.started_at = now if started_at is None else started_at
    task.pid = pid
    switch_task_state(
        rt, task, TaskState.RUNNING, f"started (pid {pid})" if pid else "started", now, save=save
    )
    run_started(rt, task, ports, now, job)


def append_logs(rt, node_id, task_id, batch):
    """A task's output lines: an OutputBatch, or a LogBatch of an agent from before it."""
    if isinstance(batch, OutputBatch):
        output.append_output(rt, node_id, task_id, batch)
    else:
        output.append_lines(rt, node_id, task_id, batch.epoch, batch.lines)


def finish_task(rt, node_id, task_id, finish):
    """The process of a task ended (`finish`: a fleetwire TaskFinish); settle the job (retry, fail,
    succeed) and free its GPUs.

    `lost` says the agent itself ended the task (it stopped, restarted or was upgraded):
    the task counts as lost, so the job retries as after a lost node. With `agent_stopping`
    too, the agent stopped it because it was shutting down (a stop, an upgrade): the job is
    requeued whatever its retry policy and uses no attempt. `pid`: the process
    ended before the agent reported its start, and this report carries the start as well
    (one call instead of two for short tasks); the task goes through running all the same,
    started `started_seconds_ago` before now when the agent says so (never before it was
    assigned: the interval comes from another host). `idle`: an instance's run that its idle
    rule stopped; `ports`: with `pid`, the host ports of its start.
    """
    now = rt.clock.now()
    with write_transaction():
        task = _settle_finish(rt, node_id, task_id, finish, now)
    _after_finish(rt, node_id, task)


def _settle_finish(rt, node_id, task_id, finish, now):
    """finish_task's writes, inside the caller's transaction; returns the task."""
    epoch, outcome, exit_code, reason, lost = (
        finish.epoch,
        finish.outcome,
        finish.exit_code,
        finish.reason,
        finish.lost,
    )
    pid, started_seconds_ago, ports = finish.pid, finish.started_seconds_ago, finish.ports
    task = leased_task(node_id, task_id, epoch)
    job = Job.get_by_id(task.job_id)  # read once for the start, the ledger and the settling
    if finish.output is not None:
        output.note_finish(task, job, node_id, finish.output, now)
    if pid is not None and task.state == TaskState.ASSIGNED.value:
        started_at = _started_at(task, now, started_seconds_ago)
        _mark_started(
            rt,
            task,
            pid,
            now,
            started_at,
            save=False,
            ports=None if ports is None else list(ports),
            job=job,
        )
    if finish.idle and not reason.startswith("idle"):
        reason = f"idle: {reason or 'GPU utilisation under its threshold'}"
    # A task already settled (e.g. cancelled while it ran) only learns that its process is gone.
    if not TaskState(task.state).is_terminal():
        reason = reason or (f"exit code {exit_code}" if exit_code is not None else outcome)
        # A broken GPU is not the job's fault either: it retries like a lost node.
        hardware = reason.startswith(HARDWARE_REASONS)
        lost = (lost or hardware) and outcome == "failed"
        end_task(
            rt,
            task,
            TaskState.LOST if lost else outcome,
            reason,
            now,
            exit_code=exit_code,
            reported=True,
            free_retry=lost and finish.agent_stopping and not hardware,
            job=job,
        )
    return task


def _after_finish(rt, node_id, task):
    """What follows a settled finish, once it is committed."""
    rt.leases.forget(task.id)
    rt.liveness.drop_task(node_id, task.id)
    after_task_end(rt, task.job_id, node_id)


def finish_tasks(rt, node_id, finishes):
    """Several finish reports of one node in one call (`finishes`: [(task id, TaskFinish)]), settled
    in one transaction: each as finish_task settles it (in a savepoint of its own, so a refused one
    leaves the others) and answered on its own. Returns a fleetwire FinishResult per report, in
    order: status 204, or the status and error of a refused report (409 for a stale epoch, 404 for
    an unknown task). A database failure settles none of them; a report sent again is answered as
    before.
    """
    now = rt.clock.now()
    results, settled = [], []
    with write_transaction():
        for task_id, finish in finishes:
            try:
                with savepoint():
                    task = _settle_finish(rt, node_id, task_id, finish, now)
            except FleetdError as exc:
                results.append(
                    FinishResult(
                        task_id,
                        exc.http_status,
                        envelope(exc.code, exc.message, exc.details)["error"],
                    )
                )
            else:
                settled.append(task)
                results.append(FinishResult(task_id, 204))
    for task in settled:
        _after_finish(rt, node_id, task)
    return results


HARDWARE_REASONS = ("gpu_unhealthy:",)


def after_task_end(rt, job_id, node_id=None):
    """Wake who waits on the job; GPUs freed on the node, and the job's team's allowance, may let
    parked work fit (the work that node or that team could serve: services.placement.parking)."""
    rt.notifier.notify(("job", job_id))
    if rt.scheduler is not None:
        rt.scheduler.kick(what=parking.ended_on(rt, node_id, job_id))
