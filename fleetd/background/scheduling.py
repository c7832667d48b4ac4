"""The periodic scheduling pass (passes also run right after submits, task ends and node
changes)."""

from fleetd.services.placement.scheduling import run_pass

NAME = "scheduling"
DESCRIPTION = "Places queued jobs and refreshes their pending reasons"


def run(rt):
    """One pass; returns how many jobs were placed and how many still wait."""
    return run_pass(rt)
