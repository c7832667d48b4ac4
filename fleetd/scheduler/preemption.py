"""Preemption planning: which spot jobs to stop so that on-demand work fits.

On-demand work may preempt spot work, lowest bid first and as few jobs as possible; spot
work never preempts anything. A victim is a whole job: all of its tasks stop (a gang
cannot run with a rank missing). The plan reserves nothing; the jobs service stops the
victims, requeues them per their retry policy and places the request on the next pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from fleetd.scheduler.engine import PlacementEngine
from fleetd.scheduler.model import (
    MILLI,
    ClusterSnapshot,
    Placement,
    PreemptionPlan,
    RunningTask,
    TaskRequest,
    Unschedulable,
    WorkloadProfile,
)
from fleetd.scheduler.policies import Policy

ON_DEMAND = "on-demand"
SPOT = "spot"


def freed(snapshot: ClusterSnapshot, tasks: Iterable[RunningTask]) -> ClusterSnapshot:
    """The snapshot as it would be once these tasks stopped and gave back what they hold."""
    by_node: dict[str, list[RunningTask]] = {}
    for t in tasks:
        by_node.setdefault(t.node_id, []).append(t)
    nodes = []
    for node in snapshot.nodes:
        mine = by_node.get(node.id)
        if not mine:
            nodes.append(node)
            continue
        back: dict[str, list] = {}
        for t in mine:
            for a in t.gpus:
                back.setdefault(a.uuid, []).append(a)
        gpus = []
        for g in node.gpus:
            allocs = back.get(g.uuid, ())
            if allocs:
                compute = g.compute_free_milli + sum(a.compute_milli for a in allocs)
                memory = g.free_memory + sum(a.memory_limit_bytes for a in allocs)
                g = replace(
                    g,
                    compute_free_milli=min(MILLI, compute),
                    memory_free_bytes=min(g.memory_total_bytes, memory),
                    exclusive=g.exclusive and not any(a.exclusive for a in allocs),
                )
            gpus.append(g)
        nodes.append(
            replace(
                node,
                gpus=tuple(gpus),
                cpu_free_milli=node.cpu_free_milli + sum(t.cpu_milli for t in mine),
                memory_free_bytes=node.memory_free_bytes + sum(t.memory_bytes for t in mine),
            )
        )
    return ClusterSnapshot(tuple(nodes))


def plan_preemption(
    snapshot: ClusterSnapshot,
    running: Iterable[RunningTask],
    request: TaskRequest,
    policy: str | Policy | None = None,
    profile: WorkloadProfile | None = None,
) -> PreemptionPlan | Unschedulable:
    """A placement for `request`, stopping the cheapest, fewest spot jobs needed, or why not."""
    result = _place(snapshot, (), request, policy, profile)
    if isinstance(result, Placement):
        return PreemptionPlan(result, (), ())
    if request.priority_class != ON_DEMAND:
        return Unschedulable(reason=f"{result.reason}; spot work does not preempt")
    jobs: dict[str, list[RunningTask]] = {}
    for t in running:
        if t.priority_class == SPOT:
            jobs.setdefault(t.job_id, []).append(t)
    if not jobs:
        return Unschedulable(reason=f"{result.reason}; no spot work to preempt")

    def bid(job_id):
        return max((t.bid or 0.0) for t in jobs[job_id])

    # Cheapest first; among equal bids, the job holding more gets freed first (fewer victims).
    order = sorted(jobs, key=lambda j: (bid(j), -_held(jobs[j]), j))
    chosen: list[str] = []
    for job_id in order:
        chosen.append(job_id)
        if isinstance(_place(snapshot, _tasks(jobs, chosen), request, policy, profile), Placement):
            break
    else:
        return Unschedulable(reason=f"{result.reason}; stopping every spot job would not make room")
    # Drop victims that turn out not to be needed, dearest first.
    for job_id in sorted(chosen[:-1], key=lambda j: (-bid(j), j)):
        trial = [j for j in chosen if j != job_id]
        if isinstance(_place(snapshot, _tasks(jobs, trial), request, policy, profile), Placement):
            chosen = trial
    placement = _place(snapshot, _tasks(jobs, chosen), request, policy, profile)
    victims = tuple(sorted(chosen, key=lambda j: (bid(j), j)))
    return PreemptionPlan(
        placement=placement,
        victim_jobs=victims,
        victim_tasks=tuple(t.task_id for j in victims for t in jobs[j]),
    )


def _held(tasks: list[RunningTask]) -> int:
    return sum(a.compute_milli for t in tasks for a in t.gpus)


def _tasks(jobs: dict[str, list[RunningTask]], chosen: list[str]) -> list[RunningTask]:
    return [t for j in chosen for t in jobs[j]]


def _place(snapshot, victims, request, policy, profile):
    return PlacementEngine(freed(snapshot, victims), policy=policy, profile=profile).place(request)
