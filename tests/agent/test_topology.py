"""GPU topology discovery (issue 50): each fake host shape yields the matrix its hardware has, NICs
are placed from sysfs, and nothing NVML fails to say ever stops a registration."""

import json
import os
from types import SimpleNamespace

import pytest

from agent import fake_nvml as fake_module
from agent.daemon import wire_topology
from agent.devices import DeviceManager
from agent.nvml import Nvml
from agent.sysfs import Sysfs, bus_key
from agent.topology import LINK_CLASSES, read_nics
from fleetd.scheduler.model import LINK_CLASSES as SCHEDULER_LINK_CLASSES
from fleetwire.topology import LINK_CLASSES as WIRE_LINK_CLASSES
from tests.agent.conftest import rewrite_shape

S, NVL, NVS, PIX, PHB, NUMA, SYS = (
    "self",
    "nvlink",
    "nvswitch",
    "pcie_switch",
    "host_bridge",
    "numa",
    "system",
)


def discover(path, **kwargs):
    manager = DeviceManager(f"fake:{path}", watch_xids=False, **kwargs)
    try:
        return manager.discover()
    finally:
        manager.close()


def test_the_agent_wire_and_scheduler_name_the_same_link_classes():
    assert LINK_CLASSES == WIRE_LINK_CLASSES == SCHEDULER_LINK_CLASSES


def test_an_hgx_h100_is_all_to_all_through_nvswitches_with_one_nic_under_each_gpus_switch(
    fake_nvml,
):
    inventory = discover(fake_nvml.use("h100_nvswitch_x8"))
    topology = inventory.topology
    assert topology["gpus"] == [d.gpu.uuid for d in inventory.devices]
    assert topology["links"] == [[S if i == j else NVS for j in range(8)] for i in range(8)]
    assert topology["nvlink_count"] == [[0 if i == j else 18 for j in range(8)] for i in range(8)]
    nics = topology["nics"]
    assert [nic["name"] for nic in nics] == [f"mlx5_{i}" for i in range(8)]
    assert {nic["kind"] for nic in nics} == {"infiniband"}
    # Each NIC shares a switch with its own GPU, the host bridge's NUMA node with three more, and
    # crosses the sockets to the other four.
    for i, nic in enumerate(nics):
        socket = range(0, 4) if i < 4 else range(4, 8)
        assert nic["links"] == [PIX if j == i else NUMA if j in socket else SYS for j in range(8)]


def test_an_eight_gpu_pcie_server_pairs_gpus_by_switch_and_sockets_by_host_bridge(fake_nvml):
    topology = discover(fake_nvml.use("l40s_pcie_x8")).topology

    def expected(i, j):
        if i == j:
            return S
        if i // 2 == j // 2:
            return PIX  # the same PCIe switch
        if i // 4 == j // 4:
            return PHB  # two switches of one socket's host bridge
        return SYS

    assert topology["links"] == [[expected(i, j) for j in range(8)] for i in range(8)]
    assert topology["nvlink_count"] == [[0] * 8 for _ in range(8)]
    assert [(nic["name"], nic["kind"], nic["links"]) for nic in topology["nics"]] == [
        ("ens1f0np0", "ethernet", [PHB] * 4 + [SYS] * 4),
        ("ens2f0np0", "ethernet", [SYS] * 4 + [PHB] * 4),
    ]


def test_nvlink_bridged_a100_pairs_count_their_twelve_links_and_cross_sockets_otherwise(
    fake_nvml,
):
    topology = discover(fake_nvml.use("a100_pcie_nvlink_pairs_x4")).topology
    assert topology["links"] == [
        [S, NVL, SYS, SYS],
        [NVL, S, SYS, SYS],
        [SYS, SYS, S, NVL],
        [SYS, SYS, NVL, S],
    ]
    assert topology["nvlink_count"] == [
        [0, 12, 0, 0],
        [12, 0, 0, 0],
        [0, 0, 0, 12],
        [0, 0, 12, 0],
    ]
    assert topology["nics"] == []


def test_a_consumer_board_without_nvlink_meets_its_peer_at_the_host_bridge(fake_nvml):
    topology = discover(fake_nvml.use("rtx4090_x2")).topology
    assert topology["links"] == [[S, PHB], [PHB, S]]
    assert topology["nvlink_count"] == [[0, 0], [0, 0]]


def test_an_inactive_link_is_not_counted_and_the_pair_keeps_the_fewer(fake_nvml):
    path = fake_nvml.use("a100_pcie_nvlink_pairs_x4")
    rewrite_shape(path, lambda shape: shape["topology"].update(nvlink_down={"1": [0, 5]}))
    topology = discover(path).topology
    assert topology["nvlink_count"][0][1] == topology["nvlink_count"][1][0] == 10
    assert topology["nvlink_count"][2][3] == 12


def test_an_nvml_that_cannot_say_what_a_link_reaches_takes_a_bus_of_no_gpu_for_a_switch(
    fake_nvml,
):
    path = fake_nvml.use("h100_nvswitch_x8")

    def no_device_type(shape):
        for gpu in shape["gpus"]:
            gpu["errors"] = {"nvmlDeviceGetNvLinkRemoteDeviceType": "NotSupported"}

    rewrite_shape(path, no_device_type)
    topology = discover(path).topology
    assert {topology["links"][i][j] for i in range(8) for j in range(8) if i != j} == {NVS}


def test_a_pair_nvml_cannot_place_falls_back_to_its_numa_nodes_and_the_rest_stays(fake_nvml):
    path = fake_nvml.use("l40s_pcie_x8")
    rewrite_shape(
        path,
        lambda shape: shape["gpus"][2].update(
            errors={"nvmlDeviceGetTopologyCommonAncestor": "Unknown"}
        ),
    )
    topology = discover(path).topology
    assert topology["links"][0][2] == topology["links"][2][3] == NUMA  # one socket
    assert topology["links"][2][4] == SYS
    assert topology["links"][0][1] == PIX and topology["links"][0][3] == PHB


def test_a_shape_without_topology_reports_none_as_an_older_agent(fake_nvml):
    assert discover(fake_nvml.use("h100_x8")).topology is None


def test_a_lost_gpu_leaves_the_topology_out_and_the_registration_goes_on(fake_nvml):
    inventory = discover(fake_nvml.use("gpu_lost"))
    assert inventory.topology is None
    assert wire_topology(inventory) is None


def test_the_registration_carries_the_topology_it_read_and_never_a_broken_one(fake_nvml):
    inventory = discover(fake_nvml.use("a100_pcie_nvlink_pairs_x4"))
    wire = wire_topology(inventory)
    assert wire is not None and wire.to_wire() == inventory.topology
    inventory.topology = dict(inventory.topology, links=[[S]])
    assert wire_topology(inventory) is None


def _pci_tree(root):
    """A host's sysfs: GPU 18 and an HCA below one switch of root port 16:02.0, GPU 81 on another
    socket, a virtio NIC and the loopback interface."""
    devices = root / "devices"
    places = {
        "0000:18:00.0": ("pci0000:16", "0000:16:02.0", "0000:17:00.0", "0000:18:00.0"),
        "0000:19:00.0": ("pci0000:16", "0000:16:02.0", "0000:17:00.0", "0000:19:00.0"),
        "0000:81:00.0": ("pci0000:80", "0000:80:01.0", "0000:81:00.0"),
        "0000:00:03.0": ("pci0000:00", "0000:00:03.0"),
    }
    numa = {"pci0000:16": 0, "pci0000:80": 1, "pci0000:00": 0}
    (root / "bus" / "pci" / "devices").mkdir(parents=True)
    for bus_id, path in places.items():
        folder = devices.joinpath(*path)
        folder.mkdir(parents=True)
        (folder / "numa_node").write_text(f"{numa[path[0]]}\n")
        os.symlink(folder, root / "bus" / "pci" / "devices" / bus_id)
    (devices.joinpath(*places["0000:00:03.0"]) / "virtio2").mkdir()
    links = {
        ("infiniband", "mlx5_0"): devices.joinpath(*places["0000:19:00.0"]),
        ("net", "ib0"): devices.joinpath(*places["0000:19:00.0"]),
        ("net", "eth0"): devices.joinpath(*places["0000:00:03.0"], "virtio2"),
    }
    for (folder, name), target in links.items():
        (root / "class" / folder / name).mkdir(parents=True)
        os.symlink(target, root / "class" / folder / name / "device")
    (root / "class" / "net" / "lo").mkdir()
    return root


def test_nics_are_read_from_sysfs_once_per_pci_function_and_placed_against_each_gpu(tmp_path):
    sysfs = Sysfs(_pci_tree(tmp_path / "sys"))
    assert [(nic.name, nic.kind, nic.device.bus_id) for nic in sysfs.nics()] == [
        ("mlx5_0", "infiniband", "0000:19:00.0"),
        ("eth0", "ethernet", "0000:00:03.0"),
    ]
    nvml = Nvml(SimpleNamespace(__name__="pynvml"))
    gpus = [SimpleNamespace(pci_bus_id=bus) for bus in ("00000000:18:00.0", "00000000:81:00.0")]
    assert read_nics(nvml, gpus, sysfs) == [
        {"name": "mlx5_0", "kind": "infiniband", "pci_bus_id": "0000:19:00.0", "links": [PIX, SYS]},
        {"name": "eth0", "kind": "ethernet", "pci_bus_id": "0000:00:03.0", "links": [NUMA, SYS]},
    ]


def test_no_sysfs_or_a_gpu_it_does_not_know_means_no_nics(tmp_path):
    nvml = Nvml(SimpleNamespace(__name__="pynvml"))
    gpu = [SimpleNamespace(pci_bus_id="00000000:18:00.0")]
    assert read_nics(nvml, gpu, Sysfs(tmp_path / "missing")) == []
    unknown = [SimpleNamespace(pci_bus_id="00000000:5a:00.0")]
    assert read_nics(nvml, unknown, Sysfs(_pci_tree(tmp_path / "sys"))) == []


def test_nvml_bus_ids_are_compared_as_sysfs_spells_them():
    assert bus_key("00000000:1A:00.0") == bus_key(b"0000:1a:00.0") == "0000:1a:00.0"


@pytest.mark.parametrize(
    "call, args",
    [
        ("nvmlDeviceGetNvLinkState", (0,)),
        ("nvmlDeviceGetNvLinkRemotePciInfo", (0,)),
        ("nvmlDeviceGetNvLinkRemoteDeviceType", (0,)),
    ],
)
def test_the_fake_answers_nvlink_calls_on_a_board_without_nvlink_as_nvml_does(
    fake_nvml, call, args
):
    fake_module.use_shape(fake_nvml.use("rtx4090_x2"))
    fake_module.nvmlInit()
    try:
        with pytest.raises(fake_module.NVMLError_NotSupported):
            getattr(fake_module, call)(fake_module.nvmlDeviceGetHandleByIndex(0), *args)
    finally:
        fake_module.nvmlShutdown()


def test_the_fakes_constants_are_pynvmls():
    pynvml = pytest.importorskip("pynvml")
    names = [
        name
        for name in dir(fake_module)
        if name.startswith(("NVML_TOPOLOGY_", "NVML_NVLINK_")) and name.isupper()
    ]
    assert len(names) >= 10
    for name in names:
        assert getattr(fake_module, name) == getattr(pynvml, name), name
    for name in (
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
    ):
        assert callable(getattr(pynvml, name)) and callable(getattr(fake_module, name))


def test_every_shipped_topology_shape_describes_each_of_its_gpus(fake_nvml):
    for name in ("h100_nvswitch_x8", "l40s_pcie_x8", "a100_pcie_nvlink_pairs_x4", "rtx4090_x2"):
        shape = json.loads(fake_nvml.use(name).read_text())
        assert len(shape["topology"]["pcie"]) == len(shape["gpus"]), name
