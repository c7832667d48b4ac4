"""Expire task leases that their nodes stopped renewing."""

from fleetd.services.work import expire_leases

NAME = "leases"
DESCRIPTION = "Marks tasks lost when their node stops renewing the lease; requeues or fails their jobs"


def run(rt):
    """One sweep; returns how many jobs lost a task."""
    return expire_leases(rt)
