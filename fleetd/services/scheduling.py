"""Scheduling passes: build a snapshot from the tables, ask the pure engine, write assignments back."""

import dataclasses
import logging
import time
import threading

from fleetd import scheduler
from fleetd.db import database, write_transaction
from fleetd.models import GpuType, Job, JobState, Quota, Task, TaskState
from fleetd.services.cluster import TERMS, ClusterState
from fleetd.services.jobs import (ACTIVE_TASK_STATES, TASKS_OF_JOB, end_task, switch_job_state, switch_task_state,
                                  task_request)
from fleetd.sql import Statement

log = logging.getLogger(__name__)

PRIORITY_ORDER = {"on-demand": 0, "spot": 1}


def _allocation(gpu):
    """A GpuAllocation as stored on the task and sent in the Assignment."""
    out = {"uuid": gpu.uuid, "exclusive": gpu.exclusive, "compute_milli": gpu.compute_milli}
    if not gpu.exclusive:
        out["memory_limit_bytes"] = gpu.memory_limit_bytes
        out["compute_percent"] = gpu.compute_milli / 10
    return out


_PASS_LOCK = threading.Lock()


def run_pass(rt):
    """One scheduling pass over every queued job; returns {"assigned": jobs, "pending": jobs}.

    Assignments are written in the same transaction as the snapshot they were computed
    from, and passes never overlap; nodes that got work are woken after the commit.
    """
    with _PASS_LOCK:
        started = time.perf_counter()
        try:
            return _run_pass(rt)
        finally:
            if rt.instruments is not None:
                rt.instruments.scheduling_pass.observe(time.perf_counter() - started)


def _run_pass(rt):
    now = rt.clock.now()
    woken = set()
    assigned = pending = 0
    with write_transaction():
        queued = _QUEUED.rows()
        if not queued:
            return {"assigned": 0, "pending": 0}
        queued.sort(key=lambda j: (PRIORITY_ORDER.get(j.priority_class, 9), j.id))
        queued, terms = _evaluable(queued)
        state = ClusterState(now, rt.liveness.is_overdue, rt.liveness.reported_running())
        # The shapes that arrive (queued and running work): what fragmentation is measured against.
        running = {t.job_id: t.job.request for t in state.tasks}
        profile = scheduler.profile_from_requests(
            list(running.values()) + [terms[j.id].request for j in queued])
        engine = scheduler.PlacementEngine(state.snapshot(), policy=rt.settings.scheduler_policy or None,
                                           profile=profile)
        rules = Rules.load(state)
        by_fleet = rt.settings.policy_by_fleet
        placed = []
        for job in queued:
            fleet = (job.spec.get("node_selector") or {}).get("fleet")
            engine.use_policy(by_fleet.get(fleet) or rt.settings.scheduler_policy or None, profile)
            try:
                request, blocked = rules.request_for(job.spec, job.team, job.priority_class, terms[job.id].request)
                result = None if blocked is not None else engine.place(request, explain=True)
            except Exception as exc:  # a job the engine cannot evaluate must not stop the others
                pending += 1
                _set_aside(job, exc)
                continue
            if blocked is None:
                if not result.schedulable:
                    blocked = result.reason
                    if job.priority_class == "on-demand":
                        blocked = _preempt_for(rt, job, request, now) or blocked
            if blocked is not None:
                pending += 1
                if job.pending_reason != blocked:
                    job.pending_reason = blocked
                    job.save()
                continue
            rules.charge(job, request)
            placed.append((job, result))
        tasks = _tasks_of([job.id for job, _ in placed])
        for job, result in placed:
            rt.nominations.pop(job.id, None)
            for rank in result.ranks:
                task = tasks[(job.id, rank.rank)]
                task.node = rank.node_id
                task.gpus = [_allocation(g) for g in rank.gpus]
                task.epoch += 1
                task.assigned_at = now
                task.delivered_at = None
                switch_task_state(task, TaskState.ASSIGNED, f"placed on node {rank.node_id}", now)
                rt.leases.renew(task.id, task.epoch)
                woken.add(rank.node_id)
            if rt.instruments is not None and job.attempt == 1:
                rt.instruments.queue_wait.observe(max(0.0, (now - job.submitted_at).total_seconds()))
            job.pending_reason = ""
            switch_job_state(job, JobState.RUNNING, f"placed by policy {result.policy}", now)
            assigned += 1
    for node_id in woken:
        rt.notifier.notify(("node", node_id))
    return {"assigned": assigned, "pending": pending}


def _evaluable(queued):
    """(jobs, {id: JobTerms}) of the queued jobs the engine can evaluate; the others are set aside."""
    try:
        terms = TERMS.of_jobs(queued)
        scheduler.profile_from_requests([t.request for t in terms.values()])
        return queued, terms
    except Exception:  # one spec is bad: find it, keep the rest
        terms = {}
        for job in queued:
            try:
                made = TERMS.of_jobs([job])
                scheduler.profile_from_requests([made[job.id].request])
                terms.update(made)
            except Exception as exc:
                _set_aside(job, exc)
        return [job for job in queued if job.id in terms], terms


def _set_aside(job, exc):
    """Leave a job that cannot be evaluated queued, with the reason, and go on with the others."""
    reason = f"set aside: fleetd cannot evaluate this job ({type(exc).__name__}: {str(exc)[:200]})"
    if job.pending_reason != reason:
        log.error("scheduling: job %s set aside", job.id, exc_info=exc)
        job.pending_reason = reason
        job.save()


def _tasks_of(job_ids):
    """{(job id, rank): Task} of these jobs."""
    return {(task.job_id, task.rank): task for job_id in job_ids for task in TASKS_OF_JOB.rows(job_id=job_id)}


_QUEUED = Statement(lambda v: Job.select().where(Job.state == JobState.QUEUED.value))
_QUOTAS = Statement(lambda v: Quota.select())
_GPU_TYPES = Statement(lambda v: GpuType.select())


def gpus_of(request):
    """GPUs a request holds in all, fractions included (what quotas count)."""
    if request.shared:
        return request.num_nodes * request.gpu_milli / scheduler.MILLI
    return float(request.num_nodes * request.gpu_count)


class Rules:
    """Quotas and spot prices applied before placement; usage is charged as jobs are placed."""

    def __init__(self, quotas, prices, usage, models):
        self.quotas = quotas  # (team, class or "any") -> max GPUs
        self.prices = prices  # model -> GpuType
        self.usage = usage  # (team, class) -> GPUs held
        self.models = models  # every GPU model in the fleet

    @classmethod
    def load(cls, state):
        quotas = {(q.team, q.priority_class): q.max_gpus for q in _QUOTAS.rows()}
        prices = {t.model: t for t in _GPU_TYPES.rows()}
        usage = {}
        seen = set()
        for task in state.tasks:
            if task.job_id in seen:
                continue
            seen.add(task.job_id)
            key = (task.job.team, task.job.priority_class)
            usage[key] = usage.get(key, 0) + gpus_of(task.job.request)
        models = {g.model for gpus in state.gpus.values() for g in gpus}
        return cls(quotas, prices, usage, models)

    def held(self, team, priority_class):
        if priority_class == "any":
            return sum(v for (t, _), v in self.usage.items() if t == team)
        return self.usage.get((team, priority_class), 0)

    def request_for(self, spec, team, priority_class, request=None):
        """(TaskRequest, None) or (None, why it waits) for a job of this team and class (`request`:
        the spec's TaskRequest, when the caller has it)."""
        request = request or task_request(spec)
        team = team or ""
        need = gpus_of(request)
        for klass in (priority_class, "any"):
            limit = self.quotas.get((team, klass))
            if limit is not None and need and self.held(team, klass) + need > limit + 1e-9:
                label = "all classes" if klass == "any" else klass
                return None, (f"team {team or '(none)'} at its quota for {label}: holds "
                              f"{self.held(team, klass):g} of {limit:g} GPUs, job needs {need:g}")
        if priority_class == "spot" and request.gpu_count:
            accepted = set(request.gpu_types) or self.models
            bid = spec.get("bid") or 0
            affordable = {m for m in accepted if (self.prices.get(m) is None
                                                  or self.prices[m].spot_min_bid is None
                                                  or self.prices[m].spot_min_bid <= bid)}
            if not affordable:
                return None, f"bid {bid:g} is under the spot minimum of every accepted GPU type"
            if affordable != accepted or not request.gpu_types:
                request = dataclasses.replace(request, gpu_types=tuple(sorted(affordable)))
        return request, None

    def charge(self, job, request):
        key = (job.team or "", job.priority_class)
        self.usage[key] = self.usage.get(key, 0) + gpus_of(request)


def _preempt_for(rt, job, request, now):
    """Make room for an on-demand job by preempting spot jobs (the engine's plan: lowest bid
    first, fewest victims). Returns why the job still waits, or None when nothing can be done.

    The victims are requeued at once, but their GPUs count as held until their node stops
    reporting them (ClusterState.stopping); the job is placed by a later pass.
    """
    state = ClusterState(now, rt.liveness.is_overdue, rt.liveness.reported_running())
    nominated = rt.nominations.get(job.id)
    if nominated:
        left = sum(1 for t in state.stopping + state.tasks if t.id in nominated)
        if left:
            return f"waiting for {left} preempted spot task(s) to stop"
    plan = scheduler.plan_preemption(state.snapshot(), state.running_tasks(), request,
                                     policy=rt.settings.scheduler_policy or None)
    if not plan.schedulable or not plan.victim_jobs:
        return None
    for job_id in plan.victim_jobs:
        first = (Task.select().where((Task.job == job_id) & Task.state.in_(ACTIVE_TASK_STATES))
                 .order_by(Task.rank).first())
        if first is not None:
            end_task(first, TaskState.PREEMPTED, f"preempted by on-demand job {job.id}", now)
        rt.notifier.notify(("job", job_id))
    rt.nominations[job.id] = set(plan.victim_tasks)
    return (f"preempted {len(plan.victim_jobs)} spot job(s); placed once their "
            f"{len(plan.victim_tasks)} task(s) stop")


class SchedulerLoop:
    """Runs a pass soon after each kick (submit, task end, node change), coalescing kicks.

    The periodic pass is the `scheduling` background task. Without a started loop (tests,
    one-off tools), kick() runs a pass in the caller.
    """

    COALESCE_SECONDS = 0.005
    MAX_PAUSE_SECONDS = 0.1

    def __init__(self, app, rt):
        self.app = app
        self.rt = rt
        self._kicked = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    def kick(self):
        """Ask for a pass soon (now, when no loop runs); True when the pass ran in the caller."""
        if self._thread is None:
            run_pass(self.rt)
            return True
        self._kicked.set()
        return False

    def start(self):
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout=10):
        self._stop.set()
        self._kicked.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self):
        pause = self.COALESCE_SECONDS
        while not self._stop.is_set():
            self._kicked.wait()
            # Let a burst of submits and task ends land first: one pass then places them all.
            # The pause is at least as long as the last pass took, so that passes (which read
            # every active task) take at most about half of fleetd's time however deep the backlog.
            self._stop.wait(pause)
            self._kicked.clear()
            if self._stop.is_set():
                return
            started = time.perf_counter()
            try:
                with self.app.app_context(), database.connection_context():
                    run_pass(self.rt)
            except Exception:  # a failed pass is logged; the next kick or interval retries
                log.exception("scheduling pass failed")
            pause = min(self.MAX_PAUSE_SECONDS, max(self.COALESCE_SECONDS, time.perf_counter() - started))
