"""Agent upgrades of a node (`fleetd bootstrap`, Ansible's upgrade.yml): out of service for the
upgrade, then back in the state the operator left it in, each step one transaction.

begin_upgrade remembers where the node was (ready, cordoned, or an operator's drain with its
reason) in `node.upgrade` and drains a ready or cordoned node; end_upgrade puts a drained node
straight back where it was (a cordoned node goes drained -> cordoned and is never `ready` on the
way), or, when the upgrade failed, keeps it drained with a reason that names the failure. The
record outlives a failed upgrade: the next attempt still returns the node to the operator's state.
An operator who acts on the node meanwhile takes over (nodes.operator_takes_over drops the record).
A node whose agent died in a failed upgrade may be declared lost before the retry begins: the retry
is accepted on the record it holds, and the node stays lost until the new agent's heartbeat brings
it back to where it was when it went silent (drained, for the upgrade's own drain).
"""

import datetime as dt
import re

from fleetd.db import write_transaction
from fleetd.errors import Conflict, NotFound
from fleetd.models import Node, NodeStatus
from fleetd.services.nodes.nodes import get_node, settle_drain
from fleetd.services.notify.events import record_event
from fleetd.services.placement.parking import node_changed
from fleetd.services.workloads.node_status import switch_node_status

#: Statuses an upgrade takes a node from: ready and cordoned are drained by it; an operator's
#: drain (draining, drained) is kept as it is.
UPGRADABLE = ("ready", "cordoned", "draining", "drained")
OUTCOMES = ("succeeded", "failed")


def _node(node_id):
    node = Node.get_or_none(Node.id == node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found")
    return node


def _when(value):
    return value.isoformat() if value is not None else None


def can_upgrade(node):
    """Whether fleetd takes the node through an upgrade: a ready, cordoned, draining or drained one,
    or a lost one whose agent went silent in an upgrade (its record says where it returns)."""
    return node.status in UPGRADABLE or (
        node.status == NodeStatus.LOST.value and node.upgrade is not None
    )


def begin_upgrade(rt, node_id, reason, deadline_seconds):
    """Take a node out of service for an agent upgrade: remember its state and drain it when it is
    ready or cordoned (an operator's drain stays). Returns the node."""
    now = rt.clock.now()
    with write_transaction():
        node = _node(node_id)
        retry_of_lost = node.status == NodeStatus.LOST.value and node.upgrade is not None
        if not can_upgrade(node):
            raise Conflict(
                f"node {node_id} is {node.status}: only a {', '.join(UPGRADABLE[:-1])} or "
                f"{UPGRADABLE[-1]} node is upgraded through fleetd (or a lost one whose upgrade "
                f"failed)",
                {"status": node.status},
            )
        record = node.upgrade
        if record is None:  # a retry after a failed upgrade keeps what the first attempt remembered
            record = {
                "before": {
                    "status": node.status,
                    "reason": node.status_reason,
                    "drain_reason": node.drain_reason,
                    "drain_deadline": _when(node.drain_deadline),
                    "drain_started_at": _when(node.drain_started_at),
                },
                "drained": node.status in ("ready", "cordoned"),
            }
        failed_before = record.get("failed")
        record.update(reason=reason, started_at=now.isoformat(), failed=None)
        node.upgrade = record
        node.save()
        if node.status in ("ready", "cordoned"):
            node.drain_reason = reason
            node.drain_started_at = now
            node.drain_deadline = now + dt.timedelta(seconds=deadline_seconds)
            switch_node_status(rt, node, NodeStatus.DRAINING, f"upgrade: {reason}", now)
            settle_drain(rt, node, now)
        elif retry_of_lost:
            when = "after the upgrade that failed" if failed_before else "during an upgrade"
            record_event(
                now,
                "node.upgrade",
                "node",
                node_id,
                f"upgrade: {reason}; the node stays lost until its new agent's heartbeat "
                f"(it went silent {when})",
            )
        else:
            before = record["before"]
            why = before["drain_reason"] or before["reason"] or "no reason given"
            record_event(
                now,
                "node.upgrade",
                "node",
                node_id,
                f"upgrade: {reason}; the node stays {node.status} as an operator left it ({why})",
            )
    return get_node(node_id)


def end_upgrade(rt, node_id, outcome, detail=""):
    """End a node's upgrade. succeeded: back to the state it was in before, in one step; failed: it
    stays out of service, drained with a reason naming the failed upgrade. Returns the node."""
    now = rt.clock.now()
    with write_transaction():
        node = _node(node_id)
        record = node.upgrade
        if record is None:
            raise Conflict(f"node {node_id} has no upgrade in progress", {"status": node.status})
        if outcome == "failed":
            said = _fail(node, record, detail, now)
        else:
            said = _restore(rt, node, record, detail, now)
        # One event per upgrade's end, whatever became of the node: node.upgraded webhooks receive
        # it.
        record_event(
            now,
            "node.upgraded",
            "node",
            node_id,
            said,
            data={"outcome": outcome, "detail": detail, "status": node.status},
        )
    if node.status == NodeStatus.READY.value:
        rt.scheduler.kick(what=node_changed(node))
    return get_node(node_id)


def _fail(node, record, detail, now):
    why = f"upgrade failed ({record['reason']})" + (f": {detail}" if detail else "")
    record["failed"] = {"at": now.isoformat(), "detail": detail}
    node.upgrade = record
    if record["drained"] and node.status in ("draining", "drained"):
        # Ours: the drain stays, now naming the failure; an operator undrains once the agent is
        # fixed.
        node.drain_reason = why
        node.status_reason = why
    node.save()
    return f"{why}; the node stays {node.status}"


# What _restore says of a cordoned node it put back: read again at the next upgrade's end, only the
# operator's own reason is kept, so that reasons never nest.
_RESTORED = re.compile(
    r"^upgrade done \(.*?\)(?:: .*?)?; cordoned as before(?: \((?P<inner>.*)\))?$", re.S
)


def _operator_reason(reason):
    """The operator's reason inside what earlier upgrades' ends said of a cordoned node."""
    for _ in range(100):
        match = _RESTORED.match(reason or "")
        if match is None:
            break
        reason = match.group("inner") or ""
    return reason


def _restore(rt, node, record, detail, now):
    before = record["before"]
    done = f"upgrade done ({record['reason']})" + (f": {detail}" if detail else "")
    node.upgrade = None
    if not record["drained"]:
        node.save()  # an operator's drain: it was never touched
        return f"{done}; the node stays {node.status} as an operator left it"
    if node.status not in ("draining", "drained"):
        raise Conflict(
            f"node {node.id} is {node.status}, not drained for its upgrade: it is not put back "
            f"{before['status']}",
            {"status": node.status},
        )
    node.drain_reason = node.drain_deadline = node.drain_started_at = None
    if before["status"] == NodeStatus.CORDONED.value:
        switch_node_status(
            rt,
            node,
            NodeStatus.CORDONED,
            f"{done}; cordoned as before"
            + (f" ({reason})" if (reason := _operator_reason(before.get("reason"))) else ""),
            now,
        )
    else:
        switch_node_status(rt, node, NodeStatus.READY, done, now)
    return f"{done}; the node is {node.status} again"
