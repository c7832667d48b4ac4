"""Dynamic MIG: targets for idle GPUs of dynamic fleets from the queued MIG work."""

from fleetd.services.placement.mig_plan import plan_mig

NAME = "mig_planning"
DESCRIPTION = "Plans MIG layouts for idle GPUs of dynamic fleets from the queue"


def run(rt):
    """One planning run; returns how many GPUs got a target and how many targets expired."""
    return plan_mig(rt)
