"""Maintenance: drop metric samples past retention, and old jobs when job_retention_seconds is
set."""

from fleetd.services.fleet_ops.retention import collect_garbage

NAME = "gc"  # the name operators know it by (GET /api/v1/admin/tasks)
DESCRIPTION = (
    "Deletes metric samples past retention and jobs older than job_retention_seconds (if set)"
)


def run(rt):
    """One collection; returns what was removed."""
    keep = rt.settings.job_retention_seconds
    return collect_garbage(rt, older_than_seconds=keep, delete_jobs=keep > 0)
