"""A host's topology on the wire (fleetwire.topology): it reads back equal, and from_wire refuses
every malformed matrix by naming what is wrong."""

import copy
import re

import pytest

from fleetwire.heartbeat import Heartbeat
from fleetwire.registration import Registration, Resources
from fleetwire.topology import Topology
from tests.support.gpus import gpus, topology_x3

UUIDS = [gpu["uuid"] for gpu in gpus(3)]
GOOD = topology_x3()  # GPU 2, GPU 0, GPU 1; GPUs 0 and 1 NVLinked


def changed(path, value, *more):
    """GOOD with `value` at `path` (and at each further path of `more`)."""
    data = copy.deepcopy(GOOD)
    for where in (path, *more):
        target = data
        for key in where[:-1]:
            target = target[key]
        target[where[-1]] = value
    return data


def test_a_topology_reads_back_equal_from_its_wire_form():
    topology = Topology.from_wire(GOOD, UUIDS)
    assert topology.to_wire() == GOOD
    assert Topology.from_wire(topology.to_wire()) == topology


def test_the_link_matrix_follows_the_gpus_in_any_order():
    topology = Topology.from_wire(GOOD)
    assert topology.links_for(UUIDS) == (
        ("self", "nvlink", "system"),
        ("nvlink", "self", "system"),
        ("system", "system", "self"),
    )
    assert topology.links_for(UUIDS[:2]) is None
    assert topology.links_for([UUIDS[0], UUIDS[1], "GPU-other"]) is None
    assert topology.links_for([UUIDS[0], UUIDS[0], UUIDS[1]]) is None


@pytest.mark.parametrize(
    "data, says",
    [
        ("not an object", "topology must be an object"),
        (changed(["gpus"], []), "topology.gpus must be a list of 1 to 64"),
        (changed(["gpus"], [UUIDS[0], UUIDS[0], UUIDS[1]]), "must not name a GPU twice"),
        (changed(["links"], [["self", "nvlink"], ["nvlink", "self"]]), "square matrix of 3"),
        (changed(["links", 0, 2], "warp", ["links", 2, 0]), "'warp' is not a link class"),
        (changed(["links", 1, 1], "nvlink"), "links[1][1]: 'nvlink' is not 'self'"),
        (changed(["links", 0, 2], "numa"), "links must be symmetric: [2][0]"),
        (changed(["nvlink_count", 0, 1], 11), "nvlink_count must be symmetric"),
        (changed(["nvlink_count", 2, 2], -1), "an integer from 0 to 64"),
        (
            changed(["nvlink_count", 0, 2], True, ["nvlink_count", 2, 0]),
            "an integer from 0 to 64",
        ),
        (
            changed(["nvlink_count"], [[0, 0, 0], [0, 0, 0], [0, 0, 0]]),
            "above 0 exactly where the pair's class is nvlink or nvswitch",
        ),
        (changed(["nics", 0, "links"], ["numa"]), "nics[0].links must be a list of one class"),
        (changed(["nics", 0, "links", 0], "nvlink"), "'nvlink' is not a NIC's class"),
        (changed(["nics", 0, "kind"], "wifi"), "nics[0].kind must be one of"),
        (changed(["nics", 0, "name"], ""), "nics[0].name must be a string"),
        (changed(["nics", 0, "name"], "mlx5\x000"), "nics[0].name must be a string"),
        (changed(["nics", 0, "pci_bus_id"], "19:00.0"), "nics[0].pci_bus_id must be a PCI address"),
    ],
)
def test_a_malformed_topology_is_refused_by_name(data, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        Topology.from_wire(data, UUIDS)


def _registration(topology, gpu_count=3):
    return Registration(
        hostname="h",
        machine_id="m",
        agent_version="1",
        address="10.0.0.1",
        resources=Resources(cpu_count=8, memory_bytes=2**30),
        gpus=tuple(gpus(gpu_count)),
        topology=topology,
    )


def test_a_registration_carries_its_topology_and_one_without_reads_as_none():
    reg = _registration(Topology.from_wire(GOOD))
    assert Registration.from_wire(reg.to_wire()) == reg
    bare = _registration(None)
    assert "topology" not in bare.to_wire() and Registration.from_wire(bare.to_wire()) == bare


def test_a_registration_whose_topology_names_other_gpus_than_it_reports_is_refused():
    wire = _registration(Topology.from_wire(GOOD), gpu_count=4).to_wire()
    with pytest.raises(ValueError, match="uuids of the GPUs reported"):
        Registration.from_wire(wire)


def test_a_heartbeat_carries_a_topology_only_with_the_gpus_it_links():
    beat = Heartbeat(gpus=tuple(gpus(3)), topology=Topology.from_wire(GOOD, UUIDS))
    assert Heartbeat.from_wire(beat.to_wire()) == beat
    assert "topology" not in Heartbeat(gpus=tuple(gpus(3))).to_wire()
    with pytest.raises(ValueError, match="topology comes with gpus"):
        Heartbeat.from_wire({"tasks": [], "topology": GOOD})
    with pytest.raises(ValueError, match="uuids of the GPUs reported"):
        Heartbeat.from_wire({"tasks": [], "gpus": gpus(2), "topology": GOOD})
