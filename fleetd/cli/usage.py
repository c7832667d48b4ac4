"""`fleetd usage`, `fleetd idle`, `fleetd budget` and `fleetd storage-price`: usage and
chargeback."""

import csv
import datetime as dt
import sys
from urllib.parse import quote

import click

from fleetd.cli.output import cell, emit, money, show_record, show_table
from fleetd.cli.params import Duration
from fleetd.cli.remote import client_command, current_client

COLUMNS = ("group", "gpu_hours_allocated", "gpu_hours_used", "efficiency", "cost", "runs")
GROUPS = ("team", "owner", "user", "fleet", "gpu_model", "day", "workload")


def _percent(value):
    return None if value is None else f"{100 * value:.1f}%"


@client_command(None, "usage")
@click.option(
    "--since",
    type=Duration(),
    default="7d",
    show_default=True,
    help="How far back: 90m, 24h, 7d, 2w (whole UTC days: from the day it falls on to today).",
)
@click.option(
    "--by",
    "group_by",
    type=click.Choice(GROUPS),
    default="team",
    show_default=True,
    help="Group rows by.",
)
@click.option("--team", help="Only this team's usage.")
@click.option("--owner", help="Only this owner's usage (a token's name).")
@click.option("--fleet", help="Only this fleet's usage.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the rows as CSV.")
def usage(since, group_by, team, owner, fleet, as_csv):
    """GPU-hours allocated and used, efficiency and cost (a submitter sees its own)."""
    today = dt.datetime.now(dt.timezone.utc)
    params = {
        "from": (today - dt.timedelta(seconds=since)).date().isoformat(),
        "to": today.date().isoformat(),
        "group_by": group_by,
    }
    params.update({k: v for k, v in (("team", team), ("owner", owner), ("fleet", fleet)) if v})
    report = current_client().get("/api/v1/usage", **params)
    if as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in report["rows"]:
            writer.writerow(["" if row[c] is None else row[c] for c in COLUMNS])
        return

    def human(data):
        totals = dict(data["totals"], group="TOTAL")
        show_table(
            data["rows"] + [totals],
            [
                (group_by.upper().replace("_", " "), "group"),
                ("GPU-H ALLOCATED", "gpu_hours_allocated"),
                ("GPU-H USED", "gpu_hours_used"),
                ("EFFICIENCY", lambda r: _percent(r["efficiency"])),
                ("COST", lambda r: money(r["cost"])),
                ("RUNS", "runs"),
            ],
            title=f"Usage {data['from']} to {data['to']} (UTC days)",
        )

    emit(report, human)


@client_command(None, "idle")
@click.option(
    "--min-minutes",
    type=click.FloatRange(min=1, max=1440),
    default=30,
    show_default=True,
    help="Idle at least this long.",
)
@click.option(
    "--below",
    "below_percent",
    type=click.FloatRange(min=0, max=100),
    default=10,
    show_default=True,
    help="Utilisation (%) under which a GPU counts as idle.",
)
def idle(min_minutes, below_percent):
    """Workloads holding GPUs that stayed idle, with their owners and cost so far (admin)."""
    items = current_client().get(
        "/api/v1/usage/idle", min_minutes=min_minutes, below_percent=below_percent
    )["items"]
    emit(
        items,
        lambda rows: show_table(
            rows,
            [
                ("KIND", "kind"),
                ("ID", "id"),
                ("NAME", "name"),
                ("OWNER", "owner"),
                ("TEAM", "team"),
                ("GPUS", "gpus"),
                ("IDLE MIN", "idle_minutes"),
                ("COST SO FAR", lambda r: money(r["cost_so_far"])),
            ],
        ),
    )


@click.group()
def budget():
    """Team budgets per calendar month (UTC)."""


BUDGET_FIELDS = [
    ("TEAM", "team"),
    ("MONTH", "month"),
    ("LIMIT COST", lambda b: money(b["limit_cost"])),
    ("LIMIT GPU-H", "limit_gpu_hours"),
    ("ON EXCEED", "on_exceed"),
    ("USED COST", lambda b: money(b["used_cost"])),
    ("USED GPU-H", "used_gpu_hours"),
    ("USED", lambda b: f"{b['used_percent']:.1f}%"),
    ("EXCEEDED", "exceeded"),
]


@client_command(budget, "set")
@click.argument("team")
@click.option(
    "--cost", "limit_cost", type=click.FloatRange(min=0), help="Most the team may spend per month."
)
@click.option(
    "--gpu-hours",
    "limit_gpu_hours",
    type=click.FloatRange(min=0),
    help="Most GPU-hours the team may hold per month.",
)
@click.option(
    "--on-exceed",
    type=click.Choice(["notify", "block", "stop_spot"]),
    default="notify",
    show_default=True,
    help="At 100 %: only notify, hold the team's new work, or stop its spot work.",
)
def budget_set(team, limit_cost, limit_gpu_hours, on_exceed):
    """Set a team's monthly budget (admin)."""
    data = current_client().request(
        "PUT",
        f"/api/v1/budgets/{quote(team, safe='')}",
        json={"limit_cost": limit_cost, "limit_gpu_hours": limit_gpu_hours, "on_exceed": on_exceed},
    )
    emit(data, lambda d: show_record(d, BUDGET_FIELDS))


@client_command(budget, "show")
@click.argument("team")
def budget_show(team):
    """A team's monthly budget and this month's use."""
    data = current_client().get(f"/api/v1/budgets/{quote(team, safe='')}")
    emit(data, lambda d: show_record(d, BUDGET_FIELDS))


@client_command(budget, "list")
def budget_list():
    """Every team's budget and this month's use (admin)."""
    items = current_client().get("/api/v1/budgets")["items"]
    emit(items, lambda rows: show_table(rows, BUDGET_FIELDS))


@client_command(budget, "rm")
@click.argument("team")
def budget_rm(team):
    """Remove a team's budget (admin)."""
    current_client().request("DELETE", f"/api/v1/budgets/{quote(team, safe='')}", expect_json=False)
    emit({"team": team, "deleted": True}, lambda d: click.echo(f"team {team}: budget removed"))


@client_command(None, "storage-price")
@click.option(
    "--set", "per_gb_month", type=click.FloatRange(min=0), help="New price per GB-month (admin)."
)
def storage_price(per_gb_month):
    """The storage price per GB-month of instance volumes; --set changes it from now on."""
    client = current_client()
    if per_gb_month is None:
        data = client.get("/api/v1/prices/storage")
    else:
        data = client.request("PUT", "/api/v1/prices/storage", json={"per_gb_month": per_gb_month})
    emit(data, lambda d: click.echo(f"storage: {cell(money(d['per_gb_month']))} per GB-month"))


COMMANDS = [usage, idle, budget, storage_price]
