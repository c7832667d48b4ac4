"""The periodic scheduling pass (passes also run right after submits, task ends and node
changes)."""

from fleetd.services.placement.scheduling import run_pass

NAME = "scheduling"
DESCRIPTION = "Places queued jobs and refreshes their pending reasons"


def run(rt):
    """One pass; returns how many jobs were placed and how many still wait. Groups parked since
    the last event that could wake them are asked again only after a while: at 100,000 queued
    jobs, asking each every few seconds is most of what a pass costs."""
    return run_pass(rt, recheck_after=rt.settings.scheduler_parked_recheck_seconds)
