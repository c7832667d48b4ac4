"""A node's GPU topology as `fleetd node show` prints it: a matrix like `nvidia-smi topo -m`.

Codes: X the GPU itself; NV<n> n NVLinks between the pair; NVS<n> both reach the NVSwitches with n
links (nvidia-smi shows NV<n> there too); PIX through PCIe switches only; PHB through a host bridge;
NODE across host bridges within one NUMA node; SYS across sockets.
"""

import click

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


def show_topology(topology, gpus):
    """Print the matrix, the NICs' names and the legend."""
    rows = topology_rows(topology, gpus)
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for k, nic in enumerate(topology.get("nics") or []):
        click.echo(f"NIC{k}: {nic['name']} ({nic['kind']}, {nic['pci_bus_id']})")
    click.echo(LEGEND)
