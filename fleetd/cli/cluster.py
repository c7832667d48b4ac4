"""`fleetd gpu-types`, `fleetd gpu-type set` and `fleetd quota`: GPU models' prices and team
quotas."""

import click

from fleetd.cli.output import byte_size, cell, emit, plural, show_table
from fleetd.cli.remote import client_command, current_client


@client_command(None, "gpu-types")
def gpu_types():
    """GPU models with capacity, availability and prices."""
    items = current_client().get("/api/v1/gpu-types")["items"]
    emit(
        items,
        lambda rows: show_table(
            rows,
            [
                ("MODEL", "model"),
                ("MEMORY", lambda t: byte_size(t["memory_bytes"]) if t["memory_bytes"] else "-"),
                ("TOTAL", "total"),
                ("AVAILABLE", "available"),
                ("PRICE/H", "price_per_hour"),
                ("SPOT MIN BID", "spot_min_bid"),
            ],
        ),
    )


@click.group("gpu-type")
def gpu_type():
    """Prices of GPU models."""


@client_command(gpu_type, "set")
@click.argument("model")
@click.option("--price", "price_per_hour", type=click.FloatRange(min=0), help="Price per GPU-hour.")
@click.option(
    "--spot-min-bid", type=click.FloatRange(min=0), help="Lowest bid a spot job may offer."
)
def gpu_type_set(model, price_per_hour, spot_min_bid):
    """Set the price and spot minimum bid of a GPU model."""
    from urllib.parse import quote

    data = current_client().request(
        "PUT",
        f"/api/v1/gpu-types/{quote(model, safe='')}",
        json={"price_per_hour": price_per_hour, "spot_min_bid": spot_min_bid},
    )
    emit(
        data,
        lambda d: click.echo(
            f"{model}: price {cell(d['price_per_hour'])}, spot minimum {cell(d['spot_min_bid'])}"
        ),
    )


@click.group()
def quota():
    """Team GPU quotas."""


@client_command(quota, "set")
@click.argument("team")
@click.option(
    "--max-gpus",
    type=click.FloatRange(min=0),
    required=True,
    help="Most GPUs the team's running jobs may hold together (fractions allowed).",
)
@click.option(
    "--class",
    "priority_class",
    type=click.Choice(["any", "on-demand", "spot"]),
    default="any",
    show_default=True,
    help="Which jobs count: every class, or only on-demand or spot ones.",
)
def quota_set(team, max_gpus, priority_class):
    """Set the most GPUs a team's running jobs may hold."""
    data = current_client().request(
        "PUT",
        f"/api/v1/quotas/{team}",
        json={"max_gpus": max_gpus, "priority_class": priority_class},
    )
    emit(
        data,
        lambda d: click.echo(
            f"team {team}: at most {plural(d['max_gpus'], 'GPU')} ({priority_class})"
        ),
    )


@client_command(quota, "list")
def quota_list():
    """List team quotas."""
    items = current_client().get("/api/v1/quotas")["items"]
    emit(
        items,
        lambda rows: show_table(
            rows, [("TEAM", "team"), ("CLASS", "priority_class"), ("MAX GPUS", "max_gpus")]
        ),
    )


@client_command(quota, "rm")
@click.argument("team")
@click.option(
    "--class",
    "priority_class",
    type=click.Choice(["any", "on-demand", "spot"]),
    help="Remove only this class's quota (default: all of the team's).",
)
def quota_rm(team, priority_class):
    """Remove a team's quota (one class, or all)."""
    current_client().request(
        "DELETE",
        f"/api/v1/quotas/{team}",
        params={"priority_class": priority_class} if priority_class else None,
    )
    emit({"team": team, "deleted": True}, lambda d: click.echo(f"removed quota of team {team}"))


COMMANDS = [gpu_types, gpu_type, quota]
