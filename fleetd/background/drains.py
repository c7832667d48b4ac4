"""Finish drains whose nodes run nothing any more or whose deadline has passed."""

from fleetd.services.nodes.nodes import settle_drains

NAME = "drains"
DESCRIPTION = "Moves draining nodes to drained when their tasks are done or the deadline passes"


def run(rt):
    """One pass over draining nodes; returns how many finished draining."""
    drained, requeued = settle_drains(rt)
    return {"drained": drained, "requeued_jobs": requeued}
