"""Finish drains whose nodes run nothing any more or whose deadline has passed."""

from fleetd.db import write_transaction
from fleetd.models import Node, NodeStatus
from fleetd.services.nodes import settle_drain

NAME = "drains"
DESCRIPTION = "Moves draining nodes to drained when their tasks are done or the deadline passes"


def run(rt):
    """One pass over draining nodes; returns how many finished draining."""
    finished, requeued = 0, set()
    draining = [n.id for n in Node.select(Node.id).where(Node.status == NodeStatus.DRAINING.value)]
    for node_id in draining:
        with write_transaction():
            rt.leader.fence()
            node = Node.get_or_none(Node.id == node_id)
            jobs = settle_drain(node, rt.clock.now()) if node is not None else None
        if jobs is not None:
            finished += 1
            requeued |= jobs
    for job_id in requeued:
        rt.notifier.notify(("job", job_id))
    if requeued:
        rt.scheduler.kick()
    return {"drained": finished, "requeued_jobs": len(requeued)}
