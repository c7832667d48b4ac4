"""`fleetd node`: list, inspect, label, cordon, drain, revoke, remove."""

import click

from fleetd.cli.output import EVENT_COLUMNS, byte_size, emit, number, show_record, show_table
from fleetd.cli.params import Duration
from fleetd.cli.remote import client_command, current_client, resolve_id
from fleetd.cli.topology import show_topology
from fleetd.cli.validation import node_validate, node_validation, show_validation
from fleetd.client import ClientError


@click.group()
def node():
    """Nodes: list, inspect, label, cordon, drain, revoke, remove."""


def _gpus_cell(row):
    """The GPU count, or why there are none: "0 (cpu only)" / "0 (driver error)"."""
    status = row.get("gpu_status")
    if row["gpus"] or status in (None, "ok"):
        return len(row["gpus"])
    return f"0 ({status.replace('_', ' ')})"


NODE_COLUMNS = [
    ("ID", "id"),
    ("HOSTNAME", "hostname"),
    ("FLEET", "fleet"),
    ("STATUS", "status"),
    ("GPUS", _gpus_cell),
    ("LAST HEARTBEAT", "last_heartbeat_at"),
    ("REASON", "status_reason"),
]


def _show_node(data):
    show_record(
        data,
        NODE_COLUMNS[:4]
        + [
            ("REASON", "status_reason"),
            (
                "CORDON",
                lambda x: (
                    x.get("cordon")
                    and f"{x['cordon']['reason'] or 'no reason given'} (by "
                    f"{x['cordon']['actor']}, {x['cordon']['at']})"
                ),
            ),
            ("ADDRESS", "address"),
            ("AGENT", "agent_version"),
            ("BUNDLE", "bundle_sha256"),
            ("LABELS", "labels"),
            (
                "NETWORK",
                lambda x: ", ".join(f"{k} {v}" for k, v in (x.get("network") or {}).items()),
            ),
            ("REGISTERED", "registered_at"),
            ("LAST HEARTBEAT", "last_heartbeat_at"),
            ("CPUS", lambda x: x["resources"]["cpu_count"]),
            ("MEMORY", lambda x: byte_size(x["resources"]["memory_bytes"])),
            (
                "DRAIN",
                lambda x: (
                    x["drain"]
                    and f"{x['drain']['reason']} (deadline {x['drain']['deadline']})"
                    + ("; for repair: undrain validates it" if x["drain"].get("repair") else "")
                ),
            ),
            (
                "GPU STATUS",
                lambda x: (
                    x.get("gpu_status")
                    and " - ".join(
                        filter(
                            None, [x["gpu_status"].replace("_", " "), x.get("gpu_status_reason")]
                        )
                    )
                ),
            ),
        ],
    )
    if data["gpus"]:
        click.echo("")
        columns = [
            ("IDX", "index"),
            ("UUID", "uuid"),
            ("MODEL", "model"),
            ("MEMORY", lambda g: byte_size(g["memory_total_bytes"])),
            ("NUMA", "numa_node"),
            ("HEALTHY", "healthy"),
        ]
        if data.get("allocation") is None:
            show_table(data["gpus"], columns + [("REASON", "health_reason")])
            click.echo("(which GPUs are in use, and by what, is shown to admins only)")
        else:
            allocation = data["allocation"]
            show_table(
                data["gpus"],
                columns
                + [
                    ("STATE", lambda g: allocation[g["uuid"]]["state"]),
                    ("USED BY / REASON", lambda g: allocation[g["uuid"]]["detail"]),
                ],
            )
    if data.get("topology"):
        click.echo("")
        show_topology(data["topology"], data["gpus"])
    if data.get("validation"):
        click.echo("")
        show_validation(data["validation"], only_failed=data["validation"]["state"] == "passed")


def _node_allocation(node_id, gpus):
    """{gpu uuid: {state, detail, tasks}} from the admin-only allocation view; None for other
    roles."""
    try:
        allocation = current_client().get("/api/v1/cluster/allocation", node_id=node_id)
    except ClientError as exc:
        if exc.status == 403:
            return None
        raise
    held: dict[str, list[dict]] = {}  # gpu uuid -> what holds it
    for task in allocation["allocations"]:
        if task["node_id"] != node_id:
            continue
        for gpu in task["gpus"]:
            share = (
                ""
                if gpu.get("exclusive", True)
                else f", {number(gpu.get('compute_percent') or 0)}% compute"
            )
            held.setdefault(gpu["uuid"], []).append(
                {
                    "task_id": task["task_id"],
                    "job_id": task["job_id"],
                    "rank": task["rank"],
                    "text": f"job {task['job_id']} rank {task['rank']} ({task['state']}{share})",
                }
            )
    out = {}
    listed = {g["uuid"]: g for g in allocation["gpus"] if g["node_id"] == node_id}
    for gpu in gpus:
        seen = listed.get(gpu["uuid"], {})
        state = seen.get("state") or "unknown"
        if held.get(gpu["uuid"]):
            detail = "; ".join(h["text"] for h in held[gpu["uuid"]])
        elif state == "blocked":
            detail = (
                seen.get("blocked_reason")
                or seen.get("blocked_code")
                or gpu.get("health_reason")
                or ""
            )
        else:
            detail = gpu.get("health_reason") or ""
        out[gpu["uuid"]] = {
            "state": state,
            "detail": detail or None,
            "tasks": held.get(gpu["uuid"], []),
        }
    return out


@client_command(node, "list")
@click.option("--fleet", "fleet_name", help="Only nodes of this fleet.")
@click.option(
    "--status",
    type=click.Choice(
        [
            "pending",
            "validating",
            "failed_validation",
            "ready",
            "cordoned",
            "draining",
            "drained",
            "lost",
            "revoked",
        ]
    ),
    help="Only nodes in this state.",
)
@click.option(
    "--version", "agent_version", help="Only nodes whose agent runs this version (track a rollout)."
)
@click.option("--hostname", help="Only nodes of this hostname.")
def node_list(fleet_name, status, agent_version, hostname):
    """List nodes."""
    items = list(
        current_client().paginate(
            "/api/v1/nodes",
            fleet=fleet_name,
            status=status,
            agent_version=agent_version,
            hostname=hostname,
        )
    )
    emit(items, lambda rows: show_table(rows, NODE_COLUMNS + [("AGENT", "agent_version")]))


@client_command(node, "show")
@click.argument("handle", metavar="NODE")
def node_show(handle):
    """Show a node (by id or hostname) and its GPUs: used, free or blocked, and by which job
    (admins)."""
    node_id = resolve_id("node", handle)
    data = current_client().get(f"/api/v1/nodes/{node_id}")
    data["allocation"] = _node_allocation(node_id, data["gpus"]) if data["gpus"] else {}
    data["validation"] = node_validation(node_id)
    emit(data, _show_node)


def _node_action(action, done, help_text):
    def command(handle):
        node_id = resolve_id("node", handle)
        data = current_client().post(f"/api/v1/nodes/{node_id}/{action}")
        emit(data, lambda d: click.echo(f"{done} node {node_id}: now {d['status']}"))

    # The help is set before click reads it: a docstring assigned after the decorators would be
    # lost.
    command.__doc__ = help_text
    return client_command(node, action)(click.argument("handle", metavar="NODE")(command))


@client_command(node, "cordon")
@click.argument("handle", metavar="NODE")
@click.option(
    "--reason", help="Why (the node's status reason and event; default: cordoned by admin)."
)
def node_cordon(handle, reason):
    """Cordon a ready node (by id or hostname): it takes no new work; what runs on it continues."""
    node_id = resolve_id("node", handle)
    data = current_client().post(
        f"/api/v1/nodes/{node_id}/cordon", {"reason": reason} if reason else {}
    )
    emit(data, lambda d: click.echo(f"cordoned node {node_id}: now {d['status']}"))


node_uncordon = _node_action(
    "uncordon", "uncordoned", "Uncordon a node (by id or hostname): it takes new work again."
)
node_undrain = _node_action(
    "undrain",
    "undrained",
    "Undrain a draining or drained node (by id or hostname): it is ready and takes new work again.",
)
node_revoke = _node_action(
    "revoke",
    "revoked",
    "Revoke a node (by id or hostname): its session token stops working and its tasks end lost "
    "(their jobs retry); the host must join again to come back.",
)


@client_command(node, "drain")
@click.argument("handle", metavar="NODE")
@click.option("--reason", required=True, help="Why (recorded in the node's events).")
@click.option(
    "--deadline",
    type=Duration(),
    default="1h",
    show_default=True,
    help="Running tasks are stopped after this.",
)
@click.option(
    "--repair",
    is_flag=True,
    help="A drain for repair: undrain validates the node before it takes work.",
)
def node_drain(handle, reason, deadline, repair):
    """Drain a node (by id or hostname): no new work; running tasks may finish until the
    deadline."""
    node_id = resolve_id("node", handle)
    data = current_client().post(
        f"/api/v1/nodes/{node_id}/drain",
        {"reason": reason, "deadline_seconds": deadline, "repair": repair},
    )
    emit(data, lambda d: click.echo(f"draining node {node_id}: now {d['status']}"))


@client_command(node, "label")
@click.argument("handle", metavar="NODE")
@click.argument("pairs", nargs=-1, metavar="KEY=VALUE...")
@click.option(
    "--remove",
    "removed",
    multiple=True,
    metavar="KEY",
    help=(
        "Drop the label set through fleetd under KEY (repeatable); the agent's value, if its "
        "config file has one, shows again."
    ),
)
def node_label(handle, pairs, removed):
    """Set labels on a node (by id or hostname) through fleetd. They win per key over the labels of
    the agent's config file, which fill the rest, and survive agent restarts and provisioning
    reruns."""
    changes = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r} must be KEY=VALUE", param_hint="KEY=VALUE")
        changes[key.strip()] = value.strip()
    for key in removed:
        if key in changes:
            raise click.BadParameter(f"{key} is both set and removed", param_hint="--remove")
        changes[key] = None
    if not changes:
        raise click.UsageError("give KEY=VALUE to set, or --remove KEY")
    node_id = resolve_id("node", handle)
    data = current_client().patch(f"/api/v1/nodes/{node_id}", {"labels": changes})
    emit(
        data,
        lambda d: click.echo(
            f"node {node_id}: labels "
            + (", ".join(f"{k}={v}" for k, v in sorted(d["labels"].items())) or "none")
        ),
    )


@client_command(node, "rm")
@click.argument("handle", metavar="NODE")
def node_rm(handle):
    """Remove a node, by id or hostname (refused while tasks run on it)."""
    node_id = resolve_id("node", handle)
    current_client().delete(f"/api/v1/nodes/{node_id}")
    emit({"id": node_id, "deleted": True}, lambda d: click.echo(f"removed node {node_id}"))


@client_command(node, "events")
@click.argument("handle", metavar="NODE")
def node_events(handle):
    """A node's events (by id or hostname), oldest first."""
    node_id = resolve_id("node", handle)
    items = list(current_client().paginate(f"/api/v1/nodes/{node_id}/events"))
    emit(items, lambda rows: show_table(rows, EVENT_COLUMNS))


node.add_command(node_validate)
COMMANDS = [node]
