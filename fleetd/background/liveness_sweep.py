"""Declare silent nodes lost, and persist last-heartbeat times in one batch."""

from fleetd.models import Node
from fleetd.services.nodes import LIVE_STATUSES, mark_node_lost, record_heartbeat_times

NAME = "liveness_sweep"
DESCRIPTION = "Marks nodes lost after TTL + grace without a heartbeat; saves last-heartbeat times"


def run(rt):
    """One sweep; returns how many nodes were declared lost and heartbeat times saved."""
    tracker = rt.liveness
    saved = record_heartbeat_times(tracker.take_unflushed())
    lost = 0
    if not tracker.in_failover_grace():
        live = [n.id for n in Node.select(Node.id).where(Node.status.in_([s.value for s in LIVE_STATUSES]))]
        overdue = tracker.overdue_view()  # one look at the clock and the TTL for every node
        for node_id in live:
            if overdue(node_id) and mark_node_lost(rt.clock.now(), node_id, tracker.silent_for(node_id)):
                tracker.forget(node_id)
                lost += 1
    return {"lost": lost, "heartbeats_saved": saved}
