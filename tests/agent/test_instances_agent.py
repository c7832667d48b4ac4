"""`fleet-agent run` processes with instances, against the stand-in fleetd: an instance outlives the
agent's stop and its SIGKILL and the next agent takes it back unreported; the heartbeat carries the
instances' figures, the volumes and the node's capabilities, and its reply deletes volumes; an idle
instance is stopped (GPU utilisation from the fake NVML's shape file)."""

import json
import signal

import pytest

from agent.procfs import read_proc, wait_gone
from agent.state import State
from tests.agent.conftest import rewrite_shape, wait_until
from tests.agent.instance_support import (
    HTTP_SERVER,
    PY,
    http_get,
    instance_assignment,
    kill_left_instances,
    port_range,
)
from tests.support.workloads import hold

pytestmark = pytest.mark.integration

GPU = "GPU-14000024-9e8d-4c7b-a6f5-000000000000"  # index 0 of the l4_x4 shape


@pytest.fixture
def instance_agent(agent_factory, fleetd):
    """An enrolled `fleet-agent run` with a port range of its own and no container runtime."""
    low, high = port_range()

    def make(name="host"):
        agent = agent_factory(
            name,
            shape="l4_x4",
            server_url=fleetd.url,
            extra={
                "heartbeat_interval_seconds": 0.5,
                "tasks_kill_grace_seconds": 2.0,
                "ports_range": f"{low}-{high}",
                "containers_command": "none",
            },
        )
        State(str(agent.state_dir)).save_enrolment(
            {
                "node_id": f"node-{name}",
                "fleet": "lab",
                "server_url": fleetd.url,
                "machine_id": name,
            },
            "fln_test",
        )
        made.append(agent)
        return agent

    made = []
    make.low = low
    yield make
    for agent in made:  # instances outlive their agent by design: what a failed test left goes here
        agent.kill()
        kill_left_instances(agent.state_dir)


def _instances(fleetd, task_id, since=0):
    return [
        entry
        for hb in fleetd.heartbeats[since:]
        for entry in hb.get("instances", [])
        if entry["task_id"] == task_id
    ]


def test_an_instance_outlives_the_agents_stop_and_its_sigkill_and_is_taken_back_unreported(
    instance_agent, fleetd, tmp_path
):
    agent = instance_agent().start()
    volume = agent.state_dir / "volumes" / "inst-1"
    fleetd.assign(
        instance_assignment(
            "t-web",
            [PY, "-c", HTTP_SERVER],
            restart="always",
            ports=[{"port": 8000, "protocol": "http"}],
        )
    )
    pid = fleetd.wait_for(lambda: fleetd.started.get("t-web"), message="the start")["pid"]
    volume.joinpath("index.html").write_text("served")
    url = f"http://127.0.0.1:{instance_agent.low}/"
    assert wait_until(lambda: http_get(url), message="the instance's URL") == (200, "served")

    for stop in (signal.SIGTERM, signal.SIGKILL):
        agent.signal(stop)
        assert agent.wait(timeout=60) == (0 if stop == signal.SIGTERM else -signal.SIGKILL), (
            agent.log
        )
        assert read_proc(pid) is not None and http_get(url) == (200, "served")
        heard = len(fleetd.heartbeats)
        agent.start()
        agent.wait_for_line(r"task t-web/1: an instance run \(instance inst-1\) left from before")
        agent.wait_for_line(r"task t-web/1: took back pid")
        fleetd.wait_for(
            lambda: _instances(fleetd, "t-web", heard),
            message="the taken-back instance in a heartbeat",
        )
        assert "t-web" not in fleetd.finished
    entry = _instances(fleetd, "t-web")[-1]
    assert entry["epoch"] == 1 and entry["restarts"] == 0 and entry["uptime_seconds"] > 0
    assert fleetd.texts("t-web", "stdout") == [
        f"serving on {instance_agent.low}"
    ]  # shipped once, not again
    fleetd.cancel.add("t-web")
    finish = fleetd.wait_finished("t-web")
    assert finish["outcome"] == "cancelled" and finish["reason"].startswith("cancelled by fleetd")
    assert wait_gone([pid], 10) and http_get(url) is None


def test_heartbeats_carry_volumes_and_capabilities_and_the_reply_deletes_a_volume(
    instance_agent, fleetd
):
    agent = instance_agent().start()
    fleetd.assign(
        instance_assignment(
            "t-once",
            [PY, "-c", "print('done')"],
            instance_id="inst-gone",
            ports=[{"port": 8000, "protocol": "tcp"}],
        )
    )
    assert fleetd.wait_finished("t-once")["outcome"] == "succeeded"
    fleetd.wait_for(
        lambda: fleetd.heartbeats and fleetd.heartbeats[-1]["volumes"] == ["inst-gone"],
        message="the volume in a heartbeat",
    )
    capabilities = fleetd.heartbeats[0]["capabilities"]
    assert (capabilities["container_runtime"], capabilities["containers"]) == (
        None,
        "unavailable: no container runtime (neither podman nor docker found)",
    )
    assert not [
        hb for hb in fleetd.heartbeats[1:] if "capabilities" in hb
    ]  # sent once: it did not change
    ports = agent.state_dir / "ports.json"
    assert json.loads(ports.read_text()) == {"inst-gone": {"8000": instance_agent.low}}
    fleetd.delete_volumes = ["inst-gone"]
    fleetd.wait_for(
        lambda: fleetd.heartbeats[-1]["volumes"] == [], message="the volume gone from the heartbeat"
    )
    assert not (agent.state_dir / "volumes" / "inst-gone").exists()
    assert json.loads(ports.read_text()) == {}
    agent.wait_for_line(r"volume inst-gone deleted")


def test_an_instance_idle_on_its_gpus_for_long_enough_is_stopped_and_says_so(
    instance_agent, fleetd
):
    agent = instance_agent()
    rewrite_shape(
        agent.shape,
        lambda shape: shape["gpus"][0].update(
            utilization_percent=60, memory_utilization_percent=30
        ),
    )
    agent.start()
    fleetd.assign(
        instance_assignment(
            "t-idle",
            [PY, "-c", hold(300)],
            restart="always",
            gpus=[{"uuid": GPU}],
            idle_stop={"gpu_util_below_percent": 5, "for_seconds": 2},
        )
    )
    fleetd.wait_for(lambda: fleetd.started.get("t-idle"), message="the start")
    busy = fleetd.wait_for(lambda: _instances(fleetd, "t-idle"), message="the instance's figures")[
        -1
    ]
    assert busy["gpus"] == [{"uuid": GPU, "gpu_util_percent": 60, "memory_util_percent": 30}]
    heard = len(fleetd.heartbeats)
    fleetd.wait_for(
        lambda: len(fleetd.heartbeats) >= heard + 6, message="3 s of heartbeats while busy"
    )
    assert "t-idle" not in fleetd.finished  # busy: never idle, however long
    rewrite_shape(agent.shape, lambda shape: shape["gpus"][0].update(utilization_percent=2))
    finish = fleetd.wait_finished("t-idle", timeout=30)
    assert finish["outcome"] == "cancelled" and finish["idle"] is True
    assert finish["reason"].startswith("idle: GPU utilisation below 5% on every GPU for 2s")


def test_a_revoked_node_stops_its_instances_before_the_agent_exits(instance_agent, fleetd):
    agent = instance_agent().start()
    fleetd.assign(instance_assignment("t-rev", [PY, "-c", hold(300)], restart="always"))
    pid = fleetd.wait_for(lambda: fleetd.started.get("t-rev"), message="the start")["pid"]
    fleetd.revoked = True
    assert agent.wait(timeout=60) == 3
    assert wait_gone([pid], 10)
    finish = fleetd.wait_finished("t-rev")
    assert (
        finish["outcome"] == "cancelled"
        and finish["reason"].startswith("node revoked")
        and "lost" not in finish
    )
    assert (
        agent.state_dir / "volumes" / "inst-1"
    ).is_dir()  # only fleetd's delete_volumes removes it
