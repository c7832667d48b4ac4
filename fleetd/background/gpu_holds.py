"""Free GPUs held by tasks that are no longer active."""

from fleetd.services.nodes.holds import free_leaked_gpus

NAME = "gpu_holds"
DESCRIPTION = (
    "Frees GPUs still held by tasks that are not active (counted in fleetd_leaked_gpus_freed_total)"
)


def run(rt):
    """One check; returns how many GPU holds it freed (should be 0)."""
    return free_leaked_gpus(rt)
