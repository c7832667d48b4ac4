"""Record the cluster's and each GPU's readings for the 24 h history."""

from fleetd.services.fleet_ops.metrics import record_sample

NAME = "metrics_sampler"
DESCRIPTION = (
    "Stores a sample of jobs, GPU capacity and per-GPU readings for /api/v1/metrics/history"
)


def run(rt):
    """One sample; returns how many rows were written."""
    return record_sample(rt)
