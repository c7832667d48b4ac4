"""Nodes: admin actions (cordon, drain, revoke, delete), drains, liveness and inventory (the state
machine is in lifecycle, switch_node_status in runs)."""

import datetime as dt

from fleetd.db import Fenced, write_transaction
from fleetd.errors import Conflict, NotFound
from fleetd.models import Event, Gpu, Node, NodeStatus, Task, TaskState
from fleetd.services.nodes import hosts, validation
from fleetd.services.notify.events import current_actor, list_events, record_event
from fleetd.services.pagination import attach, last_rows, paginate
from fleetd.services.placement.parking import node_changed
from fleetd.services.workloads.lifecycle import ACTIVE_TASK_STATES, LIVE_STATUSES
from fleetd.services.workloads.node_status import stop_tasks_of_node, switch_node_status
from fleetd.services.workloads.runs import end_task
from fleetd.sql import Statement


def list_nodes(
    limit, cursor=None, fleet=None, status=None, agent_version=None, hostname=None, search=None
):
    """One page of nodes (oldest first), optionally of one fleet, status, agent version and/or
    hostname; `search`: those whose hostname holds it (any case)."""
    query = Node.select()
    if agent_version:
        query = query.where(Node.agent_version == agent_version)
    if hostname:
        query = query.where(Node.hostname == hostname)
    if search:
        query = query.where(Node.hostname.contains(search))
    if fleet:
        query = query.where(Node.fleet == fleet)
    if status:
        query = query.where(Node.status == status)
    rows, next_cursor = paginate(query, Node.id, limit, cursor)
    _attach_gpus(rows)
    return rows, next_cursor


def _attach_gpus(nodes):
    """Load the GPUs of these nodes in one query (node.gpu_list, by index)."""
    return attach(nodes, Gpu.select().order_by(Gpu.node, Gpu.index), Gpu.node, "gpu_list")


def find_node(node_id):
    """The node with this id, or None."""
    return Node.get_or_none_by_id(node_id)


def resolve_node(handle, limit=100):
    """The nodes `handle` names, oldest first: the one whose id it is, else those of that hostname.
    At most `limit`."""
    node = find_node(handle)
    if node is not None:
        return [node]
    return list(Node.select().where(Node.hostname == handle).order_by(Node.id).limit(limit))


def get_node(node_id):
    """The node with this id and its GPUs; NotFound if there is none."""
    node = find_node(node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found")
    _attach_gpus([node])
    return node


def _locked_node(node_id):
    node = find_node(node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found")
    return node


def operator_takes_over(node):
    """An operator acts on the node: whatever the health policy or an agent upgrade did is theirs
    now; neither the policy nor the end of an upgrade returns the node to a state by itself (call
    before the node is saved)."""
    if node.health_hold is not None or node.upgrade is not None:
        node.health_hold = node.upgrade = None
        node.save()


def _refuse_if_lost(node, action):
    if node.status == NodeStatus.LOST.value:
        raise Conflict(
            f"node {node.id} is lost; {action} it once it is back, or revoke it",
            {"status": node.status},
        )


def cordon_node(rt, node_id, reason=None):
    """Stop new placements on a ready node. The operator's `reason` is kept in its own field
    (`node.cordon`) for as long as the cordon holds, whatever fleetd says of the node meanwhile (an
    upgrade, a validation); cordoning a cordoned node again gives it a new reason."""
    now = rt.clock.now()
    with write_transaction():
        node = _locked_node(node_id)
        _refuse_if_lost(node, "cordon")
        # Only a ready node: the state machine lets a drained one become cordoned at the end of an
        # agent upgrade (services.nodes.upgrades), which is not an operator's cordon.
        if node.status != NodeStatus.CORDONED.value and not NodeStatus(node.status).allows(
            "cordon"
        ):
            raise Conflict(
                f"node {node_id} cannot go from {node.status} to cordoned", {"status": node.status}
            )
        operator_takes_over(node)
        node.cordon = {"reason": reason or "", "at": now.isoformat(), "actor": current_actor()}
        node.save()
        if node.status != NodeStatus.CORDONED.value:
            switch_node_status(
                rt,
                node,
                NodeStatus.CORDONED,
                f"cordon: {reason}" if reason else "cordoned by admin",
                now,
            )
    return get_node(node_id)


def uncordon_node(rt, node_id, reason="uncordoned by admin"):
    """Allow placements on a cordoned node again; queued work may fit there now."""
    now = rt.clock.now()
    with write_transaction():
        node = _locked_node(node_id)
        _refuse_if_lost(node, "uncordon")
        if node.status != NodeStatus.READY.value:
            if not NodeStatus(node.status).allows("uncordon"):
                raise Conflict(
                    f"node {node_id} is {node.status}, not cordoned", {"status": node.status}
                )
            operator_takes_over(node)
            switch_node_status(rt, node, NodeStatus.READY, reason, now)
    rt.scheduler.kick(what=node_changed(node))
    return get_node(node_id)


def drain_node(rt, node_id, reason, deadline_seconds, repair=False):
    """Stop placements now; the node becomes drained when its tasks are done or the deadline passes.
    `repair`: the node comes back through a validation when it is undrained
    (services.nodes.validation)."""
    now = rt.clock.now()
    with write_transaction():
        node = _locked_node(node_id)
        _refuse_if_lost(node, "drain")
        if node.status in (NodeStatus.DRAINING.value, NodeStatus.DRAINED.value):
            if (
                repair and not node.drain_repair
            ):  # already out of service: it now comes back through validation
                node.drain_repair = True
                node.save()
                record_event(
                    now,
                    "node.drain",
                    "node",
                    node_id,
                    f"drain for repair: {reason}",
                    node.status,
                    node.status,
                )
                return get_node(node_id)
            raise Conflict(f"node {node_id} is already {node.status}", {"status": node.status})
        if not NodeStatus(node.status).allows("drain"):
            raise Conflict(
                f"node {node_id} cannot go from {node.status} to draining", {"status": node.status}
            )
        operator_takes_over(node)
        node.drain_repair = bool(repair)
        node.drain_reason = reason
        node.drain_started_at = now
        node.drain_deadline = now + dt.timedelta(seconds=deadline_seconds)
        switch_node_status(
            rt, node, NodeStatus.DRAINING, f"drain{' for repair' if repair else ''}: {reason}", now
        )
        settle_drain(rt, node, now)
    return get_node(node_id)


def active_task_ids(node_id):
    """Ids of the tasks assigned to or running on a node."""
    return [
        t.id
        for t in Task.select(Task.id).where(
            (Task.node == node_id) & Task.state.in_(ACTIVE_TASK_STATES)
        )
    ]


def settle_drain(rt, node, now, deadline=True):
    """Finish a drain whose node runs nothing any more; at the deadline (unless `deadline` is
    False), stop and requeue its tasks.

    Runs inside the caller's transaction; returns the ids of jobs that were requeued. Stopping tasks
    at the deadline is the leader's work, under its fence (settle_drains, settle_drain_of): a path
    any replica runs (a heartbeat) passes deadline=False.
    """
    if node.status != NodeStatus.DRAINING.value:
        return None
    active = active_task_ids(node.id)
    if not active:
        switch_node_status(rt, node, NodeStatus.DRAINED, "drain complete: no running tasks", now)
        return set()
    if deadline and node.drain_deadline is not None and node.drain_deadline <= now:
        jobs = stop_tasks_of_node(rt, node.id, "node drain deadline passed", now)
        switch_node_status(
            rt,
            node,
            NodeStatus.DRAINED,
            f"drain deadline passed; {len(active)} task(s) stopped and requeued",
            now,
        )
        return jobs
    return None


def settle_drains(rt):
    """Finish the drains that are done or past their deadline, each node in its own transaction;
    requeued jobs' waiters are woken and a pass kicked. Returns (nodes drained, jobs requeued)."""
    finished, requeued = 0, set()
    draining = [n.id for n in Node.select(Node.id).where(Node.status == NodeStatus.DRAINING.value)]
    for node_id in draining:
        jobs = _settle_drain_fenced(rt, node_id)
        if jobs is not None:
            finished += 1
            requeued |= jobs
    _requeued(rt, requeued)
    return finished, len(requeued)


def settle_drain_of(rt, node_id):
    """On the leader only, in a fenced transaction of its own: settle one node's drain (its deadline
    passed while a heartbeat was being answered). A replica that does not lead leaves it to the
    leader."""
    if not rt.leader.leading():
        return
    try:
        jobs = _settle_drain_fenced(rt, node_id)
    except Fenced:
        return  # another replica leads since: it settles the drain
    _requeued(rt, jobs or ())


def _settle_drain_fenced(rt, node_id):
    with write_transaction():
        rt.leader.fence()
        node = find_node(node_id)
        return settle_drain(rt, node, rt.clock.now()) if node is not None else None


def _requeued(rt, jobs):
    for job_id in jobs:
        rt.notifier.notify(("job", job_id))
    if jobs:
        rt.scheduler.kick()


def overdue_live_nodes(rt, overdue):
    """(node id, last heartbeat written down) of the nodes that should be heartbeating and that
    `overdue` (the liveness tracker's view) says are silent. The nodes come from the inventory
    kept in memory (at 100,000 nodes, reading and converting every row each sweep held the
    event loop for about half a second); only the silent ones are read, and a node found lost
    is checked again in its own transaction (mark_node_lost)."""
    live = {status.value for status in LIVE_STATUSES}
    nodes = rt.inventory.get().by_id  # the clock first: a model's attributes cost more to read
    silent = [node_id for node_id in nodes if overdue(node_id) and nodes[node_id].status in live]
    out = []
    for start in range(0, len(silent), 500):  # bounded IN lists
        chunk = silent[start : start + 500]
        query = Node.select(Node.id, Node.last_heartbeat_at).where(Node.id.in_(chunk))
        out.extend(query.tuples().execute())
    return out


def undrain_node(rt, node_id, reason="undrained by admin"):
    """End a drain; the node takes work again (queued work may fit there now)."""
    now = rt.clock.now()
    with write_transaction():
        node = _locked_node(node_id)
        _refuse_if_lost(node, "undrain")
        if not NodeStatus(node.status).allows("undrain"):
            raise Conflict(
                f"node {node_id} is {node.status}, not draining or drained", {"status": node.status}
            )
        operator_takes_over(node)
        if node.drain_repair:  # back from repair: it takes work once it passes validation
            validation.undrain_for_repair(rt, node, now)
            return get_node(node_id)
        node.drain_reason = node.drain_deadline = node.drain_started_at = None
        switch_node_status(rt, node, NodeStatus.READY, reason, now)
    rt.scheduler.kick(what=node_changed(node))
    return get_node(node_id)


def revoke_node(rt, node_id, reason="revoked by admin"):
    """Revoke a node: its session stops working, its tasks end as lost (their jobs retry as for a
    lost node, and are placed again at once) and its agent is told at once, through a waiting
    acquire, to stop them."""
    now = rt.clock.now()
    with write_transaction():
        node = _locked_node(node_id)
        if node.status != NodeStatus.REVOKED.value:
            operator_takes_over(node)
            node.drain_reason = node.drain_deadline = node.drain_started_at = None
            switch_node_status(rt, node, NodeStatus.REVOKED, reason, now)
            for task in list(
                Task.select().where((Task.node == node_id) & Task.state.in_(ACTIVE_TASK_STATES))
            ):
                task = Task.get_by_id(task.id)  # an earlier rank's gang may have ended it already
                if task.state in ACTIVE_TASK_STATES:
                    end_task(rt, task, TaskState.LOST, f"node {node_id} revoked", now)
    rt.scheduler.kick()
    return get_node(node_id)


def delete_node(rt, node_id):
    """Forget a node and its GPUs; Conflict while it still runs tasks."""
    now = rt.clock.now()
    with write_transaction():
        node = _locked_node(node_id)
        active_tasks = active_task_ids(node_id)
        if active_tasks:
            raise Conflict(
                f"node {node_id} still runs {len(active_tasks)} task(s); drain it first",
                {"tasks": active_tasks[:100]},
            )
        Gpu.delete().where(Gpu.node == node_id).execute()
        hosts.retire(node, now)  # the same host enrolling again gets this id back
        node.delete_instance()
        record_event(
            now,
            "node.deleted",
            "node",
            node_id,
            "deleted by admin",
            node.status,
            None,
            data={"hostname": node.hostname, "fleet": node.fleet_id},
        )
    rt.liveness.forget(node_id)


def mark_node_lost(rt, now, node_id, silent_seconds, fence=None):
    """Declare a live node lost after missed heartbeats; no-op if it is no longer live. `fence`:
    the leader's check, inside the transaction (replicas.Leadership.fence)."""
    with write_transaction():
        if fence is not None:
            fence()
        node = find_node(node_id)
        if node is None or NodeStatus(node.status) not in LIVE_STATUSES:
            return False
        switch_node_status(
            rt, node, NodeStatus.LOST, f"no heartbeat for {silent_seconds:.0f}s", now
        )
    return True


def record_heartbeat_times(times):
    """Persist last-heartbeat times in one transaction ({node_id: datetime})."""
    if not times:
        return 0
    with write_transaction():
        for node_id, at in times.items():
            _SEEN_AT.execute(at=at, id=node_id)
    return len(times)


# Compiled once: a sweep at 10,000 nodes writes thousands of these.
_SEEN_AT = Statement(
    lambda v: Node.update(last_heartbeat_at=v("at", Node.last_heartbeat_at)).where(
        Node.id == v("id")
    )
)


def list_node_events(node_id, limit, cursor=None, after=None):
    """A node's events (kept after the node is deleted); NotFound for an id never seen."""
    rows, next_cursor = list_events("node", node_id, limit, cursor, after)
    if not rows and find_node(node_id) is None:
        seen = (
            Event.select()
            .where((Event.subject_type == "node") & (Event.subject_id == node_id))
            .exists()
        )
        if not seen:
            raise NotFound(f"node {node_id} not found")
    return rows, next_cursor


def host_address(host):
    """The address in a host as a run reached it: `user@10.0.0.7:22` -> `10.0.0.7`, `[fd00::7]:22`
    -> `fd00::7`."""
    address = host.rpartition("@")[2]
    if address.startswith("["):
        return address[1:].partition("]")[0]
    name, sep, port = address.rpartition(":")
    return name if sep and port.isdigit() and ":" not in name else address


def record_bootstrap_run(
    rt, node_id, host, outcome, bundle_version="", bundle_sha256="", detail=""
):
    """Record a provisioning run on a node as one of its events; its actor is whoever called (the
    operator's token). The event names the host one way whichever tool ran and however it reached
    the host: by the node's hostname, else by the address it was reached at. Returns the Event."""
    now = rt.clock.now()
    bundle = f"bundle {bundle_version or 'of unknown version'}" + (
        f", sha256 {bundle_sha256}" if bundle_sha256 else ""
    )
    with write_transaction():
        node = find_node(node_id)
        if node is None:
            raise NotFound(f"node {node_id} not found")
        name = node.hostname or host_address(host)
        reason = f"bootstrap on {name}: {outcome}; {bundle}" + (f"; {detail}" if detail else "")
        record_event(now, "node.bootstrap", "node", node_id, reason)
        return (
            Event.select()
            .where(
                (Event.subject_type == "node")
                & (Event.subject_id == node_id)
                & (Event.kind == "node.bootstrap")
                & (Event.at == now)
                & (Event.reason == reason)
            )
            .order_by(Event.id.desc())
            .get()
        )


def node_events_tail(node_id, count):
    """The last `count` events of a node, oldest first."""
    return last_rows(
        Event.select().where((Event.subject_type == "node") & (Event.subject_id == node_id)),
        Event.id,
        count,
    )


def with_last_heartbeat(node_list, liveness):
    """Overlay the in-memory last heartbeat, which is newer than the stored one."""
    for node in node_list:
        seen = liveness.get(node.id)
        if seen is not None:
            node.last_heartbeat_at = seen.at
    return node_list
