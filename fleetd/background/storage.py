"""Measure fleetd's data dir: database, artifacts, free disk."""

from fleetd.services.fleet_ops.metrics import measure_storage

NAME = "storage"
DESCRIPTION = "Measures the database, the artifact store and the free disk of the data dir"
RUN_AT_START = (
    True  # else cluster status would have no storage figures for an interval after every start
)


def run(rt):
    """One measurement; returns the main sizes."""
    return measure_storage(rt)
