"""The rules a pass applies beside the engine's fit: team quotas, spot bids, budgets, GPU type
prices, and preemption of lower-priority work."""

import dataclasses

from fleetd import scheduler
from fleetd.clock import utcnow
from fleetd.models import GpuType, Quota, Task, TaskState
from fleetd.services.accounting.budget_state import blocked_teams
from fleetd.services.placement.reservations import gpus_of
from fleetd.services.workloads.lifecycle import ACTIVE_TASK_STATES
from fleetd.services.workloads.runs import end_task
from fleetd.sql import Statement

_QUOTAS = Statement(lambda v: Quota.select())
_GPU_TYPES = Statement(lambda v: GpuType.select())


class Rules:
    """Quotas and spot prices applied before placement; usage is charged as jobs are placed."""

    def __init__(self, quotas, prices, usage, models, budgets=None):
        self.quotas = quotas  # (team, class or "any") -> max GPUs
        self.prices = prices  # model -> GpuType
        self.usage = usage  # (team, class) -> GPUs held
        self.models = models  # every GPU model in the fleet
        self.budgets = (
            budgets or {}
        )  # team -> (classes held back or None: all, why): exceeded budgets

    @classmethod
    def load(cls, state, now=None):
        quotas = {(q.team, q.priority_class): q.max_gpus for q in _QUOTAS.rows()}
        prices = {t.model: t for t in _GPU_TYPES.rows()}
        usage = dict(state.usage)  # (team, priority class) -> GPUs held; charged as jobs are placed
        return cls(
            quotas, prices, usage, set(state.inventory.all_models), blocked_teams(now or utcnow())
        )

    def held(self, team, priority_class):
        if priority_class == "any":
            return sum(v for (t, _), v in self.usage.items() if t == team)
        return self.usage.get((team, priority_class), 0)

    def team_limit(self, request, team, priority_class):
        """Why a job of this team and class may not run now whatever the nodes (its team's budget
        holds it back, or the team is at its quota), or None."""
        team = team or ""
        held_back = self.budgets.get(team)
        if held_back is not None and (held_back[0] is None or priority_class in held_back[0]):
            return held_back[1]
        need = gpus_of(request)
        for klass in (priority_class, "any"):
            limit = self.quotas.get((team, klass))
            if limit is not None and need and self.held(team, klass) + need > limit + 1e-9:
                label = "all classes" if klass == "any" else klass
                return (
                    f"team {team or '(none)'} at its quota for {label}: holds "
                    f"{self.held(team, klass):g} of {limit:g} GPUs, job needs {need:g}"
                )
        return None

    def request_for(self, request, team, priority_class):
        """(TaskRequest, None) or (None, why it waits) for a job of this team and class: the
        request, or a narrower one (the GPU types its spot bid affords)."""
        held_back = self.team_limit(request, team, priority_class)
        if held_back is not None:
            return None, held_back
        if priority_class == "spot" and request.gpu_count:
            accepted = set(request.gpu_types) or self.models
            bid = request.bid or 0
            affordable = {
                m
                for m in accepted
                if (
                    self.prices.get(m) is None
                    or self.prices[m].spot_min_bid is None
                    or self.prices[m].spot_min_bid <= bid
                )
            }
            if not affordable:
                return None, f"bid {bid:g} is under the spot minimum of every accepted GPU type"
            if affordable != accepted or not request.gpu_types:
                request = dataclasses.replace(request, gpu_types=tuple(sorted(affordable)))
        return request, None

    def charge(self, job, request):
        key = (job.team or "", job.priority_class)
        self.usage[key] = self.usage.get(key, 0) + gpus_of(request)


def preemption(state, candidates, request, policy, nominated):
    """(why the job waits, victims plan or None) for an on-demand job that does not fit: a plan to
    preempt spot jobs (the engine's: lowest bid first, fewest victims), or the wait for the ones
    preempted for it before. Pure (the compute phase)."""
    if nominated:
        left = sum(1 for t in state.stopping + state.tasks if t.id in nominated)
        if left:
            return f"waiting for {left} preempted spot task(s) to stop", None
    spot = state.spot_tasks()  # the engine plans with spot tasks alone: only they may be stopped
    if not spot:
        return None, None
    ids = None if candidates is None else {n.id for n in candidates}
    running = [t for t in spot if ids is None or t.node_id in ids]
    if not running:
        return None, None
    plan = scheduler.plan_preemption(state.snapshot(candidates), running, request, policy=policy)
    if not plan.schedulable or not plan.victim_jobs:
        return None, None
    return (
        f"preempted {len(plan.victim_jobs)} spot job(s); placed once their "
        f"{len(plan.victim_tasks)} task(s) stop"
    ), plan


def preempt(rt, job, plan, now):
    """Requeue the victims of a preemption plan (in the write transaction). Their GPUs count as
    held until their node stops reporting them (ClusterState.stopping); the job is placed by a
    later pass."""
    workload = rt.terms.get_many([job.id])[job.id].workload  # read by this pass: cached
    by = f"on-demand {workload.kind} {workload.name} (id {workload.id})"
    for job_id in plan.victim_jobs:
        first = (
            Task.select()
            .where((Task.job == job_id) & Task.state.in_(ACTIVE_TASK_STATES))
            .order_by(Task.rank)
            .first()
        )
        if first is not None:
            end_task(
                rt,
                first,
                TaskState.PREEMPTED,
                f"preempted by {by}",
                now,
                preempted_by=workload,
                resume=rt.settings.instances_resume_preempted,
            )
        rt.notifier.notify(("job", job_id))
    rt.nominations[job.id] = set(plan.victim_tasks)
