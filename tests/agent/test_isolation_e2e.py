"""Tenants end to end: a real `fleetd serve` decides whom each task runs as and a real
`fleet-agent run` runs it so. The agent's state dir lies where other uids may pass (as /var/lib is);
the tasks run /usr/bin/python3, which every uid can execute."""

import os
import shutil
import tempfile

import pytest

from tests.agent.conftest import AgentProcess, Http, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("setpriv"),
        reason="switching users needs root and setpriv (CI runs as root)",
    ),
]

FAST = {"FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1", "FLEETD_NODE_TTL_SECONDS": "5"}
WHO = "import os; print(os.getuid(), os.getgid())"


@pytest.fixture
def node(server_factory, admin):
    """fleetd and one ready agent on fleet `lab` (root not allowed): (http, agent)."""
    top = tempfile.mkdtemp(prefix="fleet-e2e-")
    os.chmod(top, 0o711)
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http("POST", "/api/v1/fleets", expect=201, json={"name": "lab"})
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()
    agent = AgentProcess(top, "tenant-host", shape="l4_x4")
    try:
        agent.join(join["token"], server.url)
        agent.start()
        node_id = agent.node()["node_id"]
        ready = wait_until(
            lambda: (
                lambda n: (
                    n
                    if n["status"] == "ready" and n["capabilities"]["isolation"] == "uid"
                    else None
                )
            )(http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()),
            timeout=60,
            message="the node ready, with isolation",
        )
        assert ready["capabilities"]["isolation"] == "uid"
        yield http, agent
    finally:
        agent.kill()
        agent.remove_task_cgroups()
        shutil.rmtree(top, ignore_errors=True)


def token(http, name):
    return http(
        "POST", "/api/v1/tokens", expect=201, json={"name": name, "role": "submitter"}
    ).json()["token"]


def run_job(http, as_token=None):
    """Submit WHO (as `as_token`, else the admin) and wait for it: (job status, its output
    lines)."""
    job = http(
        "POST",
        "/api/v1/jobs",
        expect=201,
        token=as_token,
        json={"name": "who", "command": ["/usr/bin/python3", "-c", WHO], "resources": {"gpus": 1}},
    ).json()
    done = wait_until(
        lambda: (lambda j: j if j["state"] in ("succeeded", "failed") else None)(
            http("GET", f"/api/v1/jobs/{job['id']}", expect=200).json()
        ),
        timeout=60,
        message="the job's end",
    )
    logs = http("GET", f"/api/v1/jobs/{job['id']}/logs", expect=200).json()
    items = logs["items"] if isinstance(logs, dict) else logs
    return done, [line["text"] for line in items if line["stream"] == "stdout"]


def test_each_owner_runs_as_its_own_uid_and_root_only_for_an_admin_where_the_fleet_allows_it(node):
    http, _agent = node
    alice, bob = token(http, "alice"), token(http, "bob")
    seen = {}
    for name, as_token in (("alice", alice), ("bob", bob), ("alice again", alice), ("admin", None)):
        done, out = run_job(http, as_token)
        assert done["state"] == "succeeded", done
        run_as = done["tasks"][0]["run_as"]
        assert run_as["source"] == "dynamic" and 61184 <= run_as["uid"] <= 65519, run_as
        assert out == [f"{run_as['uid']} {run_as['gid']}"]
        seen[name] = run_as["uid"]
    assert seen["alice"] == seen["alice again"] != seen["bob"] != seen["admin"]
    http("PATCH", "/api/v1/fleets/lab", expect=200, json={"allow_root_tasks": True})
    done, out = run_job(http)
    assert done["tasks"][0]["run_as"]["source"] == "root" and out == ["0 0"]
    done, out = run_job(http, alice)  # a submitter's work never runs as root
    assert out == [f"{seen['alice']} {seen['alice']}"]
