"""A node's GPU topology as people read it, a matrix like `nvidia-smi topo -m`: `fleetd node show`
prints it (fleetd/cli/topology.py) and the console's node page draws it.

Codes: X the GPU itself; NV<n> n NVLinks between the pair; NVS<n> both reach the NVSwitches with n
links (nvidia-smi shows NV<n> there too); PIX through PCIe switches only; PHB through a host bridge;
NODE across host bridges within one NUMA node; SYS across sockets.
"""

CODES = {
    "self": "X",
    "pcie_switch": "PIX",
    "host_bridge": "PHB",
    "numa": "NODE",
    "system": "SYS",
}
LEGEND = (
    "X = itself; NV# = # NVLinks; NVS# = # links to NVSwitches; PIX = PCIe switches only; "
    "PHB = a PCIe host bridge; NODE = host bridges of one NUMA node; SYS = across sockets"
)


def link_code(link_class, nvlinks):
    """The short code of one pair (CODES, NV<n>, NVS<n>)."""
    if link_class == "nvlink":
        return f"NV{nvlinks}"
    if link_class == "nvswitch":
        return f"NVS{nvlinks}"
    return CODES.get(link_class, link_class)


def topology_rows(topology, gpus):
    """The matrix as rows of cells, a header row first: GPUs by the index the node shows (from
    `gpus`, the node's GPU list), then a column per NIC."""
    index = {gpu["uuid"]: gpu["index"] for gpu in gpus}
    names = [f"GPU{index.get(uuid, i)}" for i, uuid in enumerate(topology["gpus"])]
    nics = topology.get("nics") or []
    rows = [[""] + names + [f"NIC{k}" for k in range(len(nics))]]
    for i, name in enumerate(names):
        cells = [
            link_code(link, topology["nvlink_count"][i][j])
            for j, link in enumerate(topology["links"][i])
        ]
        rows.append([name] + cells + [CODES.get(nic["links"][i], "?") for nic in nics])
    return rows


NETWORK_LABEL_PREFIX = "topology.fleetd/"  # a node's place in the network, by its labels
NETWORK_LEVELS = ("block", "leaf", "spine")


def network_of(labels):
    """A node's place in the network from its labels: {block?, leaf?, spine?}."""
    labels = labels or {}
    return {
        level: labels[f"{NETWORK_LABEL_PREFIX}{level}"]
        for level in NETWORK_LEVELS
        if f"{NETWORK_LABEL_PREFIX}{level}" in labels
    }
