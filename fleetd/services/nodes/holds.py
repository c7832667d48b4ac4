"""GPU holds that outlived their task: a periodic check finds them and frees them.

Nothing stores that a GPU is held: ClusterState (services/placement/cluster.py) derives it from the
active tasks and from the tasks fleetd ended whose node's last heartbeat still lists them running
(their processes are stopping; an ended task keeps its node and GPUs until its next placement
for exactly that). Two ways a hold can outlive its task, each a bug or a lost message rather than
a state the system should be in, so the fixes (counted in fleetd_leaked_gpus_freed_total and
logged) should stay 0:

- an active task whose job has ended (a transition refused half-way left it behind): the task
  is cancelled and its node told to stop it;
- a node's listing that no heartbeat here has refreshed for longer than the liveness sweep lets
  a silent node live (the node heartbeats to another replica now): the listing stops counting,
  and the ended tasks it kept holding GPUs are free.
"""

import logging

from fleetd.db import write_transaction
from fleetd.models import Job, JobState, Task, TaskState
from fleetd.services.placement.task_holds import load_holds
from fleetd.services.workloads.lifecycle import ACTIVE_TASK_STATES, switch_task_state

log = logging.getLogger(__name__)

STALE_LISTING_LIMITS = (
    2  # a listing older than this many silences (TTL + grace) is one no sweep forgot
)
_ENDED_JOB_STATES = [JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value]


def free_leaked_gpus(rt):
    """One check, on the leader: returns {"freed": GPU holds freed} (a slice of a GPU counts as
    one)."""
    if rt.liveness.in_failover_grace():  # a new leader's listings are still arriving
        return {"freed": 0}
    freed = _end_tasks_of_ended_jobs(rt) + _drop_stale_listings(rt)
    if freed:
        if rt.instruments is not None:
            rt.instruments.leaked_gpus_freed.inc(freed)
        if rt.scheduler is not None:
            rt.scheduler.kick(capacity=True)
    return {"freed": freed}


def _end_tasks_of_ended_jobs(rt):
    """Cancel the active tasks of jobs that have ended; returns the GPU holds they had."""
    now = rt.clock.now()
    stray = list(
        Task.select(Task.id, Task.epoch)
        .join(Job, on=(Task.job == Job.id))
        .where(Task.state.in_(ACTIVE_TASK_STATES) & Job.state.in_(_ENDED_JOB_STATES))
    )
    freed = 0
    for found in stray:
        with write_transaction():
            rt.leader.fence()
            task = Task.get_or_none(Task.id == found.id)
            if task is None or task.epoch != found.epoch or task.state not in ACTIVE_TASK_STATES:
                continue
            job = Job.get_by_id(task.job_id)
            if job.state not in _ENDED_JOB_STATES:
                continue
            reason = (
                f"reconciled: its job {job.id} is {job.state}, yet the task was {task.state} on "
                f"node {task.node_id} holding {len(task.gpus or [])} GPU(s)"
            )
            switch_task_state(
                rt, task, TaskState.CANCELLED, reason, now
            )  # its node is told to stop it
        log.warning("freed a leaked GPU hold: task %s/%d %s", task.id, task.epoch, reason)
        freed += len(task.gpus or [])
    return freed


def _drop_stale_listings(rt):
    """Stop counting node listings older than any a live node would have refreshed; returns the GPU
    holds of ended tasks that only those listings kept."""
    limit = STALE_LISTING_LIMITS * rt.liveness.limit()
    freed = 0
    for node_id, seen in rt.liveness.listings_older_than(limit).items():
        listed = {t.id: t.epoch for t in seen.tasks}
        held = [
            h
            for h in load_holds(rt.terms, list(listed))
            if h.node_id == node_id and listed[h.id] == h.epoch and h.gpus
        ]
        rt.liveness.drop_listing(node_id, seen)
        for hold in held:
            log.warning(
                "freed a leaked GPU hold: task %s/%d is %s, but node %s's listing of it from %s "
                "still held %d GPU(s); no heartbeat here has refreshed that listing since",
                hold.id,
                hold.epoch,
                hold.state,
                node_id,
                seen.at,
                len(hold.gpus),
            )
            freed += len(hold.gpus)
    return freed
