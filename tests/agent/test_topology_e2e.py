"""End to end with real processes (issue 50): `fleet-agent join` on a host with NVLink-bridged GPU
pairs (the fake NVML's a100_pcie_nvlink_pairs_x4) and `fleetd serve` shows the node's topology."""

import json

import pytest

from agent.state import State
from tests.agent.conftest import rewrite_shape
from tests.agent.test_e2e import node_of, setup_fleet
from tests.support import wait_until

pytestmark = pytest.mark.integration


def test_an_agent_registers_its_gpus_topology_and_fleetd_shows_it(
    server_factory, admin, agent_factory
):
    server = server_factory()
    http, join = setup_fleet(server.url, admin)
    agent = agent_factory("pairs", shape="a100_pcie_nvlink_pairs_x4")
    agent.join(join["token"], server.url)
    node = node_of(http, agent)
    uuids = [gpu["uuid"] for gpu in json.loads(agent.shape.read_text())["gpus"]]
    topology = node["topology"]
    assert topology["gpus"] == uuids == [g["uuid"] for g in node["gpus"]]
    assert topology["links"] == [
        ["self", "nvlink", "system", "system"],
        ["nvlink", "self", "system", "system"],
        ["system", "system", "self", "nvlink"],
        ["system", "system", "nvlink", "self"],
    ]
    assert topology["nvlink_count"][0][1] == topology["nvlink_count"][2][3] == 12


def test_an_agent_enrolled_without_a_topology_reports_it_in_its_first_heartbeat(
    server_factory, admin, agent_factory
):
    server = server_factory()
    http, join = setup_fleet(server.url, admin)
    agent = agent_factory("before", shape="a100_pcie_nvlink_pairs_x4")
    shape = json.loads(agent.shape.read_text())
    rewrite_shape(agent.shape, lambda data: data.pop("topology"))
    agent.join(join["token"], server.url)
    assert node_of(http, agent)["topology"] is None  # as an agent from before topology enrolled

    # Its hardware reads with a topology now (an upgraded agent would): its next start says so.
    rewrite_shape(agent.shape, lambda data: data.update(topology=shape["topology"]))
    agent.start()
    node = wait_until(
        lambda: (lambda n: n if n["topology"] else None)(node_of(http, agent)),
        timeout=60,
        message="the heartbeat's topology on the node",
    )
    assert node["status"] == "ready"
    assert node["topology"]["links"][0] == ["self", "nvlink", "system", "system"]
    assert node["topology"]["gpus"] == [gpu["uuid"] for gpu in shape["gpus"]]


def test_a_fleetd_that_refuses_the_topology_gets_heartbeats_without_it(agent_factory, fleetd):
    fleetd.refuse_topology = True  # as a fleetd older than the field answers
    agent = agent_factory(
        "older",
        shape="a100_pcie_nvlink_pairs_x4",
        server_url=fleetd.url,
        extra={"heartbeat_interval_seconds": 0.5},
    )
    State(str(agent.state_dir)).save_enrolment(
        {"node_id": "node-older", "fleet": "lab", "server_url": fleetd.url, "machine_id": "m"},
        "fln_test",
    )
    agent.start()
    fleetd.wait_for(
        lambda: any("gpus" in hb for hb in fleetd.heartbeats) and len(fleetd.heartbeats) >= 3,
        message="heartbeats taken after the refusal",
    )
    [refused] = fleetd.refused_heartbeats
    assert refused["topology"]["links"][0][1] == "nvlink" and refused["gpus"]
    assert "gpus" in fleetd.heartbeats[0]
    assert not [hb for hb in fleetd.heartbeats if "topology" in hb]
    agent.wait_for_line(r"fleetd refused the GPU topology .*; not sending it")
