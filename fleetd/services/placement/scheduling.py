"""Scheduling passes: build a snapshot from the tables, ask the pure engine, write assignments
back."""

import collections
import dataclasses
import functools
import logging
import time

from fleetd import scheduler
from fleetd.db import database, write_transaction
from fleetd.models import Fleet, Job, JobState, Node, NodeStatus, TaskState
from fleetd.services.identity.identities import UidsExhausted
from fleetd.services.notify.events import FLEETD, acting_as
from fleetd.services.placement.assigned import place_task
from fleetd.services.placement.cluster import ClusterState
from fleetd.services.placement.parking import ALLOWANCE, CAPACITY
from fleetd.services.placement.queue_read import opened_since, read_queue, unread_requests
from fleetd.services.placement.reasons import never_fits, nowhere, pinned_reason
from fleetd.services.placement.rules import Rules, preempt, preemption
from fleetd.services.workloads.lifecycle import switch_job_state, switch_task_state
from fleetd.services.workloads.runs import TASKS_OF_JOB, run_placed
from fleetd.sql import Statement

log = logging.getLogger(__name__)


def run_pass(rt, full=True, recheck_after=0.0):
    """One scheduling pass over the queued jobs; returns {"assigned": jobs, "pending": jobs}.

    Three phases, so that the costly one never holds the database or the event loop:
    1. read the queue and the cluster (short, on the loop);
    2. decide in the pure engine (rt.offload: a worker thread under `fleetd serve`), one
       feasibility answer per group of equivalent jobs; a kicked pass skips parked groups, a
       `full` one asks each through its first job (their other jobs stay unread either way),
       or, with `recheck_after` seconds, only those parked about that long and those whose
       fleet's availability window opened since they were parked (the periodic pass);
    3. write the assignments in one short transaction, each checked against what changed in
       the meantime (a job cancelled, a node cordoned): those wait for the next pass.
    Passes never overlap; nodes that got work are woken after the commit.
    """
    if not rt.leader.leading():
        return {"assigned": 0, "pending": 0, "skipped": "this replica does not lead"}
    with (
        rt.pass_lock,
        acting_as(FLEETD),
    ):  # placements and preemptions are fleetd's, even when a request kicked
        started = time.perf_counter()
        try:
            return _run_pass(rt, full, recheck_after=recheck_after)
        finally:
            if rt.instruments is not None:
                rt.instruments.scheduling_pass.observe(time.perf_counter() - started)


@dataclasses.dataclass
class _Plan:
    """What the compute phase decided: placements, reasons to wait, and what to try to preempt
    for."""

    placed: list = dataclasses.field(default_factory=list)  # (job, request, Placement)
    waiting: dict = dataclasses.field(default_factory=dict)  # job id -> reason
    preempt: list = dataclasses.field(default_factory=list)  # (job, PreemptionPlan) to carry out
    parked: dict = dataclasses.field(
        default_factory=dict
    )  # group key -> (reason, kind): found not to fit
    looked: set = dataclasses.field(
        default_factory=set
    )  # group keys asked (their parking is settled anew)
    errors: dict = dataclasses.field(default_factory=dict)  # job id -> reason it is newly set aside
    bounded: bool = False  # stopped early at the pass's bound

    def wait(self, job, reason):
        """The job waits for `reason`: written only when that is news."""
        if job.pending_reason != reason:
            self.waiting[job.id] = reason


def _run_pass(rt, full, read_all=False, recheck_after=0.0):
    now = rt.clock.now()
    stamps = rt.parked.stamps()
    parked = None if read_all else rt.parked.parked()
    # The parked groups this pass asks again (True: every one) and those it skips.
    asked: bool | set = bool(full)
    skipped = None if full else parked
    if full and parked and recheck_after > 0:
        due = rt.parked.due(recheck_after, now, opened_since(rt.inventory.get(), now))
        skipped = {key: reason for key, reason in parked.items() if key not in due}
        asked = due
    with database.atomic():  # one consistent read
        # A full pass looks at every group, parked ones through their first job (queue_read).
        queued, unread = read_queue(parked, first_of=asked)
        if not queued and not unread:
            rt.parked.clear()
            return {"assigned": 0, "pending": 0}
        queued, terms, aside = _evaluable(rt.terms, queued)
        # Read (in a full pass) for a group with unread jobs: a job of a group not asked is not
        # read, so is never among those placed.
        followed = {first for _, _, first in unread}
        unread = unread_requests(rt.terms, unread)
        # The worker thread takes no locks: liveness is handed over frozen.
        inventory = rt.inventory.get()
        stale_for = rt.inventory.stale_for  # read at once: another caller's get() resets it
        since = rt.parked.view_since(inventory.version, stamps, stale_for > 0)
        state = ClusterState(
            rt.terms,
            now,
            rt.liveness.overdue_view(),
            rt.liveness.reported_running(),
            inventory,
            rt.reservations,
        )
        if any(t.request.host_ports for t in terms.values()) or any(
            r.host_ports for r, _ in unread
        ):
            # A new instance with ports: its owner's ports on each node count.
            state.load_owner_ports()
        rules = Rules.load(state, now)
    plan = rt.offload(
        _decide,
        rt.settings,
        queued,
        terms,
        state,
        rules,
        skipped,
        dict(rt.nominations),
        rt.engines,
        unread,
    )
    if any(job.id in followed for job, _, _ in plan.placed):
        # A parked group fits after all (what no event announced, a window opening): its other
        # jobs were not read, so decide again over every queued job, in placement order.
        return _run_pass(rt, full, read_all=True, recheck_after=recheck_after)
    plan.waiting.update(aside)
    for job_id, reason in plan.errors.items():
        log.error("scheduling: job %s set aside: %s", job_id, reason)
    rt.parked.update(plan.parked, since, plan.looked, now)
    assigned, woken = _write(rt, plan, now, inventory)
    for node_id in woken:
        rt.notifier.notify(("node", node_id))
    if plan.bounded and rt.instruments is not None:
        rt.instruments.scheduling_bounded.inc()
    # The rest of the queue in the next pass; or a parked group's reason changed, which its first
    # job has been told: the next pass reads and tells the others.
    if (
        (plan.bounded or followed & plan.waiting.keys())
        and rt.scheduler is not None
        and rt.scheduler.running
    ):
        rt.scheduler.kick(capacity=False)
    result = {
        "assigned": assigned,
        "pending": len(queued) + len(aside) + sum(c for _, c in unread) - assigned,
    }
    if stale_for:  # decided on a view some seconds old: look again once it is new
        result["retry_in"] = stale_for
    return result


def _decide(settings, queued, terms, state, rules, parked, nominations, engines, unread=()):
    """The compute phase: place queued jobs in order, one engine answer per group of equivalent
    jobs; `parked`: {key: reason} of groups to skip (None: look at every group); `unread`:
    [(request, jobs)] of the queued jobs of parked groups that were not read (they know why).

    It runs in a worker thread: no database, no locks, no logging here. The engine sees only the
    nodes some job to look at could use (its fleet, its GPU types), and is kept from pass to pass
    (`engines`, which passes use one at a time): only nodes that changed are brought up to date.
    """
    plan = _Plan()
    keys = {job.id: terms[job.id].group for job in queued}
    todo = [job for job in queued if parked is None or keys[job.id] not in parked]
    for job in queued:
        if parked is not None and keys[job.id] in parked:
            plan.wait(
                job, parked[keys[job.id]]
            )  # a job that joined a parked group learns why at once
    if not todo:
        return plan
    profile = _profile(state, keys, terms, unread)
    # The engine and its candidate nodes, got when a job first needs them: a pass whose jobs
    # all wait for a quota or could never fit (a deep backlog asking for a GPU no node has)
    # builds none, which at 100,000 nodes took seconds of the interpreter lock.
    got: list = []
    todo_requests = [terms[j.id].request for j in todo]

    def engine_for(policy):
        if not got:
            try:
                got.extend(
                    engines.engine(state, todo_requests, settings.scheduler_policy or None, profile)
                )
            except Exception as exc:  # the pass fails, as it would have before any job
                raise _NoEngine() from exc
        got[0].use_policy(policy, profile)
        return got[0]

    by_fleet = settings.policy_by_fleet
    deadline = time.perf_counter() + settings.scheduler_max_pass_seconds
    blocked: dict[str, str] = {}  # group key -> reason, for this pass
    for job in todo:
        key = keys[job.id]
        if key in blocked:  # an equivalent job did not fit: capacity only shrinks within a pass
            plan.wait(job, blocked[key])
            continue
        if (
            len(plan.placed) >= settings.scheduler_max_placements_per_pass
            or time.perf_counter() > deadline
        ):
            plan.bounded = True
            break
        request = terms[job.id].request
        plan.looked.add(key)
        policy = by_fleet.get(request.node_selector.fleet) or settings.scheduler_policy or None
        held_back = None
        try:
            held_back = rules.team_limit(request, job.team, job.priority_class)
            request, reason = (
                (None, held_back)
                if held_back is not None
                else rules.request_for(request, job.team, job.priority_class)
            )
            if request is not None and request.host_ports:
                request = dataclasses.replace(
                    request, max_owner_ports=settings.instances_max_host_ports_per_owner_per_node
                )
            # A request no enrolled node could ever hold is not put to the engine: its explanation
            # visits every node it may use (all of them, for a job that names no fleet), and the
            # answer is known already (computed once per inventory and request shape).
            never = never_fits(state.inventory, request) if reason is None else None
            result = (
                None
                if reason is not None or never
                else engine_for(policy).place(request, explain=True)
            )
        except _NoEngine as exc:
            assert exc.__cause__ is not None
            raise exc.__cause__ from None
        except Exception as exc:  # a job the engine cannot evaluate must not stop the others
            reason = _set_aside_reason(exc)
            if job.pending_reason != reason:
                plan.errors[job.id] = reason
            plan.wait(job, reason)
            continue
        if held_back is not None:  # parked until the team's quota, budget or tasks change
            plan.parked[key] = (held_back, ALLOWANCE)
        if never:  # until a node that could hold it joins or changes (preemption cannot help)
            plan.parked[key] = (never, CAPACITY)
            plan.wait(job, never)
            blocked[key] = never
            continue
        if result is not None and result.schedulable:
            rules.charge(job, request)
            plan.placed.append((job, request, result))
            continue
        if result is not None:  # it does not fit (not a quota or a bid): preemption may help
            engine, candidates = got
            reason = result.reason
            if candidates is not None and not result.filter_detail:
                reason += nowhere(request)
            if request.node_selector.node_id is not None:
                reason = (
                    pinned_reason(request.node_selector.node_id, result.filter_detail) or reason
                )
            if job.priority_class == "on-demand" and result.filter_detail:
                why, victims = preemption(
                    state, candidates, request, engine.policy, nominations.get(job.id)
                )
                reason = why or reason
                if victims is not None:
                    plan.preempt.append((job, victims))
            # Parked with the reason its jobs are told (a preemption's, when one was planned):
            # a pass that skips the group tells a job that joins it the same.
            plan.parked[key] = (reason, CAPACITY)
        plan.wait(job, reason)
        blocked[key] = reason
    return plan


class _NoEngine(Exception):
    """The pass's engine could not be got: raised past the per-job handling."""


def _profile(state, keys, terms, unread=()):
    """The shapes that arrive (queued and running work): what fragmentation is measured against.
    Equivalent requests are counted together (a deep queue is a few groups); `keys` is
    {queued job id: its group}, so the queue costs one count per job; `unread` adds
    [(request, jobs)] of queued jobs the pass did not read."""
    members = collections.Counter(keys.values())
    some = {key: job_id for job_id, key in keys.items()}  # one job of each group
    requests = [t.job.request for t in {t.job_id: t for t in state.tasks}.values()]
    requests += [
        dataclasses.replace(
            terms[some[key]].request, num_nodes=terms[some[key]].request.num_nodes * count
        )
        for key, count in members.items()
    ]
    requests += [
        dataclasses.replace(request, num_nodes=request.num_nodes * count)
        for request, count in unread
    ]
    groups: dict[tuple, tuple] = {}  # request's shape -> (a request of it, nodes asked for)
    for request in requests:
        key = (
            request.cpu_milli,
            request.gpus,
            request.gpu_memory_bytes,
            request.gpu_compute_percent,
            request.gpu_types,
        )
        count = groups.get(key, (request, 0))[1]
        groups[key] = (request, count + request.num_nodes)
    return scheduler.profile_from_requests(
        [dataclasses.replace(request, num_nodes=count) for request, count in groups.values()]
    )


def _write(rt, plan, now, inventory):
    """The write phase: preemptions, then assignments that still hold, then changed reasons."""
    assigned = 0
    woken: set[str] = set()  # nodes that got work
    with write_transaction():
        rt.leader.fence()  # a replica that lost the lead meanwhile writes nothing
        for job, victims in plan.preempt:
            preempt(rt, job, victims, now)
        schedulable = _schedulable_nodes(
            {r.node_id for _, _, result in plan.placed for r in result.ranks}
        )
        jobs = {j.id: j for j in _jobs_by_id([job.id for job, _, _ in plan.placed])}
        tasks = _tasks_of(list(jobs))
        roots: dict[str, bool] = {}  # fleet -> allows root tasks, read once in this transaction
        for job, _, result in plan.placed:
            fresh = jobs.get(job.id)
            ranks = [tasks.get((job.id, r.rank)) for r in result.ranks]
            if (
                fresh is None
                or fresh.state != JobState.QUEUED.value
                or not set(result.node_ids) <= schedulable
                or any(t is None or t.state != TaskState.PENDING.value for t in ranks)
            ):
                continue  # cancelled, or its node left service, while the engine decided: next pass
            try:
                run_as = [
                    _run_as(rt, inventory, fresh, r.node_id, now, roots) for r in result.ranks
                ]
            except UidsExhausted as exc:
                plan.waiting[job.id] = (
                    f"cannot run: no uid to run its tasks as ({exc}); an admin can widen "
                    "task_uid_range or give its token a unix_user"
                )
                continue
            _assign(rt, fresh, ranks, result, now, woken, run_as)
            assigned += 1
        for job_id, reason in plan.waiting.items():
            _RECORD_REASON.execute(id=job_id, reason=reason)
    return assigned, woken


def _run_as(rt, inventory, job, node_id, now, roots):
    """Who the job's task runs as on this node (services.identity.identities): root only for an
    admin's work in a fleet that allows root tasks (`roots`: what the write transaction read of
    that rule, by fleet)."""
    fleet = inventory.node_fleet.get(node_id)
    row = inventory.fleets.get(fleet)
    # Read afresh, inside the write transaction: the pass's inventory may be a second old, and root
    # is never granted on a view older than the fleet's rule (an admin just turned it off).
    return rt.identities.run_as(
        job.owner_token_id,
        functools.partial(_allows_root, fleet, roots),
        now,
        row.task_identity if row is not None else "dynamic",
        job.user,
    )


def _allows_root(fleet, roots):
    if fleet not in roots:
        roots[fleet] = bool(
            fleet and Fleet.select(Fleet.allow_root_tasks).where(Fleet.name == fleet).scalar()
        )
    return roots[fleet]


def _assign(rt, job, tasks, result, now, woken, run_as):
    rt.nominations.pop(job.id, None)
    for task, rank, identity in zip(tasks, result.ranks, run_as):
        reason = place_task(task, rank)
        task.run_as = identity
        task.epoch += 1
        task.assigned_at = now
        task.delivered_at = None
        switch_task_state(rt, task, TaskState.ASSIGNED, reason, now)
        rt.leases.renew(task.id, task.epoch)
        woken.add(rank.node_id)
    if rt.instruments is not None and job.attempt == 1:
        rt.instruments.queue_wait.observe(max(0.0, (now - job.submitted_at).total_seconds()))
    job.pending_reason = ""
    switch_job_state(job, JobState.RUNNING, f"placed by policy {result.policy}", now)
    if job.instance_id is not None:
        run_placed(rt, job, tasks[0], now)


def _schedulable_nodes(node_ids):
    """The ids among these of nodes that still take new work (read in the write transaction)."""
    ids = sorted(node_ids)
    out: set[str] = set()
    for start in range(0, len(ids), 500):
        rows = Node.select(Node.id).where(
            Node.id.in_(ids[start : start + 500]) & (Node.status == NodeStatus.READY.value)
        )
        out.update(row.id for row in rows)
    return out


def _jobs_by_id(job_ids):
    out = []
    for start in range(0, len(job_ids), 500):
        out += list(Job.select().where(Job.id.in_(job_ids[start : start + 500])))
    return out


def _evaluable(terms_cache, queued):
    """(jobs, {id: JobTerms}, {id: reason}) : the queued jobs the engine can evaluate, their terms,
    and why each of the others is set aside (it stays queued; the rest go on)."""
    terms, failed = terms_cache.get_each([job.id for job in queued])
    aside = {}
    for job in queued:
        if job.id in failed:
            reason = _set_aside_reason(failed[job.id])
            if job.pending_reason != reason:
                log.error("scheduling: job %s set aside", job.id, exc_info=failed[job.id])
                aside[job.id] = reason
    return [job for job in queued if job.id in terms], terms, aside


def _set_aside_reason(exc):
    """Why a job that cannot be evaluated waits."""
    return f"set aside: fleetd cannot evaluate this job ({type(exc).__name__}: {str(exc)[:200]})"


def _tasks_of(job_ids):
    """{(job id, rank): Task} of these jobs."""
    return {
        (task.job_id, task.rank): task
        for job_id in job_ids
        for task in TASKS_OF_JOB.rows(job_id=job_id)
    }


_RECORD_REASON = Statement(
    lambda v: Job.update(pending_reason=v("reason")).where(
        (Job.id == v("id"))
        & (Job.state == JobState.QUEUED.value)
        & (Job.pending_reason != v("reason"))
    )
)
