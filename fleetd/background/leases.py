"""Expire task leases that their nodes stopped renewing, and reconcile what live nodes list."""

from fleetd.services.agents.leases import expire_leases

NAME = "leases"
DESCRIPTION = (
    "Marks tasks lost when their node stops renewing the lease, or sooner when their live node "
    "stops listing them; requeues or fails their jobs"
)


def run(rt):
    """One sweep; returns how many tasks ended by an expired lease and by reconciliation."""
    return expire_leases(rt)
