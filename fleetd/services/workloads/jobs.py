"""Jobs: submit, read, cancel, logs, events and retention (the use cases; the state machines are
in lifecycle, what a task's end does in runs)."""

import dataclasses

from fleetd.db import hand_back, released, write_transaction
from fleetd.errors import Conflict, Forbidden, InvalidRequest, NotFound
from fleetd.models import Event, Job, JobState, LogLine, Node, Share, Task, TaskState, new_id
from fleetd.services.accounting.usage import with_costs
from fleetd.services.identity import access, limits
from fleetd.services.identity.projects import project_for
from fleetd.services.notify.events import list_events, record_event
from fleetd.services.pagination import attach, last_rows, paginate
from fleetd.services.placement import policy, reasons
from fleetd.services.placement.terms import group_key_of, task_request
from fleetd.services.workloads import output_read, output_whole
from fleetd.services.workloads.artifacts import readable_artifacts
from fleetd.services.workloads.lifecycle import owe_stops
from fleetd.services.workloads.runs import TASKS_OF_JOB, stop_job

# ---------------------------------------------------------------- submit and read


def submit(rt, principal, spec, wait_for_capacity=True):
    """Submit a validated JobSpec: checked as the engine and the bid rules see it, queued (even when
    no enrolled node could ever hold it, unless `wait_for_capacity` is false: Conflict), then the
    scheduler is kicked. Returns the job with its tasks, as placed if the pass ran here."""
    account = (principal.login or "") if rt.terms.accounts() else ""
    # the engine's own checks, before anything is stored
    request = task_request(spec, principal.owner_id, account)
    policy.check_bid(spec)
    never = reasons.capacity_reason(rt, request)
    if never and not wait_for_capacity:
        raise Conflict(f"{never}; not queued (wait_for_capacity=false)", {"reason": "no_capacity"})
    job = submit_job(rt.settings, rt.clock.now(), principal, spec, never, account)
    if rt.scheduler.kick(capacity=False):  # placed right here (no scheduler loop): show where
        job = get_job(principal, job.id)
    job.price_per_hour, job.cost_so_far = None, 0.0  # nothing ran yet: what with_costs() would find
    return job


def submit_job(settings, now, principal, spec, waiting_reason=None, account=""):
    """Queue a validated JobSpec; returns the Job with its tasks (submit() kicks the scheduler).
    LimitExceeded, with nothing stored, past the owner's limits."""
    project = project_for(principal, spec.project)
    team = policy.team_of(principal, spec, project.team)
    spec = dataclasses.replace(
        spec, team=team
    )  # the team it runs as, so that the spec alone says it
    job_id = new_id()
    with write_transaction():
        allowed = limits.hold_owner(settings, principal)
        size = limits.check_spec(allowed, principal, spec, "job")
        limits.check_new_job(allowed, principal)
        wanted = {a.sha256 for a in spec.artifacts}
        known = readable_artifacts(
            principal, wanted
        )  # another token's upload is unknown to this one
        if wanted - known:
            missing = sorted(wanted - known)
            raise InvalidRequest(
                f"unknown artifact(s): {', '.join(missing)}; upload them first",
                {"fields": {"artifacts": missing}},
            )
        job = Job.create(
            id=job_id,
            name=spec.name,
            owner=principal.name,
            owner_token_id=principal.owner_id,
            team=team,
            project=project.key,
            user=principal.login,
            state=JobState.QUEUED.value,
            pending_reason=waiting_reason or "waiting for the scheduler",
            max_attempts=spec.retry_policy.max_attempts,
            num_nodes=spec.num_nodes,
            priority_class=spec.priority_class,
            spec=spec.to_dict(),
            submitted_at=now,
            group_key=group_key_of(spec, team, spec.priority_class, principal.owner_id, account),
        )
        job.task_list = [
            Task(id=new_id(), job=job_id, rank=rank, state=TaskState.PENDING.value, gpus=[])
            for rank in range(job.num_nodes)
        ]
        for task in job.task_list:
            task.save(force_insert=True)
        limits.count_stored(principal.owner_id, size)
        record_event(
            now,
            "job.submitted",
            "job",
            job_id,
            f"submitted by {principal.label}",
            None,
            JobState.QUEUED.value,
            actor=principal.label,
        )
    return job


def _visible(query, principal):
    """The jobs this principal may read (access.readable)."""
    return access.readable(query, principal, Job.owner_token_id, Job.project)


def list_jobs(
    principal,
    limit,
    cursor=None,
    state=None,
    owner=None,
    team=None,
    name=None,
    fleet=None,
    search=None,
):
    """One page of jobs, oldest first, with their tasks. `fleet`: those with a task placed on one of
    its nodes; `search`: those whose name holds it (any case)."""
    query = _visible(Job.select(), principal).where(
        Job.instance_id.is_null()
    )  # runs of instances: see instances
    if state:
        query = query.where(Job.state == state)
    if owner:
        query = query.where(Job.owner == owner)
    if team:
        query = query.where(Job.team == team)
    if name:
        query = query.where(Job.name == name)
    if fleet:
        query = query.where(
            Job.id.in_(
                Task.select(Task.job).where(
                    Task.node.in_(Node.select(Node.id).where(Node.fleet == fleet))
                )
            )
        )
    if search:
        query = query.where(Job.name.contains(search))
    jobs, next_cursor = paginate(query, Job.id, limit, cursor)
    attach_tasks(jobs)
    return jobs, next_cursor


def attach_tasks(jobs):
    """Load the tasks of these jobs in one query (job.task_list, by rank)."""
    return attach(jobs, Task.select().order_by(Task.job, Task.rank), Task.job, "task_list")


def find_visible_job(principal, job_id):
    """The job if this principal may see it, else None."""
    job = Job.get_or_none_by_id(job_id)
    if (
        job is None
        or job.instance_id is not None
        or not access.may_read(principal, job.owner_token_id, job.project)
    ):
        return None  # the runs of instances are not jobs to their users: see instances
    return job


def resolve_job(principal, handle, limit=100):
    """The jobs `handle` names for this principal, oldest first: the one whose id it is, else those
    of that name (never an instance's runs). At most `limit`."""
    job = find_visible_job(principal, handle)
    if job is not None:
        return [job]
    return list(
        _visible(Job.select(), principal)
        .where((Job.name == handle) & Job.instance_id.is_null())
        .order_by(Job.id)
        .limit(limit)
    )


def get_job(principal, job_id):
    """A job with its tasks; NotFound if it does not exist or belongs to someone else."""
    job = find_visible_job(principal, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    job.task_list = TASKS_OF_JOB.rows(job_id=job.id)
    return job


def list_job_views(rt, principal, limit, cursor=None, **filters):
    """list_jobs with each job's costs (the API's listing)."""
    items, next_cursor = list_jobs(principal, limit, cursor, **filters)
    return with_costs(rt, items), next_cursor


def wait_job(rt, principal, job_id, wait_seconds):
    """A job with its costs; with `wait_seconds`, as soon as it is terminal (or when the wait ends,
    as it is then). No pooled connection is held while waiting."""
    return with_costs(rt, [_wait_job(rt, principal, job_id, wait_seconds)])[0]


def _wait_job(rt, principal, job_id, wait_seconds):
    job = get_job(principal, job_id)
    if wait_seconds <= 0 or JobState(job.state).is_terminal():
        return job

    def terminal():
        current = get_job(principal, job_id)
        return current if JobState(current.state).is_terminal() else None

    hand_back()
    wait = min(wait_seconds, rt.settings.long_poll_max_seconds)
    return rt.notifier.wait(("job", job_id), wait, lambda: released(terminal)) or released(
        lambda: get_job(principal, job_id)
    )


def job_result(principal, job_id):
    """The outcome of a job and of each rank."""
    job = get_job(principal, job_id)
    return {
        "outcome": job.outcome,
        "reason": job.outcome_reason,
        "attempt": job.attempt,
        "tasks": [
            {
                "rank": t.rank,
                "node_id": t.node_id,
                "run_as": t.run_as,
                "exit_code": t.exit_code,
                "outcome": t.state if TaskState(t.state).is_terminal() else None,
                "reason": t.reason,
            }
            for t in job.task_list
        ],
    }


def job_logs(rt, principal, job_id, limit, after=None, **filters):
    """Lines of a job's output in order of arrival, and the cursor to go on from; `after` is the
    last seq seen; `filters`: those of output_read.Filter (rank, stream, since, until, q,
    q_regex)."""
    get_job(principal, job_id)
    return output_read.page(rt, [job_id], after, limit, output_read.Filter(**filters))


def job_output(rt, principal, job_id, rank=None, attempt=None, stream=None, gzip=False):
    """The whole output of a job as pieces of text (gzip when asked)."""
    get_job(principal, job_id)
    pieces = output_whole.whole(rt, [job_id], rank, attempt, stream)
    return output_whole.gzipped(rt, pieces) if gzip else pieces


def job_output_info(principal, job_id):
    """How much output a job has, how much is stored, and which lines nodes still hold."""
    job = get_job(principal, job_id)
    return output_whole.info([job_id], job.job_spec.output_cap_bytes)


def job_logs_tail(rt, principal, job_id, count, before=None):
    """The last `count` lines of a job's output (before the seq `before`, if given), oldest
    first: from the output store where fleetd no longer keeps them as text."""
    get_job(principal, job_id)
    return output_read.page_before(rt, [job_id], before, count)


def logs_tail(job_id, count, before=None):
    """job_logs_tail without the reader's check: for a caller that checked its right itself (a share
    link)."""
    query = LogLine.select().where(LogLine.job == job_id)
    if before is not None:
        query = query.where(LogLine.id < before)
    return last_rows(query, LogLine.id, count)


def job_events_tail(principal, job_id, count):
    """The last `count` events of a job, oldest first."""
    get_job(principal, job_id)
    return last_rows(
        Event.select().where((Event.subject_type == "job") & (Event.subject_id == job_id)),
        Event.id,
        count,
    )


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
        if not access.may_change(principal, job.owner_token_id, job.project):
            raise Forbidden(
                f"only its owner, an admin of project {job.project} or an admin may cancel job "
                f"{job_id}",
                {"job_id": job_id},
            )
        if JobState(job.state).is_terminal() and job.state != JobState.CANCELLED.value:
            raise Conflict(f"job {job_id} already {job.state}", {"state": job.state})
        held = stop_job(rt, job, f"cancelled by {principal.label}", now)
    owe_stops(rt, held)
    rt.notifier.notify(("job", job.id))
    return wait_job(rt, principal, job_id, 0)  # as it is now, with its tasks and costs


# ---------------------------------------------------------------- a task ends


# ---------------------------------------------------------------- retention


def ended_before(cutoff):
    """Ids of the jobs that ended before `cutoff` (runs of instances included)."""
    terminal = [s.value for s in JobState if s.is_terminal()]
    return [
        j.id for j in Job.select(Job.id).where(Job.state.in_(terminal) & (Job.ended_at < cutoff))
    ]


def _chunks(ids, size=500):
    return [ids[start : start + size] for start in range(0, len(ids), size)]


def records_of(job_ids):
    """{jobs, tasks, log_lines, events}: how many rows these jobs hold."""
    counts = {"jobs": len(job_ids), "tasks": 0, "log_lines": 0, "events": 0}
    for chunk in _chunks(job_ids):
        counts["tasks"] += Task.select().where(Task.job.in_(chunk)).count()
        counts["log_lines"] += LogLine.select().where(LogLine.job.in_(chunk)).count()
        counts["events"] += (
            Event.select()
            .where((Event.subject_type == "job") & Event.subject_id.in_(chunk))
            .count()
        )
    return counts


def delete_jobs(job_ids):
    """Delete these jobs with their tasks, log lines, events and share links (inside the caller's
    transaction)."""
    for chunk in _chunks(job_ids):
        limits.release_stored(Job, chunk)
        Event.delete().where((Event.subject_type == "job") & Event.subject_id.in_(chunk)).execute()
        LogLine.delete().where(LogLine.job.in_(chunk)).execute()
        Share.delete().where(Share.job_id.in_(chunk)).execute()
        Task.delete().where(Task.job.in_(chunk)).execute()
        Job.delete().where(Job.id.in_(chunk)).execute()


# ---------------------------------------------------------------- stops owed to nodes
