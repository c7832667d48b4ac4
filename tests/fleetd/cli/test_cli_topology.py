"""`fleetd node show` prints a node's topology like `nvidia-smi topo -m` and its network place."""

from fleetd.cli.nodes import _show_node
from fleetd.cli.topology import show_topology
from tests.support.gpus import gpus, topology_x3

GPUS = gpus(3)
TOPOLOGY = topology_x3()


def test_the_matrix_names_gpus_by_index_with_nvidia_smis_codes_and_a_column_per_nic(capsys):
    show_topology(TOPOLOGY, GPUS)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:5] == [
        "      GPU2  GPU0  GPU1  NIC0",
        "GPU2  X     SYS   SYS   SYS",
        "GPU0  SYS   X     NV12  PIX",
        "GPU1  SYS   NV12  X     PHB",
        "NIC0: mlx5_0 (infiniband, 0000:19:00.0)",
    ]
    assert lines[5].startswith("X = itself; NV# = # NVLinks; NVS# = # links to NVSwitches")


def test_nvswitch_pairs_show_their_switch_links(capsys):
    topology = {
        "gpus": [g["uuid"] for g in GPUS[:2]],
        "links": [["self", "nvswitch"], ["nvswitch", "self"]],
        "nvlink_count": [[0, 18], [18, 0]],
    }
    show_topology(topology, GPUS[:2])
    assert capsys.readouterr().out.splitlines()[1] == "GPU0  X      NVS18"


def test_node_show_adds_the_network_place_and_the_matrix_only_when_there_is_one(capsys):
    node = {
        "id": "n1",
        "hostname": "a",
        "fleet": "gpu-a",
        "status": "ready",
        "status_reason": "",
        "address": "10.0.0.1",
        "agent_version": "1",
        "bundle_sha256": "",
        "labels": {},
        "registered_at": "2026-01-01T00:00:00Z",
        "last_heartbeat_at": None,
        "resources": {"cpu_count": 8, "memory_bytes": 2**30},
        "drain": None,
        "gpus": GPUS,
        "network": {"block": "b07", "leaf": "leaf-3"},
        "topology": TOPOLOGY,
    }
    _show_node(node)
    out = capsys.readouterr().out
    assert "NETWORK         block b07, leaf leaf-3" in out and "GPU0  SYS   X     NV12  PIX" in out
    _show_node(dict(node, topology=None, network={}))
    out = capsys.readouterr().out
    assert "NV12" not in out and "NVLinks" not in out
