"""A node's status change, the one way a node changes state, and what it does to the work the node
holds: a lost node's instances are interrupted, a returning node's run again, a drain's deadline
stops its tasks."""

from fleetd.errors import Conflict
from fleetd.models import (
    Instance,
    InstanceState,
    NodeStatus,
    Task,
    TaskState,
)
from fleetd.services.notify.events import record_event
from fleetd.services.workloads.lifecycle import (
    ACTIVE_TASK_STATES,
    LIVE_STATUSES,
    NODE_TRANSITIONS,
    switch_instance_state,
)
from fleetd.services.workloads.runs import end_task, new_run

# Why a task ended -> the retry condition it counts as.


def stop_tasks_of_node(rt, node_id, reason, now):
    """Stop a node's tasks and requeue their jobs whatever their retry policy (a drain's deadline).

    Runs inside the caller's transaction; returns the ids of the jobs touched.
    """
    jobs = set()
    for task in list(
        Task.select().where((Task.node == node_id) & Task.state.in_(ACTIVE_TASK_STATES))
    ):
        task = Task.get_by_id(task.id)  # an earlier rank's gang may have ended it already
        if task.state in ACTIVE_TASK_STATES:
            end_task(rt, task, TaskState.PREEMPTED, reason, now, force_requeue=True)
            jobs.add(task.job_id)
    return jobs


def node_lost(rt, node_id, reason, now):
    """A node was declared lost (inside switch_node_status): its running instances are interrupted.
    Their runs stay until their leases expire: if the node comes back first, they run on."""
    for inst in Instance.select().where(
        (Instance.node_id == node_id)
        & Instance.state.in_(
            [
                InstanceState.STARTING.value,
                InstanceState.RUNNING.value,
                InstanceState.RESTARTING.value,
            ]
        )
    ):
        switch_instance_state(
            rt, inst, InstanceState.INTERRUPTED, f"node {node_id} lost: {reason}", now
        )
        inst.interrupted_by = "node_lost"
        inst.save()


def node_returned(rt, node_id, now):
    """A lost node is back (inside switch_node_status): its instances interrupted by the loss run
    again, the process they still have there, or a new run on it."""
    for inst in Instance.select().where(
        (Instance.node_id == node_id)
        & (Instance.state == InstanceState.INTERRUPTED.value)
        & (Instance.interrupted_by == "node_lost")
    ):
        if inst.desired_state != "running":
            continue
        task = (
            Task.select()
            .where((Task.job == inst.run_id) & Task.state.in_(ACTIVE_TASK_STATES))
            .first()
        )
        if task is None:
            new_run(rt, inst, now)
        elif task.state == TaskState.RUNNING.value:
            switch_instance_state(
                rt, inst, InstanceState.RUNNING, f"node {node_id} is back; its process ran on", now
            )
        else:
            switch_instance_state(rt, inst, InstanceState.STARTING, f"node {node_id} is back", now)


def switch_node_status(rt, node, to_status, reason, now, actor=None):
    """The one way a node changes state: checks the transition, saves, records an Event (caused
    by `actor`, by default the actor of the code running now: events.current_actor)."""
    from_status = NodeStatus(node.status)
    to_status = NodeStatus(to_status)
    if to_status not in NODE_TRANSITIONS[from_status]:
        raise Conflict(
            f"node {node.id} cannot go from {from_status.value} to {to_status.value}",
            {"status": from_status.value},
        )
    node.status = to_status.value
    node.status_reason = reason
    node.status_before_lost = from_status.value if to_status is NodeStatus.LOST else None
    if to_status is NodeStatus.READY:
        node.cordon = None  # back in service: no operator's cordon holds any more
    node.save()
    # node.drained webhooks say why the node was drained, not only how the drain ended.
    data = {"drain_reason": node.drain_reason} if to_status is NodeStatus.DRAINED else None
    record_event(
        now,
        "node.status",
        "node",
        node.id,
        reason,
        from_status.value,
        to_status.value,
        actor=actor,
        data=data,
    )
    if to_status is NodeStatus.LOST:
        node_lost(rt, node.id, reason, now)
    elif from_status is NodeStatus.LOST and to_status in LIVE_STATUSES:
        node_returned(rt, node.id, now)
    return node
