"""The messages of the agent wire read back equal from what their own side built (fleetwire)."""

import pytest

from fleetwire.assignment import AssignedInstance, Assignment


def _assignment(**changes):
    fields = dict(task_id="t-1", job_id="j-1", epoch=3, attempt=2, rank=1, num_nodes=2, command=["python", "-c", "1"],
                  env={"A": "1"}, workdir="src", gpus=[{"uuid": "GPU-1", "memory_limit_bytes": 1 << 30}],
                  isolation="shared", max_runtime_seconds=60.0, artifacts=[{"sha256": "a" * 64, "path": "x"}],
                  priority_class="spot", bid=1.5, cpus=2.0, memory_bytes=1 << 30, memory_default=False, pids=64,
                  task_path="/usr/bin:/bin", run_as={"source": "dynamic", "user": None, "uid": 61184, "gid": 61184})
    return Assignment(**dict(fields, **changes))


@pytest.mark.parametrize("instance", [None, AssignedInstance(
    id="i-1", name="web", restart="always", ports=((8000, "http"), (22, "tcp")), volume_bytes=1 << 30,
    volume_mount_path="/workspace", image="localhost/app:1", idle_below_percent=5.0, idle_for_seconds=600.0,
    scratch_bytes=1 << 20, runtime_args=("--init", "--shm-size=1g"))])
def test_an_assignment_reads_back_equal_from_its_wire_form(instance):
    sent = _assignment(instance=instance, command=[] if instance else ["python", "-c", "1"])
    assert Assignment.from_wire(sent.to_wire()) == sent


def test_an_assignment_of_an_older_fleetd_without_attempt_is_its_first():
    wire = _assignment().to_wire()
    del wire["attempt"]
    assert Assignment.from_wire(wire).attempt == 1
    with pytest.raises(ValueError, match="attempt"):
        Assignment.from_wire(dict(wire, attempt=0))
