"""An instance's scratch space has a size (scratch_bytes, GraphQL's containerDiskInGb): its node
measures what the run's working directory holds and stops a run that holds more, failed, with the
reason."""

import pytest

from agent.ports import PortAllocator
from agent.task import monitor
from fleetwire.assignment import AssignedInstance
from tests.agent.instance_support import PY, instance_assignment, kill_left_instances, port_range
from tests.agent.test_runner import make_runner  # noqa: F401 (fixture)
from tests.support.workloads import hold

FILL = "open('scratch.bin', 'wb').write(b'x' * (3 << 20))\n"  # 3 MiB in its working directory


@pytest.fixture
def runner(make_runner, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(
        monitor, "SCRATCH_EVERY_SECONDS", 0.2
    )  # look often: the test needs no 10 s wait
    low, high = port_range()
    made = make_runner("node", ports=PortAllocator(str(tmp_path / "node"), low, high))
    yield made
    made.shutdown("test over", timeout=15, stop_instances=True)
    kill_left_instances(tmp_path / "node")


def test_a_run_that_fills_its_scratch_past_its_size_is_stopped_failed_with_the_reason(
    runner, fleetd
):
    runner.submit(
        instance_assignment(
            "t-fill", [PY, "-c", FILL + hold(60)], scratch_bytes=1 << 20, restart="always"
        )
    )
    finish = fleetd.wait_finished("t-fill")
    assert finish["outcome"] == "failed", finish
    assert finish["reason"].startswith("scratch space over its size: it holds ")
    assert f"more than its {1 << 20} (scratch_bytes)" in finish["reason"]


def test_a_run_within_its_scratch_size_runs_on(runner, fleetd):
    runner.submit(
        instance_assignment(
            "t-small",
            [PY, "-c", FILL + "print('wrote', flush=True)\n" + hold(60)],
            scratch_bytes=64 << 20,
        )
    )
    fleetd.wait_for(lambda: fleetd.texts("t-small", "stdout") == ["wrote"], 30, "the write")
    used = runner.get("t-small").check_scratch()
    assert used is not None and (3 << 20) <= used < (64 << 20)
    assert "t-small" not in fleetd.finished


def test_the_wire_takes_a_scratch_size_and_refuses_a_bad_one():
    spec = {"id": "i", "name": "n", "restart": "never", "ports": [], "volume_bytes": 0}
    assert AssignedInstance.from_wire(dict(spec, scratch_bytes=10)).scratch_bytes == 10
    assert (
        AssignedInstance.from_wire(spec).scratch_bytes == 0
    )  # an older fleetd sends none: no limit
    with pytest.raises(ValueError, match="scratch_bytes"):
        AssignedInstance.from_wire(dict(spec, scratch_bytes=-1))
