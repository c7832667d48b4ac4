"""Assignments as fleetd sends them, for tests that play fleetd to a real agent."""

from fleetwire.assignment import Assignment


def assignment(task_id, command, **overrides):
    """An Assignment dict for a one-rank task at epoch 1 (the fields as docs/api.md lists them);
    checked against the wire definition unless `valid=False` (a test of the agent's refusal)."""
    valid = overrides.pop("valid", True)
    data = {"task_id": task_id, "job_id": f"job-{task_id}", "epoch": 1, "rank": 0, "num_nodes": 1,
            "command": command, "env": {}, "workdir": "", "gpus": [], "isolation": "exclusive",
            "max_runtime_seconds": None, "artifacts": []}
    data.update(overrides)
    if valid:
        Assignment.from_wire(data)
    return data
