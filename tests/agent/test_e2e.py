"""End to end with real processes: `fleetd serve` and `fleet-agent run` with fake device
backends."""

import json
import signal
import socket
import subprocess
import time

import pytest
import requests

from tests.agent.conftest import Http, rewrite_shape, shape_path, wait_until
from tests.support.server import FleetdProcess

pytestmark = pytest.mark.integration

FAST = {
    "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1",
    "FLEETD_NODE_TTL_SECONDS": "3",
    "FLEETD_NODE_GRACE_SECONDS": "1",
    "FLEETD_LIVENESS_SWEEP_SECONDS": "0.5",
    "FLEETD_FAILOVER_GRACE_SECONDS": "2",
}
OUTAGE_SECONDS = 20


def shape_gpus(name):
    return {g["uuid"]: g["name"] for g in json.loads(shape_path(name).read_text())["gpus"]}


def setup_fleet(url, admin, uses=10):
    http = Http(url, admin)
    http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
    join = http(
        "POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": uses}
    ).json()
    return http, join


def node_of(http, agent):
    return http("GET", f"/api/v1/nodes/{agent.node()['node_id']}", expect=200).json()


def wait_status(http, agent, status, timeout=60):
    return wait_until(
        lambda: (lambda n: n if n["status"] == status else None)(node_of(http, agent)),
        timeout=timeout,
        interval=0.2,
        message=f"node {agent.name} to become {status}",
    )


def local_get(agent, path, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(agent.local_url + path, headers=headers, timeout=10)


def test_two_agents_become_ready_and_a_killed_one_is_lost_then_returns_as_the_same_node(
    server_factory, admin, agent_factory
):
    server = server_factory(**FAST)
    http, join = setup_fleet(server.url, admin)
    hopper = agent_factory("hopper", shape="h100_x8")
    ampere = agent_factory("ampere", shape="a100_mig_x2")
    for agent in (hopper, ampere):
        agent.join(join["token"], server.url)
        agent.start()
    for agent, shape in ((hopper, "h100_x8"), (ampere, "a100_mig_x2")):
        node = wait_status(http, agent, "ready")
        assert {g["uuid"]: g["model"] for g in node["gpus"]} == shape_gpus(shape)
        assert node["labels"] == {"simulated": "true"}
        assert node["resources"]["cpu_count"] >= 1
    assert {g["mig_mode"] for g in node_of(http, ampere)["gpus"]} == {"enabled"}
    node_id = hopper.node()["node_id"]

    hopper.signal(signal.SIGKILL)
    hopper.wait()
    lost = wait_status(http, hopper, "lost")
    assert "no heartbeat" in lost["status_reason"]
    assert node_of(http, ampere)["status"] == "ready"

    hopper.start()
    wait_status(http, hopper, "ready")
    assert hopper.node()["node_id"] == node_id
    listed = http("GET", "/api/v1/nodes", expect=200).json()["items"]
    assert sorted(n["id"] for n in listed) == sorted([node_id, ampere.node()["node_id"]])
    tokens = http("GET", "/api/v1/fleets/lab/join-tokens", expect=200).json()["items"]
    assert tokens[0]["uses"] == 2  # the restart did not enrol again


def test_agents_keep_retrying_through_a_fleetd_outage_and_recover_without_re_enrolling(
    tmp_path, admin, data_dir, agent_factory
):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = FleetdProcess(
        data_dir, FAST, bind=f"127.0.0.1:{port}"
    ).start()  # the same URL after a restart
    try:
        http, join = setup_fleet(server.url, admin)
        agents = [
            agent_factory(f"host-{i}", shape=shape) for i, shape in enumerate(("h100_x8", "l4_x4"))
        ]
        for agent in agents:
            agent.join(join["token"], server.url)
            agent.start()
        for agent in agents:
            wait_status(http, agent, "ready")
        sessions = [(a.state_dir / "session.token").read_text() for a in agents]

        server.signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
        stopped_at = time.monotonic()
        for agent in agents:
            agent.wait_for_line(r"fleetd unreachable \(attempt 3\)", timeout=OUTAGE_SECONDS + 30)
        # The outage lasts as long as the issue asks, and the agents keep running through it.
        wait_until(
            lambda: (
                time.monotonic() - stopped_at >= OUTAGE_SECONDS
                or any(a.proc.poll() is not None for a in agents)
            ),
            timeout=OUTAGE_SECONDS + 5,
            interval=0.5,
            message="the outage to last",
        )
        for agent in agents:
            assert agent.proc.poll() is None, agent.log

        server.start()
        for agent in agents:
            agent.wait_for_line(r"heartbeat restored after \d+ failed attempt", timeout=60)
            wait_status(http, agent, "ready")
        assert [(a.state_dir / "session.token").read_text() for a in agents] == sessions
        tokens = http("GET", "/api/v1/fleets/lab/join-tokens", expect=200).json()["items"]
        assert tokens[0]["uses"] == 2
    finally:
        server.kill()


def test_readyz_is_503_before_enrolment_and_ready_after_join(server_factory, admin, agent_factory):
    server = server_factory(**FAST)
    http, join = setup_fleet(server.url, admin)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        listen = f"127.0.0.1:{probe.getsockname()[1]}"
    agent = agent_factory(
        "late", shape="l4_x4", server_url=server.url, env={"FLEET_AGENT_LOCAL_API_LISTEN": listen}
    )
    agent.start()
    agent.wait_for_line(r"not enrolled yet")
    resp = local_get(agent, "/readyz", agent.local_token())  # the details need the token
    assert resp.status_code == 503
    assert resp.json()["error"]["details"]["enrolled"] is False
    assert "details" not in local_get(agent, "/readyz").json()["error"]
    assert local_get(agent, "/healthz").status_code == 200
    assert local_get(agent, "/api/v1/devices").status_code == 401

    result = agent.join(join["token"], server.url)
    assert "enrolled as node" in result.stdout
    ready = wait_until(
        lambda: (lambda r: r if r.status_code == 200 else None)(
            local_get(agent, "/readyz", agent.local_token())
        ),
        timeout=30,
        message="readyz 200",
    )
    assert local_get(agent, "/readyz").json() == {"data": {"status": "ready"}}
    assert ready.json()["data"]["node_id"] == agent.node()["node_id"]
    devices = local_get(agent, "/api/v1/devices", agent.local_token()).json()["data"]
    assert len(devices) == 4
    status = subprocess.run(
        agent.cmd("status", "--json"), capture_output=True, text=True, timeout=60, env=agent.env
    )
    report = json.loads(status.stdout)
    assert report["node"]["node_id"] == agent.node()["node_id"] and report["session"] == "stored"
    assert report["agent"]["running"] and report["agent"]["ready"]
    assert report["devices"]["source"] == "running agent" and len(report["devices"]["gpus"]) == 4
    again = agent.join(join["token"], server.url)
    assert "already enrolled" in again.stdout
    # No secret ever reaches the logs.
    secrets = [
        join["token"],
        (agent.state_dir / "session.token").read_text().strip(),
        agent.local_token(),
    ]
    for text in (agent.log, result.stdout + result.stderr, server.log):
        for secret in secrets:
            assert secret.split(".")[-1] not in text


def test_gpu_health_change_reaches_fleetd_at_the_next_heartbeat(
    server_factory, admin, agent_factory
):
    server = server_factory(**FAST)
    http, join = setup_fleet(server.url, admin)
    agent = agent_factory("ecc", shape="h100_x8")
    agent.join(join["token"], server.url)
    agent.start()
    wait_status(http, agent, "ready")
    rewrite_shape(agent.shape, lambda d: d["gpus"][6].update(remapped_rows={"pending": True}))

    def gpu6_unhealthy():
        gpu = next(g for g in node_of(http, agent)["gpus"] if g["index"] == 6)
        return gpu if not gpu["healthy"] else None

    gpu = wait_until(gpu6_unhealthy, timeout=30, message="GPU 6 unhealthy in fleetd")
    assert gpu["health_reason"] == "remapped rows pending: GPU reset required"
    events = http("GET", f"/api/v1/nodes/{agent.node()['node_id']}/events", expect=200).json()[
        "items"
    ]
    assert any(e["kind"] == "node.gpus" and "unhealthy" in (e["reason"] or "") for e in events)


def test_revoked_node_stops_the_agent_with_exit_code_3(server_factory, admin, agent_factory):
    server = server_factory(**FAST)
    http, join = setup_fleet(server.url, admin)
    agent = agent_factory("rogue", shape="l4_x4")
    agent.join(join["token"], server.url)
    agent.start()
    wait_status(http, agent, "ready")
    http("POST", f"/api/v1/nodes/{agent.node()['node_id']}/revoke", expect=200)
    assert agent.wait(timeout=30) == 3
    assert "was revoked by fleetd" in agent.log or "rejected this node's session" in agent.log


def test_sigterm_stops_cleanly_and_deregister_on_stop_leaves_the_fleet(
    server_factory, admin, agent_factory
):
    server = server_factory(**FAST)
    http, join = setup_fleet(server.url, admin)
    agent = agent_factory("leaver", shape="l4_x4")
    agent.join(join["token"], server.url)
    agent.start("--deregister-on-stop")
    wait_status(http, agent, "ready")
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    node = node_of(http, agent)
    assert node["status"] == "lost" and "deregistered" in node["status_reason"]
    assert "agent stopped (exit 0)" in agent.log


def test_sd_notify_ready_and_watchdog_under_systemd_type_notify(tmp_path, agent_factory):
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(30)
        agent = agent_factory("notify", shape="l4_x4", server_url="http://127.0.0.1:9")
        agent.start(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
        seen = set()
        for _ in range(50):
            seen.update(sock.recv(4096).decode().splitlines())
            if "READY=1" in seen and "WATCHDOG=1" in seen:
                break
        assert {"READY=1", "WATCHDOG=1", f"MAINPID={agent.proc.pid}"} <= seen
        agent.signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0


def test_non_loopback_local_api_without_tls_is_refused_at_start(agent_factory):
    agent = agent_factory("exposed", shape="l4_x4", server_url="http://127.0.0.1:9")
    agent.start(env={"FLEET_AGENT_LOCAL_API_LISTEN": "0.0.0.0:0"})
    assert agent.wait(timeout=30) == 2
    assert "not a loopback address" in agent.log
