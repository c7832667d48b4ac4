"""A task on MIG devices (issue 50): real task processes under a real Runner against the stand-in
fleetd, on the fake NVML's a100_mig_x2 (3x 2g.10gb on GPU 0, 1x 7g.40gb on GPU 1). The task sees
only its MIG devices (CUDA_VISIBLE_DEVICES=MIG-...), and the watchdog sets no software limit on
them: their processes show on the parent GPU, whose memory the slice does not share."""

import json
import sys

import pytest

from agent.task.assignment import task_env
from fleetwire.assignment import Assignment
from tests.agent.conftest import shape_path, wait_until
from tests.agent.test_limits import host  # noqa: F401 (the fixture, on another shape)
from tests.support import wire

PY = sys.executable
GIB = 1024**3
SHAPE = json.loads(shape_path("a100_mig_x2").read_text())
PARENT = [g["uuid"] for g in SHAPE["gpus"]]
MIG = [[d["uuid"] for d in g["mig_devices"]] for g in SHAPE["gpus"]]
SLEEPER = [PY, "-c", "import threading\nthreading.Event().wait(600)\n"]


@pytest.fixture
def mig_host(host):
    """The fake MIG host: (runner, limits); tests poll the watchdog."""
    runner, limits, _devices = host(shape="a100_mig_x2")
    return runner, limits


def mig_grant(gpu, slot, **extra):
    return {"uuid": PARENT[gpu], "mig_device": MIG[gpu][slot], **extra}


def test_a_mig_task_sees_only_its_mig_devices_in_cuda_and_nvidia_visible_devices():
    a = Assignment.from_wire(
        wire.assignment(
            "t-mig",
            ["true"],
            gpus=[mig_grant(0, 0), mig_grant(0, 2)],
            env={"CUDA_VISIBLE_DEVICES": "all"},
        )
    )
    env, injected = task_env(a, "127.0.0.1", 1234, environ={})
    expected = f"{MIG[0][0]},{MIG[0][2]}"
    assert env["CUDA_VISIBLE_DEVICES"] == injected["CUDA_VISIBLE_DEVICES"] == expected
    assert env["NVIDIA_VISIBLE_DEVICES"] == expected
    assert env["FLEET_GPUS_PER_NODE"] == "2"


def test_an_assignment_with_a_mig_device_that_is_not_a_mig_uuid_is_refused():
    for bad in ("GPU-1234", "MIG-", 7, "MIG-a b"):
        data = wire.assignment("t-bad", ["true"], valid=False, gpus=[mig_grant(0, 0)])
        data["gpus"][0]["mig_device"] = bad
        with pytest.raises(ValueError, match="mig_device"):
            Assignment.from_wire(data)


def test_a_mig_task_runs_with_its_mig_uuid_and_is_not_killed_for_the_parent_gpus_memory(
    mig_host, fleetd, fake_nvml, tmp_path
):
    runner, limits = mig_host
    out = tmp_path / "env.json"
    code = (
        "import json, os, sys, threading\n"
        "keys = ('CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES')\n"
        "json.dump({k: os.environ[k] for k in keys}, open(sys.argv[1] + '.tmp', 'w'))\n"
        "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
        "threading.Event().wait(600)\n"
    )
    # A stale grant that also carries a software limit: a MIG device is never held to one.
    grants = [mig_grant(0, 1, memory_limit_bytes=GIB, compute_percent=10.0)]
    runner.submit(wire.assignment("t-mig", [PY, "-c", code, str(out)], gpus=grants))
    fleetd.wait_for(lambda: "t-mig" in fleetd.started, message="t-mig started")
    wait_until(out.exists, timeout=30, message="the task wrote its environment")
    seen = json.loads(out.read_text())
    assert seen == {"CUDA_VISIBLE_DEVICES": MIG[0][1], "NVIDIA_VISIBLE_DEVICES": MIG[0][1]}
    other = runner.submit(wire.assignment("t-mig2", SLEEPER, gpus=[mig_grant(0, 2)]))
    fleetd.wait_for(lambda: "t-mig2" in fleetd.started, message="t-mig2 started")
    # NVML shows both slices' processes on the parent GPU, far over the stale 1 GiB "limit".
    fake_nvml.add_process(0, runner.get("t-mig").proc.pid, 9 * GIB)
    fake_nvml.add_process(0, runner.get(other.assignment.task_id).proc.pid, 8 * GIB)
    for _ in range(3):
        assert limits.poll_once() == []
    worker = next(w for w in limits.workers.all() if w.task_id == "t-mig")
    report = worker.gpu_usage[PARENT[0]]
    assert report["used_memory_bytes"] == 9 * GIB
    assert report["memory_limit_bytes"] is None and not report["over_memory_limit"]
    assert report["compute_percent"] is None and "not_assigned" not in report
    described = runner.get("t-mig").task_limits.describe()["gpus"]
    assert described[0]["memory_enforcement"] == f"MIG hardware isolation ({MIG[0][1]})"
    assert "memory_limit_bytes" not in described[0]
    assert "t-mig" not in fleetd.finished and "t-mig2" not in fleetd.finished


def test_mps_isolation_on_a_mig_device_is_refused_with_the_reason(mig_host, fleetd):
    runner, _limits = mig_host
    runner.submit(wire.assignment("t-mps", SLEEPER, gpus=[mig_grant(1, 0)], isolation="mps"))
    finish = fleetd.wait_finished("t-mps")
    assert finish["outcome"] == "failed"
    assert finish["reason"].startswith("mps isolation is not available on a MIG device")
