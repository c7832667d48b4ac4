"""The host topology a fake NVML shape describes (read by agent.fake_nvml), in a compact form.

A shape's optional top-level ``topology``::

    {"pcie": [["hb0", "sw0"], ["hb0", "sw0"], ["hb1", "sw2"], ...],
     "nvlink": {"links": 12, "pairs": [[0, 1, 12], [2, 3, 12]]},
     "nvlink_down": {"0": [11]},
     "nics": [{"name": "mlx5_0", "kind": "infiniband", "pci_bus_id": "0000:1a:00.0",
               "numa_node": 0, "pcie": ["hb0", "sw0"]}]}

- ``pcie``: per GPU (by index), its PCIe path from its host bridge down (the host bridge, then
  the switches above it). Two GPUs under the same last switch are NVML's SINGLE, under a common
  switch higher up MULTIPLE, under the same host bridge only HOSTBRIDGE; otherwise NODE when their
  ``numa_node`` is the same, else SYSTEM (across sockets).
- ``nvlink``: how many NVLinks each GPU has (``links``), and either ``pairs`` ([a, b, count]:
  ``count`` links between GPUs a and b, the rest inactive) or ``"nvswitch": true`` (every link to
  one of ``switches`` NVSwitches, 4 by default). Left out: NVLink calls answer NotSupported, as on
  a board without NVLink.
- ``nvlink_down``: per GPU index, links that read inactive.
- ``nics``: NICs with their own PCIe path, compared with the GPUs' the same way.

A shape without ``topology`` has none to report: the topology calls answer NotSupported, so the
agent reports no topology and placement groups that node's GPUs by NUMA node, as for an older agent
(deriving one from ``numa_node`` alone would claim links the shape never described).
"""

NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
DEFAULT_SWITCHES = 4


def switch_bus_id(number):
    """The PCI bus id of fake NVSwitch `number` (a bus no GPU of a shape uses)."""
    return f"00000000:{0xF0 + number:02X}:00.0"


def pcie_path(shape, index):
    """GPU `index`'s PCIe path (host bridge first), or None when the shape describes none."""
    paths = (shape.get("topology") or {}).get("pcie")
    if not paths or not 0 <= index < len(paths):
        return None
    return tuple(paths[index])


def common_ancestor(shape, a, b):
    """NVML's topology level between GPUs a and b (indexes), or None when the shape has no PCIe
    paths."""
    if a == b:
        return NVML_TOPOLOGY_INTERNAL
    path_a, path_b = pcie_path(shape, a), pcie_path(shape, b)
    if path_a is None or path_b is None:
        return None
    shared = 0
    for x, y in zip(path_a, path_b):
        if x != y:
            break
        shared += 1
    if shared >= 2:
        return NVML_TOPOLOGY_SINGLE if path_a == path_b else NVML_TOPOLOGY_MULTIPLE
    if shared == 1:
        return NVML_TOPOLOGY_HOSTBRIDGE
    gpus = shape.get("gpus", [])
    if gpus[a].get("numa_node") == gpus[b].get("numa_node"):
        return NVML_TOPOLOGY_NODE
    return NVML_TOPOLOGY_SYSTEM


def nvlinks(shape, index):
    """GPU `index`'s NVLinks: a list, per link number, of None (inactive) or (remote PCI bus id,
    remote device type); None when the GPU has no NVLink at all."""
    topology = shape.get("topology") or {}
    nvlink = topology.get("nvlink")
    if not nvlink:
        return None
    count = int(nvlink.get("links", 0))
    links: list[tuple[str, int] | None] = [None] * count
    gpus = shape.get("gpus", [])
    if nvlink.get("nvswitch"):
        switches = int(nvlink.get("switches", DEFAULT_SWITCHES))
        links = [
            (switch_bus_id(link % switches), NVML_NVLINK_DEVICE_TYPE_SWITCH)
            for link in range(count)
        ]
    else:
        used = 0
        for a, b, n in nvlink.get("pairs", []):
            if index not in (a, b):
                continue
            peer = gpus[b if index == a else a]
            for _ in range(int(n)):
                if used < count:
                    links[used] = (peer["pci_bus_id"], NVML_NVLINK_DEVICE_TYPE_GPU)
                    used += 1
    for link in (topology.get("nvlink_down") or {}).get(str(index), []):
        if 0 <= link < count:
            links[link] = None
    return links


def nics(shape):
    """The shape's NICs: [{name, kind, pci_bus_id, numa_node, pcie}]."""
    return [dict(nic) for nic in (shape.get("topology") or {}).get("nics", [])]
