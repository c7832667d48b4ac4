"""The states of work and nodes: each state machine's table and the one function that switches
it (checks the transition, saves, records an Event), and the stops that nodes owe the processes
of tasks fleetd ended.

The bottom layer of the services: it imports no other use case (only events, the ledger and the
notification feed), so every other module may switch states through it.
"""

import contextlib
import threading
import time

from fleetd.db import after_commit
from fleetd.errors import Conflict
from fleetd.models import InstanceState, JobState, NodeStatus, TaskState, transition_table
from fleetd.services.accounting.ledger import record_run_end
from fleetd.services.notify import feed
from fleetd.services.notify.events import record_event

# A running job that is cancelled is `cancelling` until the nodes that hold its tasks say their
# processes ended (or their leases expire); a queued one holds no process and is cancelled at once.
JOB_TRANSITIONS = transition_table(
    JobState,
    {
        "queued": "running cancelled failed",
        "running": "queued succeeded failed cancelling cancelled",
        "cancelling": "cancelled",
        "succeeded": "",
        "failed": "",
        "cancelled": "",
    },
)


# An ended task goes back to pending only when the whole job retries (all its ranks are reset):
# a gang whose rank did not succeed runs again as a whole, its ranks that had succeeded too.
TASK_TRANSITIONS = transition_table(
    TaskState,
    {
        "pending": "assigned cancelled",
        "assigned": "running succeeded failed cancelled lost preempted",
        "running": "succeeded failed cancelled lost preempted",
        "succeeded": "pending",
        "failed": "pending",
        "cancelled": "pending",
        "lost": "pending",
        "preempted": "pending",
    },
)


def switch_job_state(job, to_state, reason, now):
    """The one way a job changes state: checks the transition, saves, records an Event; a job that
    ends notifies its owner (feed.job_ended)."""
    from_state = JobState(job.state)
    to_state = JobState(to_state)
    if to_state not in JOB_TRANSITIONS[from_state]:
        raise Conflict(
            f"job {job.id} cannot go from {from_state.value} to {to_state.value}",
            {"state": job.state},
        )
    job.state = to_state.value
    if to_state is JobState.RUNNING and job.started_at is None:
        job.started_at = now
    if to_state.is_terminal():
        job.ended_at = now
        job.pending_reason = ""
    job.save()
    record_event(now, "job.state", "job", job.id, reason, from_state.value, to_state.value)
    if to_state.is_terminal():
        feed.job_ended(job, to_state, reason, now)
    return job


def switch_task_state(rt, task, to_state, reason, now, save=True, tell_node=True, attempt=None):
    """The one way a task changes state; its Event is listed with its job's events. `save=False`:
    the caller saves the row itself, with the next change it makes in the same transaction.
    `tell_node=False`: the node itself reported the end (its process is gone; nothing to stop).
    `attempt`: its job's attempt, when the caller read the job (the ledger's mark of its end)."""
    from_state = TaskState(task.state)
    to_state = TaskState(to_state)
    if to_state not in TASK_TRANSITIONS[from_state]:
        raise Conflict(
            f"task {task.id} cannot go from {from_state.value} to {to_state.value}",
            {"state": task.state},
        )
    if tell_node and to_state.is_terminal() and is_held(task):
        # fleetd ended a task whose process a node may still run: that node is told at once.
        owe_stops(rt, [task])
    if to_state.is_terminal() and not from_state.is_terminal():
        record_run_end(
            task, now, attempt
        )  # the usage ledger accounts the run (if it ran) at its next pass
    task.state = to_state.value
    if to_state.is_terminal():
        task.ended_at = now
    task.reason = reason
    if save:
        task.save()
    record_event(
        now,
        "task.state",
        "job",
        task.job_id,
        f"rank {task.rank}: {reason}",
        from_state.value,
        to_state.value,
    )
    return task


def owe_stops(rt, tasks):
    """The nodes that hold these tasks must stop them now (their acquires are woken after the commit
    that ended them). `rt`: the Runtime whose nodes listen; None outside one (a CLI tool), where no
    node waits: the heartbeat's cancel list tells them."""
    if rt is not None:
        for task in tasks:
            rt.stops.owe(task.node_id, task.id, task.epoch)


def is_held(task):
    """True when a node may run the task's process: it runs, or its assignment was delivered."""
    return task.node_id is not None and (
        task.state == TaskState.RUNNING.value
        or (task.state == TaskState.ASSIGNED.value and task.delivered_at is not None)
    )


LIVE_TASK_STATES = [TaskState.PENDING.value, TaskState.ASSIGNED.value, TaskState.RUNNING.value]


ACTIVE_TASK_STATES = [TaskState.ASSIGNED.value, TaskState.RUNNING.value]


class NodeStops:
    """Stops that nodes owe their running processes, kept until the node's acquire takes them.

    A task that fleetd ends while a node holds it (cancel, preemption, a drain's deadline, a
    gang's stop, a requeue) owes that node a stop of (task, epoch), and the node's waiting
    acquire long-polls are woken once that commits. Stops are owed from inside the transaction
    that ends the task (switch_task_state, owe_stops), and acquire hands one out only once the
    database shows it (work.acquire); one the database never confirms (a rolled-back transaction) is
    dropped after `confirm_seconds`. The heartbeat's `cancel` list remains
    the fallback (a lost reply, another replica). One per Runtime.
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
        if (
            self.publish is not None and not local
        ):  # a network call: after the commit, not inside it
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


# state -> the states it may go to. A process that keeps ending is `restarting` (again at each exit
# while its node restarts it); `deleting` lasts until its processes ended and its node removed the
# volume.
INSTANCE_TRANSITIONS = transition_table(
    InstanceState,
    {
        "pending": "starting stopped interrupted failed deleting deleted",
        "starting": "running restarting stopping stopped interrupted failed deleting deleted",
        "running": "restarting stopping stopped interrupted failed deleting deleted",
        "restarting": "running restarting stopping stopped interrupted failed deleting deleted",
        "stopping": "stopped deleting deleted",
        "stopped": "pending deleting deleted",
        "interrupted": "pending starting running restarting stopping stopped deleting deleted",
        "failed": "pending deleting deleted",
        "deleting": "deleting deleted",
        "deleted": "",
    },
)


ENDED = (
    InstanceState.STOPPED,
    InstanceState.INTERRUPTED,
    InstanceState.FAILED,
    InstanceState.DELETED,
)


def switch_instance_state(rt, inst, to_state, reason, now):
    """The one way an instance changes state: checks the transition, keeps the cost's running
    interval (only `running` is billed) and the current process's start, saves, records an Event;
    its waiters are woken after the commit."""
    from_state = InstanceState(inst.state)
    to_state = InstanceState(to_state)
    if to_state not in INSTANCE_TRANSITIONS[from_state]:
        raise Conflict(
            f"instance {inst.id} is {from_state.value}; it cannot become {to_state.value}",
            {"state": from_state.value},
        )
    if from_state is InstanceState.RUNNING:
        accrue_cost(inst, now)
        inst.running_since = None
    if to_state is InstanceState.RUNNING:
        inst.running_since = now
        if from_state is not InstanceState.RESTARTING:
            inst.started_at = now
        if from_state is not InstanceState.INTERRUPTED or inst.process_started_at is None:
            inst.process_started_at = now  # after a lost node's return its process ran on
    if to_state is not InstanceState.RESTARTING:
        inst.next_start_at = None
    if to_state not in (InstanceState.RUNNING, InstanceState.INTERRUPTED):
        inst.process_started_at = None
    if to_state in ENDED:
        inst.stopped_at = now
    elif from_state in ENDED:
        inst.stopped_at = None  # it runs again: no stop time of an earlier run
    if to_state is InstanceState.PENDING:
        inst.last_exit = None
    if to_state is not InstanceState.INTERRUPTED:
        inst.interrupted_by = inst.preempted_by = None
    inst.state = to_state.value
    inst.status_reason = reason
    inst.save()
    record_event(
        now, "instance.state", "instance", inst.id, reason, from_state.value, to_state.value
    )
    if rt is not None:  # None outside a Runtime (a CLI tool): no waiter listens
        rt.notifier.notify(("instance", inst.id))  # after the commit
    return inst


def accrue_cost(inst, now):
    """Add its running time until `now` at its price to the instance's cost; it runs on from
    `now`."""
    if inst.running_since is not None:
        hours = max(0.0, (now - inst.running_since).total_seconds()) / 3600
        inst.cost_accrued = (inst.cost_accrued or 0.0) + (inst.price_per_hour or 0.0) * hours
        inst.running_since = now


# Allowed transitions (docs/architecture.md, Node states and Job states): state -> the states it
# may go to. Lost and revoked are reachable from anywhere live; a lost node returns to where it was.
# A node validates (services.nodes.validation) when it joins a gated fleet, after a repair drain, or
# when an operator asks; it then goes where it was headed (ready, or back to cordoned or drained),
# or fails.
NODE_TRANSITIONS = transition_table(
    NodeStatus,
    {
        "pending": "ready validating lost revoked",
        "validating": "ready cordoned drained failed_validation validating lost revoked",
        "failed_validation": "validating draining lost revoked",
        "ready": "cordoned draining validating lost revoked",
        "cordoned": "ready draining validating lost revoked",
        # cordoned: the end of an upgrade of a cordoned node
        "draining": "drained ready cordoned validating lost revoked",
        "drained": "ready cordoned validating lost revoked",
        "lost": "pending ready cordoned draining drained validating failed_validation revoked",
        "revoked": "pending",
    },
)


LIVE_STATUSES = frozenset(NODE_TRANSITIONS[NodeStatus.LOST] - {NodeStatus.REVOKED})
