"""`fleetd rollout`: start (drives a rollout over SSH; needs the provision extra), status, pause,
resume, abort (from any machine: the rollout lives in fleetd)."""

import click

from fleetd.cli.lazy import load_command
from fleetd.cli.output import emit, show_record, show_table
from fleetd.cli.remote import client_command, current_client


class _RolloutGroup(click.Group):
    """`start` drives SSH (Fabric): imported only when used, as `fleetd bootstrap` is."""

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | {"start"})

    def get_command(self, ctx, name):
        if name != "start":
            return super().get_command(ctx, name)
        return load_command("rollout start", "fleetd.provision.cli:rollout_start")


@click.group(cls=_RolloutGroup)
def rollout():
    """Rollouts of a bundle over a fleet: start, status, pause, resume, abort, retry."""


NODE_COLUMNS = [
    ("NODE", "node_id"),
    ("HOST", lambda n: n["address"] or n["hostname"]),
    ("BATCH", "batch"),
    ("CANARY", lambda n: "yes" if n["canary"] else ""),
    ("STATE", "state"),
    ("DETAIL", "detail"),
]


def _window(rollout):
    """A rollout's window as --window wrote it: "sat,sun 00:00-23:59, 22:00-06:00 (Europe/Paris)";
    "any time"."""
    window = rollout.get("window")
    if not window:
        return "any time"
    spans = [
        (",".join(w["days"]) + " " if w.get("days") else "") + f"{w['start']}-{w['end']}"
        for w in window["windows"]
    ]
    return f"{', '.join(spans)} ({window.get('timezone') or 'UTC'})"


def show_rollout(data):
    """A rollout and its nodes, as `rollout status ID` and `rollout start` print them."""
    show_record(
        data,
        [
            ("ID", "id"),
            ("FLEET", "fleet"),
            ("BUNDLE", lambda r: f"{r['bundle_version']} (sha256 {r['bundle_sha256'][:12]})"),
            ("STATE", "state"),
            ("REASON", "state_reason"),
            ("BATCH", "batch"),
            ("CANARY", "canary"),
            ("MAX FAILURES", "max_failures"),
            ("WINDOW", _window),
            ("STARTED", "created_at"),
            ("BY", "created_by"),
        ],
    )
    click.echo("")
    show_table(data["nodes"], NODE_COLUMNS)


@client_command(rollout, "status")
@click.argument("rollout_id", required=False, metavar="[ROLLOUT]")
@click.option("--fleet", "fleet_name", help="Without ROLLOUT: only rollouts of this fleet.")
def rollout_status(rollout_id, fleet_name):
    """Show a rollout and each of its nodes; without ROLLOUT, list the rollouts."""
    client = current_client()
    if rollout_id:
        emit(client.get(f"/api/v1/rollouts/{rollout_id}"), show_rollout)
        return
    items = list(client.paginate("/api/v1/rollouts", fleet=fleet_name))
    emit(
        items,
        lambda rows: show_table(
            rows,
            [
                ("ID", "id"),
                ("FLEET", "fleet"),
                ("BUNDLE", "bundle_version"),
                ("STATE", "state"),
                (
                    "NODES",
                    lambda r: (
                        f"{sum(n['state'] == 'done' for n in r['nodes'])}/{len(r['nodes'])} done"
                    ),
                ),
                ("REASON", "state_reason"),
            ],
        ),
    )


def _request(action, help_text):
    def command(rollout_id):
        data = current_client().post(f"/api/v1/rollouts/{rollout_id}/{action}")
        emit(
            data, lambda d: click.echo(f"rollout {rollout_id}: {d['state']} ({d['state_reason']})")
        )

    command.__doc__ = help_text
    return client_command(rollout, action)(click.argument("rollout_id", metavar="ROLLOUT")(command))


rollout_pause = _request(
    "pause", "Pause a rollout: its driver begins no further node until it is resumed."
)
rollout_resume = _request(
    "resume", "Resume a paused rollout (paused by fleetd after a failure, or by an operator)."
)
rollout_abort = _request(
    "abort", "Abort a rollout: no further node begins; a node being upgraded finishes."
)
rollout_retry = _request(
    "retry",
    "Retry a paused rollout's failed nodes: its driver (`fleetd rollout start`, waiting while "
    "it is paused) takes them again. An ended rollout is started anew.",
)

COMMANDS = [rollout]
