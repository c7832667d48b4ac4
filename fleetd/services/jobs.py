"""Jobs: submit, read, cancel; the job and task state machines; what happens when a task ends;
the stops owed to nodes whose tasks fleetd ended."""

import contextlib
import threading
import time

from fleetd import scheduler
from fleetd.db import after_commit, hand_back, released, write_transaction
from fleetd.errors import Conflict, Forbidden, InvalidRequest, NotFound
from fleetd.models import Event, Job, JobState, LogLine, Task, TaskState, new_id, transition_table
from fleetd.services.artifacts import readable_artifacts
from fleetd.services.events import list_events, record_event
from fleetd.services.pagination import attach, last_rows, paginate
from fleetd.sql import Statement

# A running job that is cancelled is `cancelling` until the nodes that hold its tasks say their
# processes ended (or their leases expire); a queued one holds no process and is cancelled at once.
JOB_TRANSITIONS = transition_table(JobState, {
    "queued": "running cancelled failed",
    "running": "queued succeeded failed cancelling cancelled",
    "cancelling": "cancelled",
    "succeeded": "",
    "failed": "",
    "cancelled": "",
})
# An ended task goes back to pending only when the whole job retries (all its ranks are reset).
TASK_TRANSITIONS = transition_table(TaskState, {
    "pending": "assigned cancelled",
    "assigned": "running succeeded failed cancelled lost preempted",
    "running": "succeeded failed cancelled lost preempted",
    "succeeded": "",
    "failed": "pending",
    "cancelled": "pending",
    "lost": "pending",
    "preempted": "pending",
})
DEFAULT_RETRY = {"max_attempts": 3, "on": ["node_lost", "preempted"]}
# Why a task ended -> the retry condition it counts as.
RETRY_KIND = {TaskState.FAILED: "failed", TaskState.LOST: "node_lost", TaskState.PREEMPTED: "preempted"}


def switch_job_state(job, to_state, reason, now):
    """The one way a job changes state: checks the transition, saves, records an Event."""
    from_state = JobState(job.state)
    to_state = JobState(to_state)
    if to_state not in JOB_TRANSITIONS[from_state]:
        raise Conflict(f"job {job.id} cannot go from {from_state.value} to {to_state.value}", {"state": job.state})
    job.state = to_state.value
    if to_state is JobState.RUNNING and job.started_at is None:
        job.started_at = now
    if to_state.is_terminal():
        job.ended_at = now
        job.pending_reason = ""
    job.save()
    record_event(now, "job.state", "job", job.id, reason, from_state.value, to_state.value)
    return job


def switch_task_state(task, to_state, reason, now, save=True, tell_node=True):
    """The one way a task changes state; its Event is listed with its job's events. `save=False`:
    the caller saves the row itself, with the next change it makes in the same transaction.
    `tell_node=False`: the node itself reported the end (its process is gone; nothing to stop)."""
    from_state = TaskState(task.state)
    to_state = TaskState(to_state)
    if to_state not in TASK_TRANSITIONS[from_state]:
        raise Conflict(f"task {task.id} cannot go from {from_state.value} to {to_state.value}",
                       {"state": task.state})
    if tell_node and to_state.is_terminal() and _held(task):
        # fleetd ended a task whose process a node may still run: that node is told at once.
        STOPS.owe(task.node_id, task.id, task.epoch)
    task.state = to_state.value
    if to_state.is_terminal():
        task.ended_at = now
    task.reason = reason
    if save:
        task.save()
    record_event(now, "task.state", "job", task.job_id, f"rank {task.rank}: {reason}", from_state.value,
                 to_state.value)
    return task


# ---------------------------------------------------------------- submit and read


def task_request(spec):
    """The engine's TaskRequest for a JobSpec; InvalidRequest when it is not one."""
    res = spec.get("resources") or {}
    selector = spec.get("node_selector") or {}
    try:
        return scheduler.TaskRequest(
            gpus=res.get("gpus", 0),
            num_nodes=spec.get("num_nodes", 1),
            gpu_memory_bytes=res.get("gpu_memory_bytes"),
            gpu_compute_percent=res.get("gpu_compute_percent"),
            gpu_types=tuple(res.get("gpu_types") or ()),
            cpus=res.get("cpus") or 0,
            memory_bytes=res.get("memory_bytes") or 0,
            node_selector=scheduler.NodeSelector(fleet=selector.get("fleet"), labels=selector.get("labels") or {},
                                                 node_id=selector.get("node_id"),
                                                 container=bool(selector.get("container"))),
            priority_class=spec.get("priority_class", "on-demand"),
            bid=spec.get("bid"),
            name=spec.get("name", ""),
        )
    except ValueError as exc:
        raise InvalidRequest(f"resources: {exc}", {"fields": {"resources": [str(exc)]}}) from None


def team_of(principal, spec):
    """The team a job of this principal runs as: the token's own; the body may only repeat it
    (Forbidden otherwise), except that an admin may name any team."""
    wanted = spec.get("team")
    if not wanted or principal.role == "admin":
        return wanted or principal.team
    if wanted != principal.team:
        raise Forbidden(f"this token submits for team {principal.team or '(none)'}, not {wanted}",
                        {"team": wanted})
    return wanted


def submit(rt, principal, spec, wait_for_capacity=True):
    """Submit a validated JobSpec: checked as the engine and the bid rules see it, queued (even when
    no enrolled node could ever hold it, unless `wait_for_capacity` is false: Conflict), then the
    scheduler is kicked. Returns the job with its tasks, as placed if the pass ran here."""
    from fleetd.services import policy, scheduling

    request = task_request(spec)  # the engine's own checks, before anything is stored
    policy.check_bid(spec)
    never = scheduling.capacity_reason(rt, request)
    if never and not wait_for_capacity:
        raise Conflict(f"{never}; not queued (wait_for_capacity=false)", {"reason": "no_capacity"})
    job = submit_job(rt.clock.now(), principal, spec, never)
    if rt.scheduler.kick(capacity=False):  # placed right here (no scheduler loop): show where
        job = get_job(principal, job.id)
    return job


def submit_job(now, principal, spec, waiting_reason=None):
    """Queue a validated JobSpec; returns the Job with its tasks (submit() kicks the scheduler)."""
    from fleetd.services.cluster import group_key_of  # cluster imports this module
    retry = spec.get("retry") or DEFAULT_RETRY
    team = team_of(principal, spec)
    job_id = new_id()
    with write_transaction():
        wanted = {a["sha256"] for a in spec.get("artifacts") or []}
        known = readable_artifacts(principal, wanted)  # another token's upload is unknown to this one
        if wanted - known:
            missing = sorted(wanted - known)
            raise InvalidRequest(f"unknown artifact(s): {', '.join(missing)}; upload them first",
                                 {"fields": {"artifacts": missing}})
        job = Job.create(
            id=job_id,
            name=spec["name"],
            owner=principal.name,
            owner_token_id=principal.id,
            team=team,
            state=JobState.QUEUED.value,
            pending_reason=waiting_reason or "waiting for the scheduler",
            max_attempts=retry["max_attempts"],
            num_nodes=spec["num_nodes"],
            priority_class=spec["priority_class"],
            spec=dict(spec, team=team),  # the team it runs as, so that the spec alone says it
            submitted_at=now,
            group_key=group_key_of(dict(spec, team=team), team, spec["priority_class"]),
        )
        job.task_list = [Task(id=new_id(), job=job_id, rank=rank, state=TaskState.PENDING.value, gpus=[])
                         for rank in range(job.num_nodes)]
        for task in job.task_list:
            task.save(force_insert=True)
        record_event(now, "job.submitted", "job", job_id, f"submitted by {principal.label}", None,
                     JobState.QUEUED.value, actor=principal.label)
    return job


TASKS_OF_JOB = Statement(lambda v: Task.select().where(Task.job == v("job_id")).order_by(Task.rank))


def _visible(query, principal):
    """Admins see every job; a submitter only its own."""
    if principal.role == "admin":
        return query
    return query.where(Job.owner_token_id == principal.id)


def list_jobs(principal, limit, cursor=None, state=None, owner=None, team=None):
    """One page of jobs, oldest first, with their tasks."""
    query = _visible(Job.select(), principal).where(Job.instance_id.is_null())  # runs of instances: see instances
    if state:
        query = query.where(Job.state == state)
    if owner:
        query = query.where(Job.owner == owner)
    if team:
        query = query.where(Job.team == team)
    jobs, next_cursor = paginate(query, Job.id, limit, cursor)
    attach_tasks(jobs)
    return jobs, next_cursor


def attach_tasks(jobs):
    """Load the tasks of these jobs in one query (job.task_list, by rank)."""
    return attach(jobs, Task.select().order_by(Task.job, Task.rank), Task.job, "task_list")


def find_visible_job(principal, job_id):
    """The job if this principal may see it, else None."""
    job = Job.get_or_none_by_id(job_id)
    if job is None or (principal.role != "admin" and job.owner_token_id != principal.id):
        return None
    return job


def get_job(principal, job_id):
    """A job with its tasks; NotFound if it does not exist or belongs to someone else."""
    job = find_visible_job(principal, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    job.task_list = TASKS_OF_JOB.rows(job_id=job.id)
    return job


def wait_job(rt, principal, job_id, wait_seconds):
    """A job; with `wait_seconds`, as soon as it is terminal (or when the wait ends, as it is then).
    No pooled connection is held while waiting."""
    job = get_job(principal, job_id)
    if wait_seconds <= 0 or JobState(job.state).is_terminal():
        return job

    def terminal():
        current = get_job(principal, job_id)
        return current if JobState(current.state).is_terminal() else None

    hand_back()
    wait = min(wait_seconds, rt.settings.long_poll_max_seconds)
    return rt.notifier.wait(("job", job_id), wait, lambda: released(terminal)) or released(
        lambda: get_job(principal, job_id))


def job_result(principal, job_id):
    """The outcome of a job and of each rank."""
    job = get_job(principal, job_id)
    return {
        "outcome": job.outcome,
        "reason": job.outcome_reason,
        "attempt": job.attempt,
        "tasks": [
            {"rank": t.rank, "node_id": t.node_id, "exit_code": t.exit_code,
             "outcome": t.state if TaskState(t.state).is_terminal() else None, "reason": t.reason}
            for t in job.task_list
        ],
    }


def job_logs(principal, job_id, limit, after=None, rank=None):
    """Log lines of a job in order; `after` is the last seq seen."""
    get_job(principal, job_id)
    query = LogLine.select().where(LogLine.job == job_id)
    if rank is not None:
        query = query.where(LogLine.rank == rank)
    if after is not None:
        query = query.where(LogLine.id > after)
    return paginate(query, LogLine.id, limit)


def job_logs_tail(principal, job_id, count):
    """The last `count` log lines of a job, oldest first."""
    get_job(principal, job_id)
    return last_rows(LogLine.select().where(LogLine.job == job_id), LogLine.id, count)


def job_events_tail(principal, job_id, count):
    """The last `count` events of a job, oldest first."""
    get_job(principal, job_id)
    return last_rows(Event.select().where((Event.subject_type == "job") & (Event.subject_id == job_id)), Event.id,
                     count)


def job_events(principal, job_id, limit, cursor=None, after=None):
    """Events of a job and its tasks."""
    get_job(principal, job_id)
    return list_events("job", job_id, limit, cursor, after)


def cancel_job(rt, principal, job_id):
    """Cancel a job. Tasks that no node holds yet are cancelled at once; the nodes that hold the
    others are told to stop them now (their acquire long-poll wakes), and the job is `cancelling`
    until those tasks end (the node reports each finish, or its lease expires), then `cancelled`.
    A job that holds no process (queued, or not yet delivered) is `cancelled` at once.

    The job's waiters are woken after the commit.
    """
    now = rt.clock.now()
    with write_transaction():
        job = find_visible_job(principal, job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        if JobState(job.state).is_terminal() and job.state != JobState.CANCELLED.value:
            raise Conflict(f"job {job_id} already {job.state}", {"state": job.state})
        held = stop_job(job, f"cancelled by {principal.label}", now)
    owe_stops(held)
    rt.notifier.notify(("job", job.id))
    return job


def stop_job(job, reason, now):
    """Cancel a job that is not terminal (inside the caller's transaction): tasks no node holds end
    at once, the job is `cancelling` while nodes hold the others (or `cancelled`). Returns the held
    tasks: after commit, owe_stops() tells their nodes (again, for a job already cancelling)."""
    held = []
    if job.state in (JobState.QUEUED.value, JobState.RUNNING.value):
        for task in Task.select().where((Task.job == job.id) & Task.state.in_(_LIVE_TASK_STATES)):
            if _held(task):
                held.append(task)  # stays active until its node says the process ended
            else:
                switch_task_state(task, TaskState.CANCELLED, reason, now)
        job.outcome, job.outcome_reason = JobState.CANCELLED.value, reason
        if held:
            switch_job_state(job, JobState.CANCELLING, f"{reason}; stopping {len(held)} task(s)", now)
        else:
            switch_job_state(job, JobState.CANCELLED, reason, now)
    elif job.state == JobState.CANCELLING.value:  # asked again: tell the nodes again (a reply may have been lost)
        held = list(Task.select().where((Task.job == job.id) & Task.state.in_(ACTIVE_TASK_STATES)))
    return held


def owe_stops(tasks):
    """The nodes that hold these tasks must stop them now (after the commit that ended them)."""
    for task in tasks:
        STOPS.owe(task.node_id, task.id, task.epoch)


def _held(task):
    """True when a node may run the task's process: it runs, or its assignment was delivered."""
    return task.node_id is not None and (task.state == TaskState.RUNNING.value
                                         or (task.state == TaskState.ASSIGNED.value and task.delivered_at is not None))


_LIVE_TASK_STATES = [TaskState.PENDING.value, TaskState.ASSIGNED.value, TaskState.RUNNING.value]
ACTIVE_TASK_STATES = [TaskState.ASSIGNED.value, TaskState.RUNNING.value]


# ---------------------------------------------------------------- a task ends


def end_task(task, outcome, reason, now, exit_code=None, force_requeue=False, reported=False, free_retry=False):
    """Record how a task ended and settle its job: success, retry of the whole job, or failure.

    `reported`: its node said so (a finish report); otherwise its node is told to stop it.
    `free_retry`: the job is requeued whatever its retry policy and keeps its attempt number
    (its agent stopped it while shutting down: not the job's failure, and no attempt spent).
    Runs inside the caller's transaction. Returns the job.
    """
    outcome = TaskState(outcome)
    task.exit_code = exit_code
    switch_task_state(task, outcome, reason, now, tell_node=not reported)
    job = Job.get_by_id(task.job_id)
    if JobState(job.state).is_terminal():
        return job
    if job.instance_id is not None:  # a run of an instance: it never retries; the instance decides
        from fleetd.services import instances
        return instances.run_ended(job, task, outcome, reason, now)
    tasks = [task] if job.num_nodes == 1 else TASKS_OF_JOB.rows(job_id=job.id)
    if job.state == JobState.CANCELLING.value:  # nothing retries: the job is cancelled once no task runs
        if not any(t.state in ACTIVE_TASK_STATES for t in tasks):
            switch_job_state(job, JobState.CANCELLED, f"every task stopped ({job.outcome_reason})", now)
        return job
    if outcome is TaskState.SUCCEEDED:
        if all(t.state == TaskState.SUCCEEDED.value for t in tasks):
            job.outcome, job.outcome_reason = JobState.SUCCEEDED.value, "every rank succeeded"
            switch_job_state(job, JobState.SUCCEEDED, job.outcome_reason, now)
        return job
    # A rank that did not succeed ends the attempt for the whole gang.
    for other in tasks:
        if other.id != task.id and other.state in ACTIVE_TASK_STATES:
            switch_task_state(other, TaskState.CANCELLED, f"rank {task.rank} {outcome.value}: stopping the gang", now)
    kind = RETRY_KIND.get(outcome)
    retry_on = (job.spec.get("retry") or DEFAULT_RETRY)["on"]
    if outcome is TaskState.CANCELLED:
        job.outcome, job.outcome_reason = JobState.CANCELLED.value, f"rank {task.rank} cancelled: {reason}"
        switch_job_state(job, JobState.CANCELLED, job.outcome_reason, now)
    elif free_retry:
        requeue_job(job, tasks, f"rank {task.rank} {outcome.value} ({reason}); its agent was stopping: "
                                "requeued without using an attempt", now, new_attempt=False)
    elif force_requeue or (kind in retry_on and job.attempt < job.max_attempts):
        requeue_job(job, tasks, f"rank {task.rank} {outcome.value} ({reason}); retrying", now)
    else:
        job.outcome = JobState.FAILED.value
        job.outcome_reason = f"rank {task.rank} {outcome.value}: {reason}"
        if kind in retry_on:
            job.outcome_reason += f" (attempt {job.attempt} of {job.max_attempts})"
        switch_job_state(job, JobState.FAILED, job.outcome_reason, now)
    return job


def requeue_job(job, tasks, reason, now, new_attempt=True):
    """Put a job back in the queue with attempt + 1 (the same attempt without `new_attempt`);
    its ranks start over as pending."""
    if new_attempt:
        job.attempt += 1
    job.pending_reason = "requeued; waiting for the scheduler"
    switch_job_state(job, JobState.QUEUED, f"{reason} (attempt {job.attempt})", now)
    for task in tasks:
        if task.state in ACTIVE_TASK_STATES:
            switch_task_state(task, TaskState.CANCELLED, "requeued", now)
        # node and gpus stay until the next placement: while the old process still runs there,
        # its GPUs are not free (see ClusterState).
        task.delivered_at = task.assigned_at = task.started_at = task.ended_at = None
        task.pid = task.exit_code = None
        task.rendezvous_addr = task.rendezvous_port = None
        switch_task_state(task, TaskState.PENDING, f"attempt {job.attempt}", now)


def stop_tasks_of_node(node_id, reason, now):
    """Stop a node's tasks and requeue their jobs whatever their retry policy (a drain's deadline).

    Runs inside the caller's transaction; returns the ids of the jobs touched.
    """
    jobs = set()
    for task in list(Task.select().where((Task.node == node_id) & Task.state.in_(ACTIVE_TASK_STATES))):
        task = Task.get_by_id(task.id)  # an earlier rank's gang may have ended it already
        if task.state in ACTIVE_TASK_STATES:
            end_task(task, TaskState.PREEMPTED, reason, now, force_requeue=True)
            jobs.add(task.job_id)
    return jobs


# ---------------------------------------------------------------- retention


def ended_before(cutoff):
    """Ids of the jobs that ended before `cutoff` (runs of instances included)."""
    terminal = [s.value for s in JobState if s.is_terminal()]
    return [j.id for j in Job.select(Job.id).where(Job.state.in_(terminal) & (Job.ended_at < cutoff))]


def _chunks(ids, size=500):
    return [ids[start:start + size] for start in range(0, len(ids), size)]


def records_of(job_ids):
    """{jobs, tasks, log_lines, events}: how many rows these jobs hold."""
    counts = {"jobs": len(job_ids), "tasks": 0, "log_lines": 0, "events": 0}
    for chunk in _chunks(job_ids):
        counts["tasks"] += Task.select().where(Task.job.in_(chunk)).count()
        counts["log_lines"] += LogLine.select().where(LogLine.job.in_(chunk)).count()
        counts["events"] += Event.select().where((Event.subject_type == "job") & Event.subject_id.in_(chunk)).count()
    return counts


def delete_jobs(job_ids):
    """Delete these jobs with their tasks, log lines and events (inside the caller's transaction)."""
    for chunk in _chunks(job_ids):
        Event.delete().where((Event.subject_type == "job") & Event.subject_id.in_(chunk)).execute()
        LogLine.delete().where(LogLine.job.in_(chunk)).execute()
        Task.delete().where(Task.job.in_(chunk)).execute()
        Job.delete().where(Job.id.in_(chunk)).execute()


# ---------------------------------------------------------------- stops owed to nodes


class NodeStops:
    """Stops that nodes owe their running processes, kept until the node's acquire takes them.

    A task that fleetd ends while a node holds it (cancel, preemption, a drain's deadline, a
    gang's stop, a requeue) owes that node a stop of (task, epoch), and the node's waiting
    acquire long-polls are woken at once. Stops are owed from inside the transaction that ends
    the task (callers need no runtime), so acquire hands one out only once the database shows it
    (work.acquire); one the database never confirms (a rolled-back transaction) is dropped after
    `confirm_seconds`. Process-wide: node ids are unique. The heartbeat's `cancel` list remains
    the fallback (a lost reply, another replica).
    """

    def __init__(self, confirm_seconds=5.0):
        self.confirm_seconds = confirm_seconds
        self._lock = threading.Lock()
        self._owed = {}  # node id -> {task id: (epoch, monotonic time owed)}
        self._watchers = {}  # node id -> [Notifier of a waiting acquire]
        self.publish = None  # replicas: fn(node id, task id, epoch) that owes it on the others

    def owe(self, node_id, task_id, epoch, local=False):
        """The node must stop (task, epoch): remember it and wake the node's waiting acquires (on
        the other replicas too, unless `local`: the node's acquire may wait on any of them)."""
        with self._lock:
            self._owed.setdefault(node_id, {})[task_id] = (epoch, time.monotonic())
            notifiers = list(self._watchers.get(node_id, ()))
        for notifier in notifiers:
            notifier.notify(("node", node_id), local=True)
        if self.publish is not None and not local:  # a network call: after the commit, not inside it
            publish = self.publish
            after_commit(lambda: publish(node_id, task_id, epoch))

    def owed(self, node_id):
        """{task id: (epoch, monotonic time owed)} of the node (a copy; empty when none)."""
        with self._lock:
            owed = self._owed.get(node_id)
            return dict(owed) if owed else {}

    def discard(self, node_id, entries):
        """Forget these {task id: epoch} of the node (delivered, or no longer owed)."""
        with self._lock:
            owed = self._owed.get(node_id)
            if not owed:
                return
            for task_id, epoch in entries.items():
                if task_id in owed and owed[task_id][0] == epoch:
                    del owed[task_id]
            if not owed:
                del self._owed[node_id]

    @contextlib.contextmanager
    def watching(self, node_id, notifier):
        """While inside, owe() for this node notifies ("node", node_id) on `notifier`."""
        with self._lock:
            self._watchers.setdefault(node_id, []).append(notifier)
        try:
            yield
        finally:
            with self._lock:
                watchers = self._watchers.get(node_id)
                if watchers is not None:
                    watchers.remove(notifier)
                    if not watchers:
                        del self._watchers[node_id]


STOPS = NodeStops()
