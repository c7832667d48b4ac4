"""Assignments as fleetd sends them, for tests that play fleetd to a real agent."""

from fleetwire.assignment import Assignment

# Whom tests that are not about isolation run their tasks as: root, as on a fleet with
# allow_root_tasks and an admin's work (their commands are the root-only venv's Python, their files
# in root's temp dirs).
ROOT = {"source": "root", "user": "root", "uid": 0, "gid": 0}


def assignment(task_id, command, **overrides):
    """An Assignment dict for a one-rank task at epoch 1 (the fields as docs/api.md lists them);
    checked against the wire definition unless `valid=False` (a test of the agent's refusal)."""
    valid = overrides.pop("valid", True)
    data = {
        "task_id": task_id,
        "job_id": f"job-{task_id}",
        "epoch": 1,
        "rank": 0,
        "num_nodes": 1,
        "command": command,
        "env": {},
        "workdir": "",
        "gpus": [],
        "isolation": "exclusive",
        "max_runtime_seconds": None,
        "artifacts": [],
        "run_as": ROOT,
    }
    data.update(overrides)
    if valid:
        Assignment.from_wire(data)
    return data
