"""End to end with real processes (issue 50): `fleet-agent join` on a host with NVLink-bridged GPU
pairs (the fake NVML's a100_pcie_nvlink_pairs_x4) and `fleetd serve` shows the node's topology."""

import json

import pytest

from tests.agent.test_e2e import node_of, setup_fleet

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
