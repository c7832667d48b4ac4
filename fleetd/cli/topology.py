"""A node's GPU topology as `fleetd node show` prints it (the matrix: fleetd/topology_view.py)."""

import click

from fleetd.topology_view import LEGEND, topology_rows


def show_topology(topology, gpus):
    """Print the matrix, the NICs' names and the legend."""
    rows = topology_rows(topology, gpus)
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for k, nic in enumerate(topology.get("nics") or []):
        click.echo(f"NIC{k}: {nic['name']} ({nic['kind']}, {nic['pci_bus_id']})")
    click.echo(LEGEND)
