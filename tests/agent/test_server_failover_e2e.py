"""A real `fleet-agent run` given several fleetd URLs: it fails over between them for heartbeats,
the acquire long poll, start and finish reports and log shipping.

Against two stand-in fleetds (one goes down, then the other); against a real `fleetd serve` behind a
dead URL (join and a job); and against two real replicas on a real PostgreSQL, the one the agent
uses killed with SIGKILL.
"""

import json
import socket
import subprocess
import sys

import pytest

from agent.state import State
from tests.agent.conftest import Http, wait_until
from tests.integration.conftest import postgres_url  # noqa: F401 - the fixture
from tests.integration.test_replicas import cluster, health, replica_db  # noqa: F401 - the fixtures
from tests.support import wire
from tests.support.workloads import GATED

pytestmark = pytest.mark.integration

PY = sys.executable
FAST = {
    "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1",
    "FLEETD_NODE_TTL_SECONDS": "3",
    "FLEETD_NODE_GRACE_SECONDS": "1",
    "FLEETD_LIVENESS_SWEEP_SECONDS": "0.5",
    "FLEETD_FAILOVER_GRACE_SECONDS": "2",
    "FLEETD_SCHEDULER_INTERVAL_SECONDS": "0.5",
}


def closed_port_url():
    """A loopback URL nothing listens on (connection refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def fixed_listen():
    """A loopback address for the local API, so that `fleet-agent status` with the same config finds
    it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return {"FLEET_AGENT_LOCAL_API_LISTEN": f"127.0.0.1:{probe.getsockname()[1]}"}


assignment = wire.assignment


def agent_status(agent, as_json=True):
    result = subprocess.run(
        agent.cmd("status", *(["--json"] if as_json else [])),
        capture_output=True,
        text=True,
        timeout=60,
        env=agent.env,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout) if as_json else result.stdout


def test_the_agent_moves_every_call_to_the_fleetd_that_answers(agent_factory, fakes, gate):
    first, second = fakes
    urls = [first.url, second.url]
    first.down.add("all")  # a replica that answers 503 to everything from the start
    agent = agent_factory(
        "multi",
        shape="l4_x4",
        server_url=urls,
        extra={"heartbeat_interval_seconds": 0.5},
        env=fixed_listen(),
    )
    State(str(agent.state_dir)).save_enrolment(
        {
            "node_id": "node-multi",
            "fleet": "lab",
            "server_url": urls[0],
            "server_urls": urls,
            "machine_id": "multi",
        },
        "fln_test",
    )
    agent.start()
    second.wait_for(lambda: second.heartbeats, message="heartbeats on the second fleetd")
    agent.wait_for_line(rf"fleetd at {first.url} failed .*503.*; switching to {second.url}")
    status = agent_status(agent)
    assert status["server_url_in_use"] == second.url and status["server_urls"] == urls
    assert f"fleetd:   {second.url} in use (of {first.url}, {second.url})" in agent_status(
        agent, as_json=False
    )

    second.assign(assignment("t-1", [PY, "-c", GATED, gate.path]))
    pid = second.wait_for(
        lambda: second.started.get("t-1"), message="the start on the second fleetd"
    )["pid"]
    second.wait_for(lambda: second.texts("t-1"), message="the first log line on the second fleetd")

    # Now the second fails and the first is back: the task's log lines and finish report, and the
    # heartbeats, go to the first without the agent backing off.
    second.down.add("all")
    first.down.clear()
    gate.open()
    assert first.wait_outcome("t-1") == {"epoch": 1, "outcome": "succeeded", "exit_code": 0}
    lines = first.texts("t-1")  # every line: the chunks that carry them went to the first
    assert (
        lines[1:] == ["released"] and int(lines[0]) != pid
    )  # the task, a child of the reported leader
    first.wait_for(lambda: first.heartbeats, message="heartbeats on the first fleetd again")
    agent.wait_for_line(rf"fleetd at {second.url} failed .*; switching to {first.url}")
    assert "fleetd unreachable" not in agent.log and "acquire failed" not in agent.log, agent.log

    # Both down: the heartbeat backs off once per round of URLs, each URL tried once a round.
    with first.cond, second.cond:
        first.down.add("all")
        second.down.add("all")
        before = [
            len([c for c in fake.calls if c[1] == "/api/v1/agent/heartbeat"]) for fake in fakes
        ]
    agent.wait_for_line(
        r"fleetd unreachable \(attempt 3\): .*every one of the 2 fleetd URLs failed", timeout=60
    )
    agent.wait_for_line(r"fleetd unreachable \(attempt 4\)", timeout=60)
    with first.cond, second.cond:
        tries = [
            len([c for c in fake.calls if c[1] == "/api/v1/agent/heartbeat"]) - n
            for fake, n in zip(fakes, before)
        ]
    assert 3 <= min(tries) and max(tries) - min(tries) <= 1, tries
    assert "fln_test" not in agent.log


def test_join_and_a_job_through_a_dead_url_and_a_live_fleetd(server_factory, admin, agent_factory):
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
    token = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()[
        "token"
    ]
    dead = closed_port_url()
    agent = agent_factory("behind-dead", shape="l4_x4", env=fixed_listen())
    joined = agent.join(
        token, dead, "--server", server.url
    )  # repeatable --server; the first is dead
    assert "enrolled as node" in joined.stdout and f"switching to {server.url}" in joined.stderr
    assert token not in joined.stdout + joined.stderr
    node = agent.node()
    assert node["server_urls"] == [dead, server.url] and node["server_url"] == dead
    agent.start()
    wait_until(
        lambda: (
            http("GET", f"/api/v1/nodes/{node['node_id']}", expect=200).json()["status"] == "ready"
        ),
        timeout=60,
        message="the node to be ready",
    )
    job = http(
        "POST",
        "/api/v1/jobs",
        expect=201,
        json={
            "name": "through-failover",
            "command": [PY, "-c", "print('hello from the other URL')"],
            "resources": {"gpus": 1},
        },
    ).json()
    done = wait_until(
        lambda: (lambda j: j if j["state"] in ("succeeded", "failed", "cancelled") else None)(
            http("GET", f"/api/v1/jobs/{job['id']}?wait_seconds=2", expect=200).json()
        ),
        timeout=90,
        message="the job to end",
    )
    assert done["state"] == "succeeded", done
    lines = http("GET", f"/api/v1/jobs/{job['id']}/logs", expect=200).json()["items"]
    assert "hello from the other URL" in [line["text"] for line in lines]
    status = agent_status(agent)
    assert status["server_url_in_use"] == server.url and status["server_urls"] == [dead, server.url]


def test_comma_separated_server_urls_from_the_environment(server_factory, admin, agent_factory):
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
    token = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()[
        "token"
    ]
    dead = closed_port_url()
    agent = agent_factory(
        "env-list", shape="l4_x4", env={"FLEET_AGENT_SERVER_URL": f"{dead}, {server.url}"}
    )
    result = subprocess.run(
        agent.cmd("join"),
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(agent.env, FLEET_AGENT_JOIN_TOKEN=token),
    )
    assert result.returncode == 0, result.stderr
    assert agent.node()["server_urls"] == [dead, server.url]


def test_the_agent_keeps_working_when_the_replica_it_uses_is_killed(cluster, agent_factory):  # noqa: F811
    start, token = cluster
    procs = start(2)
    http = Http(procs[1].url, token)
    http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()[
        "token"
    ]
    agent = agent_factory("replicated", shape="l4_x4", env=fixed_listen())
    agent.join(join, f"{procs[0].url},{procs[1].url}")
    agent.start()
    node_id = agent.node()["node_id"]
    wait_until(
        lambda: http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()["status"] == "ready",
        timeout=60,
        message="the node to be ready",
    )
    in_use = wait_until(
        lambda: agent_status(agent)["server_url_in_use"], timeout=30, message="the URL in use"
    )
    assert in_use == procs[0].url  # the first URL, while it answers

    victim, survivor = procs
    victim.kill()  # SIGKILL
    http = Http(survivor.url, token)
    wait_until(
        lambda: (health(survivor) or {}).get("leader"), timeout=30, message="the survivor to lead"
    )
    job = http(
        "POST",
        "/api/v1/jobs",
        expect=201,
        json={
            "name": "after-the-kill",
            "command": [PY, "-c", "print('still here')"],
            "resources": {"gpus": 1},
        },
    ).json()
    done = wait_until(
        lambda: (lambda j: j if j["state"] in ("succeeded", "failed", "cancelled") else None)(
            http("GET", f"/api/v1/jobs/{job['id']}?wait_seconds=2", expect=200).json()
        ),
        timeout=90,
        message="the job to end",
    )
    assert done["state"] == "succeeded", done
    assert http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()["status"] == "ready"
    agent.wait_for_line(rf"fleetd at {victim.url} failed .*; switching to {survivor.url}")
    assert agent_status(agent)["server_url_in_use"] == survivor.url
    assert agent.proc.poll() is None
