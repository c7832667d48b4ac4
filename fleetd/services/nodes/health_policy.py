"""The node health policy: a node whose GPU fails or disappears is cordoned, then drained; when the
fault clears it returns to ready, if its fleet's policy says so and only if the policy (not an
operator) took it out of service.

What the policy did is kept on the node (`Node.health_hold`: reason, since, GPUs missing); an
operator's cordon, uncordon, drain, undrain or revoke clears it (nodes.operator_takes_over), so the
policy never undoes what an operator decided.
"""

import datetime as dt

from fleetd.clock import isoformat
from fleetd.db import after_commit
from fleetd.models import Gpu, NodeStatus, effective_health_policy
from fleetd.services.fleet_ops.fleets import fleet_column
from fleetd.services.nodes import gpu_history, nodes
from fleetd.services.notify.events import FLEETD, acting_as, record_event
from fleetd.services.workloads.node_status import switch_node_status
from fleetd.sql import Statement

REASON_MAX = 1000
MISSING_MAX = 64  # GPUs remembered as missing (a node has far fewer)
HELD = (NodeStatus.CORDONED.value, NodeStatus.DRAINING.value, NodeStatus.DRAINED.value)


# Compiled once: a heartbeat that reports GPUs runs them.
_GPU_HEALTH_OF = Statement(
    lambda v: (
        Gpu.select(Gpu.uuid, Gpu.index, Gpu.healthy, Gpu.health_reason)
        .where(Gpu.node == v("node"))
        .order_by(Gpu.index)
    )
)


def _fault(node_id, missing):
    """(what is wrong, GPUs still missing) from the node's stored GPUs; ("", []) when healthy."""
    rows = _GPU_HEALTH_OF.rows(node=node_id)
    present = {g.uuid for g in rows}
    problems = [
        f"GPU {g.index} ({g.uuid}) unhealthy: {g.health_reason or 'no reason given'}"
        for g in rows
        if not g.healthy
    ]
    gone = sorted(set(missing) - present)
    problems += [f"GPU {uuid} gone" for uuid in gone]
    return "; ".join(problems)[:REASON_MAX], gone


def apply_health_policy(rt, node, now, gpu_change=None, reported=False, joined=False):
    """Inside the heartbeat's transaction: act on the node's GPU health. `gpu_change`: what
    inventory.replace_gpus found changed (None: nothing); `reported`: the heartbeat carried GPUs;
    `joined`: the node just became ready. Returns True when the node's status changed."""
    hold = node.health_hold
    if not (gpu_change or joined or (reported and hold is not None)):
        return False
    if node.status not in (NodeStatus.READY.value,) + HELD:
        return False  # pending, lost or revoked: nothing to take out of service
    gone = set(gpu_change.gone) if gpu_change else set()
    missing = gone | set((hold or {}).get("missing", []))
    fault, still_missing = _fault(node.id, missing)
    policy = effective_health_policy(fleet_column(node.fleet_id, "health_policy"))
    with acting_as(FLEETD):
        if fault:
            return _on_fault(rt, node, now, policy, hold, fault, still_missing)
        if hold is not None:
            return _on_recovery(rt, node, now, policy, hold)
    return False


def _on_fault(rt, node, now, policy, hold, fault, missing):
    if hold is not None:  # already out of service for a fault: remember what is wrong now
        if (
            hold.get("reason") != fault
            or hold.get("missing") != missing[:MISSING_MAX]
            or hold.get("cleared")
        ):
            node.health_hold = dict(
                hold, reason=fault, missing=missing[:MISSING_MAX], cleared=False
            )
            node.save()
        return False
    if not policy["cordon_on_gpu_fault"] or node.status != NodeStatus.READY.value:
        return False  # the policy is off, or an operator already took the node out of service
    reason = f"health policy: {fault}"[:REASON_MAX]
    node.health_hold = {"reason": fault, "since": isoformat(now), "missing": missing[:MISSING_MAX]}
    switch_node_status(rt, node, NodeStatus.CORDONED, reason, now)
    _step(rt, node, now, "cordon", reason, NodeStatus.READY.value, NodeStatus.CORDONED.value, fault)
    after = policy["drain_after_seconds"]
    if after is not None:
        node.drain_reason = reason
        node.drain_started_at = now
        node.drain_deadline = now + dt.timedelta(seconds=after)
        switch_node_status(rt, node, NodeStatus.DRAINING, f"drain: {reason}", now)
        _step(
            rt,
            node,
            now,
            "drain",
            f"health policy: draining; tasks may finish for {after} s",
            NodeStatus.CORDONED.value,
            NodeStatus.DRAINING.value,
            fault,
        )
        nodes.settle_drain(
            rt, node, now, deadline=False
        )  # a deadline already due: the heartbeat's caller settles it
    return True


def _on_recovery(rt, node, now, policy, hold):
    if hold.get("cleared"):
        return False
    if not policy["uncordon_when_healthy"] or node.status not in HELD:
        node.health_hold = dict(hold, cleared=True)
        node.save()
        _step(
            rt,
            node,
            now,
            "fault_cleared",
            f"health policy: GPUs healthy again; the node stays {node.status} "
            "(the fleet's policy does not return nodes)",
            node.status,
            node.status,
            "",
        )
        return False
    was = node.status
    node.health_hold = None
    node.drain_reason = node.drain_deadline = node.drain_started_at = None
    reason = (
        f"health policy: GPUs healthy again (out of service since {hold.get('since')}: "
        f"{hold.get('reason')})"
    )
    switch_node_status(rt, node, NodeStatus.READY, reason[:REASON_MAX], now)
    _step(rt, node, now, "return", reason[:REASON_MAX], was, NodeStatus.READY.value, "")
    return True


def _step(rt, node, now, step, reason, from_status, to_status, fault):
    """A node.health Event (its webhook deliveries with it) and, after the commit, the counter."""
    record_event(
        now,
        "node.health",
        "node",
        node.id,
        reason,
        from_status,
        to_status,
        actor=FLEETD,
        data={"step": step, "fault": fault, "fleet": node.fleet_id, "hostname": node.hostname},
    )
    gpu_history.record_health_action(
        node.id, step, reason, now
    )  # in the history of each GPU concerned
    if rt is not None and rt.instruments is not None:
        counter = rt.instruments.health_remediations.labels(step)
        after_commit(counter.inc)
