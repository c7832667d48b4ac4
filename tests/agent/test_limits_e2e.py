"""GPU limits end to end: a real `fleetd serve`, a real `fleet-agent run` on a fake 4xL4 host, real
tasks.

The test plays the GPU: it rewrites the agent's shape file (the fake NVML reloads it) to say
that the task's process now uses N bytes on its GPU, or that the GPU raised an XID.
"""

import json
import signal
import subprocess
import sys
import time

import pytest

from agent.state import State
from tests.agent.conftest import Http, rewrite_shape, wait_until
from tests.agent.fakefleetd import FakeFleetd
from tests.agent.test_jobs_e2e import FAST, job_logs, submit, wait_job
from tests.support.workloads import WAIT_FOR_GATE

pytestmark = pytest.mark.integration

PY = sys.executable
GIB = 1024**3
MIB = 1024**2
SLEEP_AND_SAY_PID = (
    "import os, threading\nprint(os.getpid(), flush=True)\nthreading.Event().wait(600)\n"
)


@pytest.fixture
def node(server_factory, admin, agent_factory):
    """fleetd with one ready agent (4 fake L4s): (http, agent)."""
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()
    agent = agent_factory("gpu-host", shape="l4_x4", extra={"tasks_kill_grace_seconds": 2.0})
    agent.join(join["token"], server.url)
    agent.start()
    wait_until(
        lambda: (
            http("GET", f"/api/v1/nodes/{agent.node()['node_id']}", expect=200).json()["status"]
            == "ready"
        ),
        timeout=60,
        message="the agent ready",
    )
    return http, agent


def running_task(http, job_id):
    """(pid of the task's leader from its first log line, its GPU uuid)."""
    lines = wait_until(
        lambda: job_logs(http, job_id), timeout=60, message="the task's pid in its log"
    )
    job = http("GET", f"/api/v1/jobs/{job_id}", expect=200).json()
    return int(lines[0]["text"]), job["tasks"][0]["gpus"][0]


def gpu_index(agent, uuid):
    gpus = json.loads(agent.shape.read_text())["gpus"]
    return next(i for i, g in enumerate(gpus) if g["uuid"] == uuid)


def set_process(agent, uuid, pid, used):
    def change(shape):
        gpu = shape["gpus"][gpu_index(agent, uuid)]
        gpu["processes"] = [p for p in gpu.get("processes", []) if p["pid"] != pid] + [
            {"pid": pid, "used_bytes": used}
        ]

    rewrite_shape(agent.shape, change)


def test_a_shared_task_over_its_vram_limit_fails_with_the_reason_in_fleetds_result_and_events(node):
    http, agent = node
    limit = 2 * GIB
    job = submit(
        http,
        [PY, "-c", SLEEP_AND_SAY_PID],
        name="vram-hog",
        resources={"gpus": 0.5, "gpu_memory_bytes": limit},
        isolation="shared",
        retry={"max_attempts": 1, "on": []},
    )
    pid, uuid = running_task(http, job["id"])
    set_process(agent, uuid, pid, limit - 200 * MIB)  # within: nothing happens
    agent.wait_for_line(r"limits watchdog: every")
    local = Http(agent.local_url, agent.local_token())
    wait_until(
        lambda: any(
            r["used_memory_bytes"] == limit - 200 * MIB
            for r in local("GET", "/api/v1/limiter", expect=200).json()["data"]
        ),
        message="the watchdog to see the usage within the limit",
    )
    crossed_at = time.time()
    set_process(agent, uuid, pid, limit + 600 * MIB)  # crosses the limit
    done = wait_job(http, job["id"])
    assert done["state"] == "failed", done
    [task] = http("GET", f"/api/v1/jobs/{job['id']}/result", expect=200).json()["tasks"]
    assert task["outcome"] == "failed"
    assert task["reason"].startswith(f"gpu_memory_limit_exceeded: GPU {uuid} limit {limit} bytes")
    assert f"used {limit + 600 * MIB} bytes" in task["reason"]
    events = http("GET", f"/api/v1/jobs/{job['id']}/events", expect=200).json()
    items = events["items"] if isinstance(events, dict) else events
    assert any(
        e["kind"] == "task.state"
        and e["to_status"] == "failed"
        and "gpu_memory_limit_exceeded" in e["reason"]
        and uuid in e["reason"]
        for e in items
    ), items
    # The watchdog acted on the first poll that saw the usage over the limit.
    seen = agent.wait_for_line(
        r"limits: task \S+ stopped at poll (\d+) \(last within limit at poll (\d+)\)"
    )
    assert int(seen.group(1)) == int(seen.group(2)) + 1
    violations = local("GET", "/api/v1/limiter/node", expect=200).json()["data"]["violations"]
    assert [(v["kind"], v["gpu_uuid"], v["used"], v["limit"]) for v in violations] == [
        ("gpu_memory_limit_exceeded", uuid, limit + 600 * MIB, limit)
    ]
    # A figure for the notes, not an assertion: from the shape file's rewrite to the watchdog's
    # detection.
    print(
        f"\n{seen.group(0)}; crossing -> detection {violations[0]['detected_at'] - crossed_at:.3f}s"
    )


def test_a_task_within_its_vram_limit_succeeds(node, gate):
    http, agent = node
    limit = GIB
    code = "import os\nprint(os.getpid(), flush=True)\n" + WAIT_FOR_GATE
    job = submit(
        http,
        [PY, "-c", code, gate.path],
        name="polite",
        resources={"gpus": 0.5, "gpu_memory_bytes": limit},
        isolation="shared",
    )
    pid, uuid = running_task(http, job["id"])
    set_process(agent, uuid, pid, limit)
    local = Http(agent.local_url, agent.local_token())
    worker = wait_until(
        lambda: [
            w
            for w in local("GET", "/api/v1/workers", expect=200).json()["data"]
            if (w["usage"].get(uuid) or {}).get("used_memory_bytes") == limit
        ],
        message="the watchdog to see the usage",
    )[0]
    assert worker["env"]["CUDA_VISIBLE_DEVICES"] == worker["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert worker["limits"]["gpus"][0]["memory_limit_bytes"] == limit
    assert worker["usage"][uuid]["processes"][0]["pid"] == pid
    gate.open()
    assert wait_job(http, job["id"])["state"] == "succeeded"


def test_an_xid_on_a_tasks_gpu_fails_the_task_and_the_health_policy_takes_the_node_out(node):
    http, agent = node
    job = submit(
        http,
        [PY, "-c", SLEEP_AND_SAY_PID],
        name="on-a-bad-gpu",
        retry={"max_attempts": 1, "on": []},
    )
    _pid, uuid = running_task(http, job["id"])
    index = gpu_index(agent, uuid)
    rewrite_shape(agent.shape, lambda shape: shape["gpus"][index].update(xid_events=[79]))
    done = wait_job(http, job["id"])
    assert done["state"] == "failed"
    [task] = http("GET", f"/api/v1/jobs/{job['id']}/result", expect=200).json()["tasks"]
    assert task["reason"].startswith(f"gpu_unhealthy: GPU {uuid} is unhealthy: critical XID 79")

    # The fleet's health policy (on by default) takes the whole node out, saying why; its GPUs are
    # then blocked in the cluster status, the bad one among them.
    node_id = agent.node()["node_id"]

    def taken_out():
        view = http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()
        return view if view["status"] in ("cordoned", "draining", "drained") else None

    node_view = wait_until(taken_out, timeout=30, message="the health policy to take the node out")
    events = http("GET", f"/api/v1/nodes/{node_id}/events", expect=200).json()["items"]
    assert any(
        e["kind"] == "node.health" and e["actor"] == "fleetd" and "critical XID 79" in e["reason"]
        for e in events
    ), events
    [gpu] = [g for g in node_view["gpus"] if g["uuid"] == uuid]
    assert gpu["healthy"] is False and "critical XID 79" in gpu["health_reason"]

    # The failed task's GPU counts as held until the node stops reporting its process.
    def all_blocked():
        gpu_status = http("GET", "/api/v1/cluster/status", expect=200).json()["gpu"]
        return (
            gpu_status
            if gpu_status["blocked"] == len(node_view["gpus"]) and gpu_status["free"] == 0
            else None
        )

    wait_until(
        all_blocked, timeout=30, message="every GPU of the node blocked in the cluster status"
    )


@pytest.mark.parametrize("policy", ["report", "kill"])
def test_a_foreign_gpu_process_is_in_the_heartbeat_and_local_api_and_killed_only_when_configured(
    agent_factory, policy
):
    fleetd = FakeFleetd().start()
    stranger = subprocess.Popen([PY, "-c", "import threading\nthreading.Event().wait(600)\n"])
    try:
        agent = agent_factory(
            "foreign",
            shape="l4_x4",
            server_url=fleetd.url,
            extra={"heartbeat_interval_seconds": 0.5, "limits_foreign_processes": policy},
        )
        State(str(agent.state_dir)).save_enrolment(
            {
                "node_id": "node-foreign",
                "fleet": "lab",
                "server_url": fleetd.url,
                "machine_id": "foreign",
            },
            "fln_test",
        )
        rewrite_shape(
            agent.shape,
            lambda shape: shape["gpus"][2].update(
                processes=[{"pid": stranger.pid, "used_bytes": 5 * GIB}]
            ),
        )
        agent.start()
        uuid = json.loads(agent.shape.read_text())["gpus"][2]["uuid"]

        def reported():
            with fleetd.cond:
                beats = list(fleetd.heartbeats)
            return [
                p
                for hb in beats
                for p in (hb.get("metrics") or {}).get("foreign_processes", [])
                if p["pid"] == stranger.pid
            ]

        [first, *_rest] = wait_until(reported, message="the foreign process in a heartbeat")
        assert (first["gpu_uuid"], first["used_memory_bytes"]) == (uuid, 5 * GIB)
        local = Http(agent.local_url, agent.local_token())
        device = local("GET", f"/api/v1/devices/{uuid}", expect=200).json()["data"]
        if policy == "kill":
            assert any(p["action"].startswith("killed") for p in reported())
            assert stranger.wait(15) in (-signal.SIGTERM, -signal.SIGKILL)
            agent.wait_for_line(rf"foreign process {stranger.pid} .* killing it")
        else:
            assert first["action"] == "reported"
            assert [p["pid"] for p in device["foreign_processes"]] == [stranger.pid]
            assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait(10)
        fleetd.stop()
