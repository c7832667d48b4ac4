"""A host's GPU topology on the wire, defined once (docs/api.md "Topology"): what registration
carries (Registration.topology) and fleetd keeps on the node.

`links[i][j]` is the class of the best path between GPUs `gpus[i]` and `gpus[j]` (SELF_LINK on the
diagonal), `nvlink_count[i][j]` the NVLinks between them (direct, or each one's links to the
NVSwitches; 0 for a pair without), and each NIC's `links[i]` its class to GPU `gpus[i]`. from_wire
checks everything and names what is wrong (ValueError).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from fleetwire.checks import is_int

# Best first; fleetd.scheduler.model.LINK_CLASSES names the same (a test holds them equal).
LINK_CLASSES = ("nvlink", "nvswitch", "pcie_switch", "host_bridge", "numa", "system")
SELF_LINK = "self"
NVLINK_CLASSES = ("nvlink", "nvswitch")
NIC_CLASSES = ("pcie_switch", "host_bridge", "numa", "system")
NIC_KINDS = ("infiniband", "ethernet")
MAX_GPUS = 64  # as a registration's gpus
MAX_NICS = 64
MAX_NVLINKS = 64  # NVML_NVLINK_MAX_LINKS is 36 today
MAX_NAME = 64
# A NIC's name as the kernel gives it (mlx5_0, ens1f0np0) and a PCI address as sysfs spells it.
NIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}$")
PCI_BUS_ID = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclasses.dataclass(frozen=True)
class Nic:
    """A NIC of the host and its class to each GPU."""

    name: str
    kind: str  # infiniband (an RDMA device) | ethernet
    pci_bus_id: str
    links: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "pci_bus_id": self.pci_bus_id,
            "links": list(self.links),
        }

    @classmethod
    def from_wire(cls, data: Any, gpus: int, where: str) -> Nic:
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object")
        name, bus_id = data.get("name"), data.get("pci_bus_id")
        if not isinstance(name, str) or not NIC_NAME.match(name):
            raise ValueError(
                f"{where}.name must be a string of 1 to {MAX_NAME} letters, digits and ._:@-"
            )
        if not isinstance(bus_id, str) or not PCI_BUS_ID.match(bus_id):
            raise ValueError(f"{where}.pci_bus_id must be a PCI address such as 0000:19:00.0")
        if data.get("kind") not in NIC_KINDS:
            raise ValueError(f"{where}.kind must be one of {', '.join(NIC_KINDS)}")
        links = data.get("links")
        if not isinstance(links, list) or len(links) != gpus:
            raise ValueError(f"{where}.links must be a list of one class per GPU ({gpus})")
        for link in links:
            if link not in NIC_CLASSES:
                raise ValueError(
                    f"{where}.links: {link!r} is not a NIC's class ({', '.join(NIC_CLASSES)})"
                )
        return cls(name, data["kind"], bus_id, tuple(links))


def _matrix(data: dict[str, Any], name: str, n: int) -> list[list[Any]]:
    rows = data.get(name)
    if (
        not isinstance(rows, list)
        or len(rows) != n
        or not all(isinstance(row, list) and len(row) == n for row in rows)
    ):
        raise ValueError(f"topology.{name} must be a square matrix of {n} rows of {n}, one per GPU")
    for i in range(n):
        for j in range(i):
            if rows[i][j] != rows[j][i]:
                raise ValueError(
                    f"topology.{name} must be symmetric: [{i}][{j}] is {rows[i][j]!r}, "
                    f"[{j}][{i}] is {rows[j][i]!r}"
                )
    return rows


@dataclasses.dataclass(frozen=True)
class Topology:
    """The GPUs of a host (by uuid), the class and NVLink count of each pair, and its NICs."""

    gpus: tuple[str, ...]
    links: tuple[tuple[str, ...], ...]
    nvlink_count: tuple[tuple[int, ...], ...]
    nics: tuple[Nic, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "gpus": list(self.gpus),
            "links": [list(row) for row in self.links],
            "nvlink_count": [list(row) for row in self.nvlink_count],
            "nics": [nic.to_wire() for nic in self.nics],
        }

    @classmethod
    def from_wire(cls, data: Any, reported: Sequence[str] | None = None) -> Topology:
        """The topology of `data`; with `reported` (the uuids of the GPUs a registration reports)
        its GPUs must be exactly those."""
        if not isinstance(data, dict):
            raise ValueError("topology must be an object")
        gpus = data.get("gpus")
        if (
            not isinstance(gpus, list)
            or not 0 < len(gpus) <= MAX_GPUS
            or not all(isinstance(uuid, str) and uuid for uuid in gpus)
        ):
            raise ValueError(f"topology.gpus must be a list of 1 to {MAX_GPUS} GPU uuids")
        if len(set(gpus)) != len(gpus):
            raise ValueError("topology.gpus must not name a GPU twice")
        if reported is not None and sorted(gpus) != sorted(reported):
            raise ValueError("topology.gpus must be the uuids of the GPUs reported, each once")
        n = len(gpus)
        links = _matrix(data, "links", n)
        counts = _matrix(data, "nvlink_count", n)
        for i in range(n):
            for j in range(n):
                link, count = links[i][j], counts[i][j]
                if (i == j) != (link == SELF_LINK) or (i != j and link not in LINK_CLASSES):
                    raise ValueError(
                        f"topology.links[{i}][{j}]: {link!r} is not "
                        + (
                            f"{SELF_LINK!r}"
                            if i == j
                            else f"a link class ({', '.join(LINK_CLASSES)})"
                        )
                    )
                if not is_int(count) or not 0 <= count <= MAX_NVLINKS:
                    raise ValueError(
                        f"topology.nvlink_count[{i}][{j}] must be an integer from 0 to "
                        f"{MAX_NVLINKS}"
                    )
                if (count > 0) != (link in NVLINK_CLASSES):
                    raise ValueError(
                        f"topology.nvlink_count[{i}][{j}] must be above 0 exactly where the pair's "
                        f"class is nvlink or nvswitch ({link!r} with {count})"
                    )
        nics = data.get("nics") or []
        if not isinstance(nics, list) or len(nics) > MAX_NICS:
            raise ValueError(f"topology.nics must be a list of at most {MAX_NICS} NICs")
        return cls(
            tuple(gpus),
            tuple(tuple(row) for row in links),
            tuple(tuple(row) for row in counts),
            tuple(Nic.from_wire(nic, n, f"topology.nics[{k}]") for k, nic in enumerate(nics)),
        )

    def links_for(self, uuids: Sequence[str]) -> tuple[tuple[str, ...], ...] | None:
        """The link matrix in the order of `uuids` (the GPUs as a node lists them now), or None
        when they are not exactly this topology's GPUs."""
        if len(uuids) != len(self.gpus) or len(set(uuids)) != len(uuids):
            return None
        position = {uuid: i for i, uuid in enumerate(self.gpus)}
        try:
            order = [position[uuid] for uuid in uuids]
        except KeyError:
            return None
        return tuple(tuple(self.links[i][j] for j in order) for i in order)
