"""Measure fleetd's data dir: database, artifacts, free disk."""

from fleetd.services.metrics import measure_storage

NAME = "storage"
DESCRIPTION = "Measures the database, the artifact store and the free disk of the data dir"


def run(rt):
    """One measurement; returns the main sizes."""
    return measure_storage(rt)
