"""Declare silent nodes lost, and persist last-heartbeat times in one batch."""

from fleetd.services.fleet_ops.replication import write_down_heard
from fleetd.services.nodes.nodes import mark_node_lost, overdue_live_nodes

NAME = "liveness_sweep"
DESCRIPTION = "Marks nodes lost after TTL + grace without a heartbeat; saves last-heartbeat times"


def run(rt):
    """One sweep; returns how many nodes were declared lost and heartbeat times saved. With
    replicas, a heartbeat another replica wrote down (Node.last_heartbeat_at) counts too."""
    tracker = rt.liveness
    saved = write_down_heard(rt)  # kept for the next sweep when the write fails
    lost = 0
    if not tracker.in_failover_grace() and rt.leader.leading():
        now = rt.clock.now()
        overdue = tracker.overdue_view()  # one look at the clock and the TTL for every node
        limit = tracker.limit()
        for node_id, seen_at in overdue_live_nodes(rt, overdue):
            if (
                rt.leader.shared
                and seen_at is not None
                and (now - seen_at).total_seconds() <= limit
            ):
                continue  # it heartbeats to another replica
            if lost and rt.pause is not None:
                # A rack's switch failing loses thousands at once, a transaction each: the
                # heartbeats of the rest are answered between them. One heard meanwhile is kept.
                rt.pause()
                if not tracker.is_overdue(node_id):
                    continue
            if mark_node_lost(rt, now, node_id, tracker.silent_for(node_id), rt.leader.fence):
                tracker.forget(node_id)
                lost += 1
    return {"lost": lost, "heartbeats_saved": saved}
