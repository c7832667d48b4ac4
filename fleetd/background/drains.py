"""Finish drains whose nodes run nothing any more or whose deadline has passed."""

from fleetd.db import write_transaction
from fleetd.models import Node, NodeStatus
from fleetd.services.nodes import settle_drain

NAME = "drains"
DESCRIPTION = "Moves draining nodes to drained when their tasks are done or the deadline passes"


def run(rt):
    """One pass over draining nodes; returns how many finished draining."""
    finished = 0
    draining = [n.id for n in Node.select(Node.id).where(Node.status == NodeStatus.DRAINING.value)]
    for node_id in draining:
        with write_transaction():
            node = Node.get_or_none(Node.id == node_id)
            if node is not None and settle_drain(node, rt.clock.now(), rt.liveness.active_tasks(node_id)):
                finished += 1
    return {"drained": finished}
