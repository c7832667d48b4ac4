"""`fleet-agent drain` on a host: its running agent says so in its heartbeats and fleetd cordons the
node ("agent draining") until `fleet-agent drain --off`; the local API's /api/v1/draining says where
it stands."""

import subprocess

import pytest
import requests

from tests.agent.test_e2e import FAST, node_of, setup_fleet, wait_status
from tests.support.polling import wait_until

pytestmark = pytest.mark.integration


def test_fleet_agent_drain_cordons_its_node_until_drain_off(server_factory, admin, agent_factory):
    server = server_factory(**FAST)
    http, join = setup_fleet(server.url, admin)
    agent = agent_factory("drainer", shape="h100_x8")
    agent.join(join["token"], server.url)
    agent.start()
    wait_status(http, agent, "ready")

    # The test's agent listens on a port of its own choosing (local_api.listen port 0): named here.
    said = subprocess.run(
        agent.cmd("drain", "--local-api", agent.local_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert said.returncode == 0, said.stderr
    node = wait_status(http, agent, "cordoned")
    assert node["status_reason"] == "agent draining"
    local = requests.get(
        agent.local_url + "/api/v1/draining",
        timeout=10,
        headers={"Authorization": f"Bearer {agent.local_token()}"},
    ).json()["data"]
    assert local["draining"] is True
    wait_until(
        lambda: local_status(agent) == "cordoned",
        timeout=30,
        message="the agent to hear it is cordoned",
    )

    assert (
        subprocess.run(
            agent.cmd("drain", "--off", "--local-api", agent.local_url),
            capture_output=True,
            timeout=60,
        ).returncode
        == 0
    )
    wait_status(http, agent, "ready")
    bad = requests.post(
        agent.local_url + "/api/v1/draining",
        json={"draining": "yes"},
        timeout=10,
        headers={"Authorization": f"Bearer {agent.local_token()}"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
    assert node_of(http, agent)["status"] == "ready"


def local_status(agent):
    return requests.get(
        agent.local_url + "/api/v1/draining",
        timeout=10,
        headers={"Authorization": f"Bearer {agent.local_token()}"},
    ).json()["data"]["node_status"]
