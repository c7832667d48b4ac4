"""How runs end and what that does: a task's end settles its job (success, a retry of the whole
gang, failure) or, for a run of an instance, the instance; the runs of instances are made,
placed and started here; a node's status change interrupts or resumes the instances it holds.

Runs inside the callers' transactions; above the state machines (lifecycle), below the use cases.
"""

import datetime
import re

from fleetd.clock import isoformat
from fleetd.models import (
    Instance,
    InstanceState,
    Job,
    JobState,
    Node,
    NodeStatus,
    Task,
    TaskState,
    new_id,
)
from fleetd.services.identity import limits
from fleetd.services.notify.events import record_event
from fleetd.services.placement.terms import group_key_of
from fleetd.services.workloads.lifecycle import (
    ACTIVE_TASK_STATES,
    LIVE_TASK_STATES,
    is_held,
    switch_instance_state,
    switch_job_state,
    switch_task_state,
)
from fleetd.services.workloads.prices import price_per_hour
from fleetd.sql import Statement

# Why a task ended -> the retry condition it counts as.
RETRY_KIND = {
    TaskState.FAILED: "failed",
    TaskState.LOST: "node_lost",
    TaskState.PREEMPTED: "preempted",
}


SIGNAL_RE = re.compile(r"killed by (SIG[A-Z0-9+]+)")


TASKS_OF_JOB = Statement(lambda v: Task.select().where(Task.job == v("job_id")).order_by(Task.rank))


def end_task(
    rt,
    task,
    outcome,
    reason,
    now,
    exit_code=None,
    force_requeue=False,
    reported=False,
    free_retry=False,
    preempted_by=None,
    resume=False,
    job=None,
):
    """Record how a task ended and settle its job: success, retry of the whole job, or failure.

    `reported`: its node said so (a finish report); otherwise its node is told to stop it.
    `free_retry`: the job is requeued whatever its retry policy and keeps its attempt number
    (its agent stopped it while shutting down: not the job's failure, and no attempt spent).
    `preempted_by`: the Workload whose placement preempted it (an instance records it); `resume`:
    an instance it interrupts queues its next run at once (settings.instances_resume_preempted).
    `job`: the task's job, when the caller read it in this transaction. Runs inside the caller's
    transaction. Returns the job.
    """
    outcome = TaskState(outcome)
    task.exit_code = exit_code
    if job is None:
        job = Job.get_by_id(task.job_id)
    switch_task_state(rt, task, outcome, reason, now, tell_node=not reported, attempt=job.attempt)
    if JobState(job.state).is_terminal():
        return job
    if job.instance_id is not None:  # a run of an instance: it never retries; the instance decides
        return run_ended(rt, job, task, outcome, reason, now, preempted_by, resume)
    tasks = [task] if job.num_nodes == 1 else TASKS_OF_JOB.rows(job_id=job.id)
    if (
        job.state == JobState.CANCELLING.value
    ):  # nothing retries: the job is cancelled once no task runs
        if not any(t.state in ACTIVE_TASK_STATES for t in tasks):
            switch_job_state(
                job, JobState.CANCELLED, f"every task stopped ({job.outcome_reason})", now
            )
        return job
    if outcome is TaskState.SUCCEEDED:
        if all(t.state == TaskState.SUCCEEDED.value for t in tasks):
            job.outcome, job.outcome_reason = JobState.SUCCEEDED.value, "every rank succeeded"
            switch_job_state(job, JobState.SUCCEEDED, job.outcome_reason, now)
        return job
    # A rank that did not succeed ends the attempt for the whole gang.
    for other in tasks:
        if other.id != task.id and other.state in ACTIVE_TASK_STATES:
            switch_task_state(
                rt,
                other,
                TaskState.CANCELLED,
                f"rank {task.rank} {outcome.value}: stopping the gang",
                now,
            )
    kind = RETRY_KIND.get(outcome)
    retry_on = job.job_spec.retry_policy.on
    if outcome is TaskState.CANCELLED:
        job.outcome, job.outcome_reason = (
            JobState.CANCELLED.value,
            f"rank {task.rank} cancelled: {reason}",
        )
        switch_job_state(job, JobState.CANCELLED, job.outcome_reason, now)
    elif free_retry:
        requeue_job(
            rt,
            job,
            tasks,
            f"rank {task.rank} {outcome.value} ({reason}); its agent was stopping: "
            "requeued without using an attempt",
            now,
            new_attempt=False,
        )
    elif force_requeue or (kind in retry_on and job.attempt < job.max_attempts):
        requeue_job(rt, job, tasks, f"rank {task.rank} {outcome.value} ({reason}); retrying", now)
    else:
        job.outcome = JobState.FAILED.value
        job.outcome_reason = f"rank {task.rank} {outcome.value}: {reason}"
        if kind in retry_on:
            job.outcome_reason += f" (attempt {job.attempt} of {job.max_attempts})"
        switch_job_state(job, JobState.FAILED, job.outcome_reason, now)
    return job


def requeue_job(rt, job, tasks, reason, now, new_attempt=True):
    """Put a job back in the queue with attempt + 1 (the same attempt without `new_attempt`);
    its ranks start over as pending."""
    if new_attempt:
        job.attempt += 1
    job.pending_reason = "requeued; waiting for the scheduler"
    switch_job_state(job, JobState.QUEUED, f"{reason} (attempt {job.attempt})", now)
    for task in tasks:
        if task.state in ACTIVE_TASK_STATES:
            switch_task_state(rt, task, TaskState.CANCELLED, "requeued", now)
        # node and gpus stay until the next placement: while the old process still runs there,
        # its GPUs are not free (see ClusterState).
        task.delivered_at = task.assigned_at = task.started_at = task.ended_at = None
        task.pid = task.exit_code = None
        task.rendezvous_addr = task.rendezvous_port = None
        switch_task_state(rt, task, TaskState.PENDING, f"attempt {job.attempt}", now)


def stop_job(rt, job, reason, now):
    """Cancel a job that is not terminal (inside the caller's transaction): tasks no node holds end
    at once, the job is `cancelling` while nodes hold the others (or `cancelled`). Returns the held
    tasks: after commit, owe_stops() tells their nodes (again, for a job already cancelling)."""
    held = []
    if job.state in (JobState.QUEUED.value, JobState.RUNNING.value):
        for task in Task.select().where((Task.job == job.id) & Task.state.in_(LIVE_TASK_STATES)):
            if is_held(task):
                held.append(task)  # stays active until its node says the process ended
            else:
                switch_task_state(rt, task, TaskState.CANCELLED, reason, now)
        job.outcome, job.outcome_reason = JobState.CANCELLED.value, reason
        if held:
            switch_job_state(
                job, JobState.CANCELLING, f"{reason}; stopping {len(held)} task(s)", now
            )
        else:
            switch_job_state(job, JobState.CANCELLED, reason, now)
    elif (
        job.state == JobState.CANCELLING.value
    ):  # asked again: tell the nodes again (a reply may have been lost)
        held = list(Task.select().where((Task.job == job.id) & Task.state.in_(ACTIVE_TASK_STATES)))
    return held


def new_run(rt, inst, now, waiting_reason=None, interrupted=False):
    """Queue a new run of the instance (inside the caller's transaction): pending, or still
    `interrupted` (naming what interrupted it) until the run is placed."""
    spec = inst.instance_spec.run(inst.node_id)
    job = Job.create(
        id=new_id(),
        name=inst.name,
        owner=inst.owner,
        owner_token_id=inst.owner_token_id,
        team=inst.team,
        project=inst.project,
        user=inst.user,
        state=JobState.QUEUED.value,
        max_attempts=1,
        num_nodes=1,
        priority_class=spec.priority_class,
        spec=spec.to_dict(),
        submitted_at=now,
        instance_id=inst.id,
        pending_reason=waiting_reason or "waiting for the scheduler",
        group_key=group_key_of(
            spec,
            inst.team,
            spec.priority_class,
            inst.owner_token_id,
            (inst.user or "") if rt.terms.accounts() else "",
        ),
    )
    Task(id=new_id(), job=job.id, rank=0, state=TaskState.PENDING.value, gpus=[]).save(
        force_insert=True
    )
    inst.run_id = job.id
    inst.runs = (inst.runs or 0) + 1
    inst.desired_state = "running"
    if interrupted:
        inst.save()
    elif inst.state != InstanceState.PENDING.value:
        where = f" on node {inst.node_id}, which holds its volume" if inst.node_id else ""
        switch_instance_state(
            rt, inst, InstanceState.PENDING, f"run {inst.runs} queued{where}", now
        )
    else:
        inst.save()
    limits.count_stored(
        inst.owner_token_id, limits.stored_size(job.spec)
    )  # last: see services.identity.limits
    return job


def _of_run(job):
    inst = Instance.get_or_none_by_id(job.instance_id)
    return inst if inst is not None and inst.run_id == job.id else None


def run_placed(rt, job, task, now):
    """The scheduler placed a run (inside its write transaction): starting on that node."""
    inst = _of_run(job)
    if inst is None:
        return
    inst.node_id = task.node_id
    inst.price_per_hour = price_per_hour(inst.instance_spec, task.gpus)
    switch_instance_state(rt, inst, InstanceState.STARTING, f"placed on node {task.node_id}", now)


def run_started(rt, task, ports, now, job=None):
    """The agent started a run's process (inside the caller's transaction): running. `job`: the
    task's job, when the caller read it in this transaction."""
    if job is None:
        job = Job.get_by_id(task.job_id)
    if job.instance_id is None:
        return
    inst = _of_run(job)
    if inst is None:
        return
    if ports is not None:
        _note_moved_ports(inst, ports, now)
        inst.ports = ports
    if inst.state in (InstanceState.STARTING.value, InstanceState.INTERRUPTED.value):
        switch_instance_state(
            rt, inst, InstanceState.RUNNING, f"started on node {task.node_id}", now
        )
    elif inst.state == InstanceState.RESTARTING.value:
        switch_instance_state(
            rt,
            inst,
            InstanceState.RUNNING,
            f"restarted on node {task.node_id} (restart policy {inst.instance_spec.restart})",
            now,
        )
    else:
        inst.save()


def _note_moved_ports(inst, ports, now):
    """An instance keeps its host ports from run to run, but while it was stopped another process on
    its node may have taken one (its old URL then reached that process); the node gave it another
    one: an `instance.port` event says which, so whoever kept the old URL learns it changed."""
    before = {p["port"]: p["host_port"] for p in inst.ports or () if isinstance(p, dict)}
    for new in ports:
        old = before.get(new.get("port"))
        if old is not None and old != new.get("host_port"):
            record_event(
                now,
                "instance.port",
                "instance",
                inst.id,
                f"port {new['port']} moved from host port {old} to {new['host_port']}: another "
                f"process took {old} on its node while the instance was not running; its old URL "
                "no longer reaches it",
            )


def run_restarting(rt, task, last_exit, now):
    """The process of a run ended and its node starts it again after `last_exit['backoff_seconds']`
    (inside the caller's transaction): restarting, with the exit; not billed until it runs again."""
    job = Job.get_by_id(task.job_id)
    inst = _of_run(job) if job.instance_id is not None else None
    if inst is None:
        return
    inst.last_exit = last_exit
    state = InstanceState(inst.state)
    if state not in (InstanceState.STARTING, InstanceState.RUNNING, InstanceState.RESTARTING):
        inst.save()  # stopping, deleting or interrupted: that state says more
        return
    backoff = last_exit.get("backoff_seconds") or 0.0
    inst.next_start_at = now + datetime.timedelta(seconds=backoff)
    policy = inst.instance_spec.restart
    switch_instance_state(
        rt,
        inst,
        InstanceState.RESTARTING,
        f"its process ended ({last_exit['reason']}); node "
        f"{task.node_id} starts it again in {backoff:g}s (restart "
        f"policy {policy})",
        now,
    )


def run_ended(rt, job, task, outcome, reason, now, preempted_by=None, resume=False):
    """The task of a run ended (inside end_task's transaction): the run's job ends (runs never
    retry) and the instance becomes stopped, deleting (or deleted), failed or interrupted. Returns
    the job."""
    outcome = TaskState(outcome)
    ended = {TaskState.SUCCEEDED: JobState.SUCCEEDED, TaskState.CANCELLED: JobState.CANCELLED}.get(
        outcome, JobState.FAILED
    )
    if job.state == JobState.CANCELLING.value:
        ended = JobState.CANCELLED
    else:
        job.outcome, job.outcome_reason = ended.value, f"{outcome.value}: {reason}"
    switch_job_state(job, ended, f"run ended: {outcome.value} ({reason})", now)
    inst = _of_run(job)
    if inst is not None and inst.state != InstanceState.DELETED.value:
        _settle(rt, inst, task, outcome, reason, now, preempted_by, resume)
    return job


def _settle(rt, inst, task, outcome, reason, now, preempted_by, resume=False):
    # Only its node's report says its processes ended; a lost run (its lease expired) says nothing
    # of them.
    ended = (
        f"its node did not report that its processes ended ({reason})"
        if outcome is TaskState.LOST
        else f"its processes ended ({reason})"
    )
    if inst.desired_state == "deleted":
        settle_deleting(rt, inst, ended, now)
    elif inst.desired_state == "stopped" or inst.state == InstanceState.STOPPING.value:
        switch_instance_state(rt, inst, InstanceState.STOPPED, f"stopped; {ended}", now)
    elif outcome is TaskState.LOST:
        _interrupt(rt, inst, "node_lost", reason, now)
    elif outcome is TaskState.PREEMPTED:
        _interrupt(
            rt,
            inst,
            "preempted" if preempted_by is not None else "drain",
            reason,
            now,
            preempted_by,
            resume,
        )
    else:
        inst.desired_state = "stopped"
        if outcome is TaskState.FAILED:
            inst.last_exit = {
                "exit_code": task.exit_code,
                "signal": _signal_of(reason),
                "reason": reason,
                "at": isoformat(now),
                "backoff_seconds": None,
            }
            switch_instance_state(rt, inst, InstanceState.FAILED, reason, now)
        elif reason.startswith("idle"):
            switch_instance_state(rt, inst, InstanceState.STOPPED, reason, now)
        else:
            policy = inst.instance_spec.restart
            switch_instance_state(
                rt, inst, InstanceState.STOPPED, f"{reason} (restart policy {policy})", now
            )


def _signal_of(reason):
    """SIGKILL of "killed by SIGKILL" (how a node words a signal's end), else None."""
    found = SIGNAL_RE.search(reason or "")
    return found.group(1) if found else None


def _interrupt(rt, inst, why, reason, now, preempted_by=None, resume=False):
    """Interrupted (`why`: node_lost, preempted or drain; `preempted_by` the preempting Workload):
    resumable; after a lost node it resumes by itself when the node is back, after a preemption
    (with `resume`) its next run is queued at once and placed once its node has room again (after
    the preemptor, which outranks it), the instance staying `interrupted` until then."""
    first = inst.state != InstanceState.INTERRUPTED.value
    if first:
        switch_instance_state(
            rt,
            inst,
            InstanceState.INTERRUPTED,
            f"{reason}; {_after_interruption(inst, why, resume)}",
            now,
        )
        inst.interrupted_by, inst.preempted_by = why, preempted_by and preempted_by.as_dict()
    else:
        if inst.interrupted_by is None:
            inst.interrupted_by, inst.preempted_by = why, preempted_by and preempted_by.as_dict()
        inst.status_reason = f"{inst.status_reason}; {reason}"[:2000]
    inst.save()
    if why == "node_lost" and _node_live(inst.node_id):
        new_run(
            rt, inst, now
        )  # the node is fine (its lease lapsed, or its agent restarted): run again
    elif first and why == "preempted" and resume:
        new_run(
            rt, inst, now, "waiting for room on its node after the preemption", interrupted=True
        )


def _after_interruption(inst, why, resume):
    """What happens next to an instance interrupted for `why`, in words (its status reason's
    end)."""
    where = f"node {inst.node_id}" if inst.node_id else "its node"
    if why == "preempted" and resume:
        return f"it resumes by itself on {where} once there is room"
    if why == "preempted":
        return (
            "resume it to run it again (fleetd is set not to resume preempted instances by itself)"
        )
    if why == "drain":
        return (
            f"{where} is being drained, so it does not resume by itself; resume it to run it again"
        )
    return f"it runs again by itself on {where}" + (
        "" if _node_live(inst.node_id) else " when that node is back"
    )


def resumes_by_itself(inst):
    """True while an interrupted instance has its next run queued (after a preemption)."""
    return (
        inst.state == InstanceState.INTERRUPTED.value
        and bool(inst.run_id)
        and Job.select()
        .where((Job.id == inst.run_id) & (Job.state == JobState.QUEUED.value))
        .exists()
    )


def settle_deleting(rt, inst, why, now):
    """A deleted instance whose processes ended (inside the caller's transaction): deleted once no
    volume of it can be left on a live node, else `deleting` until that node's heartbeat shows the
    volume gone (volumes_removed). A node that is lost or gone removes it when it is back."""
    if _node_live(inst.node_id):
        switch_instance_state(
            rt,
            inst,
            InstanceState.DELETING,
            f"deleting; {why}; waiting for node {inst.node_id} to remove its volume",
            now,
        )
    else:
        switch_instance_state(rt, inst, InstanceState.DELETED, f"deleted; {why}", now)


def volumes_removed(rt, node_id, present, now):
    """A heartbeat of `node_id` listed the volumes `present` (inside the caller's transaction): its
    deleting instances whose processes ended and whose volume is no longer there are deleted."""
    present = set(present)
    for inst in Instance.select().where(
        (Instance.node_id == node_id) & (Instance.state == InstanceState.DELETING.value)
    ):
        if inst.id not in present and not run_active(inst):
            switch_instance_state(
                rt, inst, InstanceState.DELETED, f"deleted; node {node_id} removed its volume", now
            )


def run_active(inst):
    """True while a task of the instance's current run is placed or running."""
    return (
        bool(inst.run_id)
        and Task.select()
        .where((Task.job == inst.run_id) & Task.state.in_(ACTIVE_TASK_STATES))
        .exists()
    )


def _node_live(node_id):
    node = Node.get_or_none_by_id(node_id) if node_id else None
    return node is not None and node.status in (
        NodeStatus.READY.value,
        NodeStatus.CORDONED.value,
        NodeStatus.DRAINING.value,
        NodeStatus.DRAINED.value,
    )
