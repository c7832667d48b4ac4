"""A host's GPU topology, as registration reports it (docs/api.md "Topology"): each GPU pair's best
path and which NICs sit closest to each GPU, in a compact matrix.

NVML says how two GPUs reach each other over PCIe (its common-ancestor level) and where each GPU's
NVLinks go; a pair with NVLinks between them is `nvlink` (with the count of active links), a pair
whose GPUs both have links to NVSwitches is `nvswitch` (with the fewer of their switch links, which
`nvidia-smi topo -m` shows as NV<count> too), and any other pair takes its PCIe class. NICs come
from sysfs (agent.sysfs), or from the shape with the fake NVML, and are placed against the GPUs by
their PCIe paths.

Reading topology never breaks registration: a pair NVML cannot place falls back to its NUMA nodes
(same: numa, else system), and when even that is unknown, or a GPU cannot be read at all, there is
no topology (None), said once in the log.
"""

import logging

from agent.nvml import DeviceError, Unread
from agent.sysfs import Nic, PciDevice, Sysfs, bus_key

log = logging.getLogger("agent.topology")

# Best first; the same names as fleetd's (fleetd.scheduler.model.LINK_CLASSES, checked by a test).
LINK_CLASSES = ("nvlink", "nvswitch", "pcie_switch", "host_bridge", "numa", "system")
SELF_LINK = "self"


def numa_class(numa_a, numa_b):
    """The class of two devices known only by their NUMA nodes (None when either is unknown)."""
    if numa_a is None or numa_b is None:
        return None
    return "numa" if numa_a == numa_b else "system"


def pci_class(a: PciDevice, b: PciDevice):
    """The class of the PCIe path between two devices by their sysfs paths: below one root port
    (through a switch), one host bridge, or neither (then by NUMA node; None when unknown)."""
    shared = 0
    for x, y in zip(a.path[:-1], b.path[:-1]):
        if x != y:
            break
        shared += 1
    if shared >= 2:
        return "pcie_switch"
    if shared == 1:
        return "host_bridge"
    return numa_class(a.numa_node, b.numa_node)


def _links_between(nvlinks, bus_id):
    return sum(1 for link in nvlinks if bus_key(link.remote_bus_id) == bus_id)


def _switch_links(nvlinks, gpu_buses):
    # An older NVML cannot say what a link reaches: one that reaches no GPU of the host is a switch.
    return sum(
        1
        for link in nvlinks
        if link.to_switch
        or (link.to_switch is None and bus_key(link.remote_bus_id) not in gpu_buses)
    )


class _Reader:
    """One reading of the topology of a set of GPUs (Device objects of one NVML session)."""

    def __init__(self, nvml, devices):
        self.nvml = nvml
        self.devices = devices
        self.guessed: list[str] = []  # pairs placed by NUMA node alone, and why
        self.answered = False  # NVML placed at least one pair (by PCIe path or NVLink)
        self.buses = [bus_key(d.pci_bus_id) for d in devices]
        self.handles = [nvml.handle(d.gpu.index) for d in devices]
        self.nvlinks = []
        self.unread = []
        for device, handle in zip(devices, self.handles):
            links = nvml.nvlinks(handle)
            if isinstance(links, Unread):
                self.unread.append(f"NVLinks of GPU {device.gpu.index}: {links.reason}")
                links = []
            self.nvlinks.append(links)

    def pair(self, i, j):
        """(class, NVLink count) of GPUs i and j, or (None, 0) when nothing places them."""
        # Each side counts its own active links to the other: a link down on one side is down (a
        # side whose NVLinks could not be read counts none, and the other side's count stands).
        seen = [
            n
            for n in (
                _links_between(self.nvlinks[i], self.buses[j]),
                _links_between(self.nvlinks[j], self.buses[i]),
            )
            if n
        ]
        self.answered = self.answered or bool(seen)
        if seen:
            return "nvlink", min(seen)
        gpu_buses = set(self.buses)
        switched = min(
            _switch_links(self.nvlinks[i], gpu_buses), _switch_links(self.nvlinks[j], gpu_buses)
        )
        if switched:
            self.answered = True
            return "nvswitch", switched
        level = self.nvml.common_ancestor(self.handles[i], self.handles[j])
        if not isinstance(level, Unread):
            self.answered = True
            return level, 0
        a, b = self.devices[i].gpu, self.devices[j].gpu
        self.guessed.append(f"GPUs {a.index} and {b.index} ({level.reason})")
        return numa_class(a.numa_node, b.numa_node), 0

    def problems(self):
        """What was not read, in one line."""
        said = list(self.unread)
        if self.guessed:
            said.append(
                f"{len(self.guessed)} GPU pair(s) placed by NUMA node only, first {self.guessed[0]}"
            )
        return "; ".join(said)


def _nic_devices(nvml, devices, sysfs):
    """(PciDevice per GPU, [Nic]) for placing NICs: from the fake NVML's shape, else sysfs."""
    fake = nvml.fake_pci_devices()
    if fake is None:
        return [sysfs.pci_device(d.pci_bus_id) for d in devices], sysfs.nics()
    places = {}
    for bus_id, (path, numa) in fake["gpus"].items():
        key = bus_key(bus_id)
        places[key] = PciDevice(key, (*path, key), numa)
    nics = []
    for nic in fake["nics"]:
        key = bus_key(nic["pci_bus_id"])
        nics.append(
            Nic(nic["name"], nic["kind"], PciDevice(key, (*nic["pcie"], key), nic.get("numa_node")))
        )
    return [places.get(bus_key(d.pci_bus_id)) for d in devices], nics


def read_nics(nvml, devices, sysfs):
    """[{name, kind, pci_bus_id, links}]: each NIC's class to each GPU (in `devices` order); []
    when there are none or a GPU's place is unknown."""
    gpu_places, nics = _nic_devices(nvml, devices, sysfs)
    if not nics:
        return []
    if any(place is None for place in gpu_places):
        log.info("NICs not placed: a GPU's PCI device is not in sysfs")
        return []
    out = []
    for nic in nics:
        links = [pci_class(nic.device, place) for place in gpu_places]
        if None in links:
            continue
        out.append(
            {"name": nic.name, "kind": nic.kind, "pci_bus_id": nic.device.bus_id, "links": links}
        )
    return out


def read_topology(nvml, devices, sysfs_root="/sys"):
    """The topology of these GPUs (Device objects, in the order registration reports them):
    {gpus, links, nvlink_count, nics}, or None when it cannot be read (said once in the log)."""
    if not devices:
        return None
    if any(d.pci_bus_id is None for d in devices):
        log.warning("no GPU topology: a GPU could not be read")
        return None
    try:
        reader = _Reader(nvml, devices)
        n = len(devices)
        links = [[SELF_LINK] * n for _ in range(n)]
        counts = [[0] * n for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                link_class, count = reader.pair(i, j)
                if link_class is None:
                    log.warning(
                        "no GPU topology: GPUs %d and %d cannot be placed: %s",
                        i,
                        j,
                        reader.problems(),
                    )
                    return None
                links[i][j] = links[j][i] = link_class
                counts[i][j] = counts[j][i] = count
    except DeviceError as exc:
        log.warning("no GPU topology: %s", exc)
        return None
    if n > 1 and not reader.answered:
        # Nothing NVML said: a NUMA-only matrix would tell placement nothing it does not know.
        log.info("no GPU topology: NVML places no GPU pair (%s)", reader.problems())
        return None
    if reader.problems():
        log.warning("GPU topology read in part: %s", reader.problems())
    return {
        "gpus": [d.gpu.uuid for d in devices],
        "links": links,
        "nvlink_count": counts,
        "nics": read_nics(nvml, devices, Sysfs(sysfs_root)),
    }
