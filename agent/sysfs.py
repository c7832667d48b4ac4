"""The one place that reads the host's PCIe tree from sysfs: where a GPU or a NIC sits (its path
from the root complex down) and which NICs the host has.

The root is a parameter ("/sys" on a host) so that tests point it at a tree of their own. Nothing
here raises for a missing or odd tree: a device that cannot be placed is None, no NICs is [].
"""

import dataclasses
import os
import re

PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
MAX_NICS = 64  # a host with more is not one whose topology placement reads


@dataclasses.dataclass(frozen=True)
class PciDevice:
    """A PCI function and where it sits: `path` runs from its host bridge (root complex) down
    through root port and switches to the device itself."""

    bus_id: str  # 0000:18:00.0
    path: tuple[str, ...]
    numa_node: int | None


@dataclasses.dataclass(frozen=True)
class Nic:
    """A network device of the host: an RDMA device (kind infiniband, e.g. mlx5_0) or a physical
    network interface without one (kind ethernet)."""

    name: str
    kind: str
    device: PciDevice


def bus_key(bus_id):
    """A PCI bus id as sysfs spells it (4-digit domain, lower case): NVML's "00000000:18:00.0"
    -> "0000:18:00.0"."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    domain, _, rest = text.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text.strip().lower()


class Sysfs:
    """The PCIe devices of a host, read under `root`."""

    def __init__(self, root="/sys"):
        self.root = os.fspath(root)

    def pci_device(self, bus_id):
        """The PciDevice of a PCI bus id, or None when sysfs does not have it."""
        return self._place(os.path.join(self.root, "bus", "pci", "devices", bus_key(bus_id)))

    def nics(self):
        """The host's NICs that sit on PCI (virtual interfaces have no PCI device), one per PCI
        function: its RDMA device when it has one."""
        out: dict[str, Nic] = {}
        for kind, folder in (("infiniband", "infiniband"), ("ethernet", "net")):
            for name in self._names(os.path.join(self.root, "class", folder)):
                device = self._place(os.path.join(self.root, "class", folder, name, "device"))
                if device is not None and device.bus_id not in out and len(out) < MAX_NICS:
                    out[device.bus_id] = Nic(name, kind, device)
        return list(out.values())

    def _names(self, folder):
        try:
            return sorted(os.listdir(folder))
        except OSError:
            return []

    def _place(self, link):
        """The PciDevice a sysfs link leads to (its nearest PCI function: a virtio NIC's link
        ends below one), or None."""
        if not os.path.exists(link):
            return None
        real = os.path.realpath(link)
        devices = os.path.realpath(os.path.join(self.root, "devices"))
        if not real.startswith(devices + os.sep):
            return None
        parts = real[len(devices) + 1 :].split(os.sep)
        last = max((i for i, part in enumerate(parts) if PCI_ADDRESS.match(part)), default=None)
        if last is None or not parts[0].startswith("pci"):
            return None
        path = tuple(parts[: last + 1])
        return PciDevice(
            bus_key(path[-1]), path, self._numa(os.path.join(devices, *path, "numa_node"))
        )

    def _numa(self, path):
        try:
            with open(path) as fh:
                value = int(fh.read().strip())
        except (OSError, ValueError):
            return None
        return value if value >= 0 else None
