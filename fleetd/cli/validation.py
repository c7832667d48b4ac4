"""The validation gate and GPU history on the command line: `fleetd node validate`, `fleetd gpu show|rma`,
the options of a fleet's validation (fleet create, update) and what `node show` prints of a validation."""

import shlex
import time

import click

from fleetd.cli.output import EVENT_COLUMNS, emit, show_record, show_table
from fleetd.cli.params import Duration
from fleetd.cli.remote import client_command, current_client, resolve_id
from fleetd.client import ClientError

POLL_SECONDS = 1.0


def validation_options(fn):
    """--validation/--no-validation, --validation-command, --validation-timeout and --dcgm-level."""
    fn = click.option("--dcgm-level", type=click.IntRange(0, 4), default=None,
                      help="Run `dcgmi diag -r N` where DCGM is installed (default 1; 0: never).")(fn)
    fn = click.option("--validation-timeout", type=Duration(), default=None,
                      help="Time limit of --validation-command (default 10m).")(fn)
    fn = click.option("--validation-command", default=None, metavar="COMMAND",
                      help="A command nodes also run to validate (a burn-in, an NCCL test), as an unprivileged "
                           "user; it must exit 0. Split like a shell would.")(fn)
    fn = click.option("--validation/--no-validation", "validation", default=None,
                      help="Validate new and repaired nodes before they take work (fleet create: on).")(fn)
    return fn


def validation_body(validation, command, timeout, dcgm_level, default):
    """The `validation` field of a fleet's body: None (no gate), a dict, or `default` when nothing was said
    (... for update: leave it as it is)."""
    detail = {}
    if command is not None:
        detail["command"] = shlex.split(command)
    if timeout is not None:
        detail["timeout_seconds"] = int(timeout)
    if dcgm_level is not None:
        detail["dcgm_level"] = dcgm_level
    if validation is False:
        if detail:
            raise click.UsageError("--no-validation takes no other validation option")
        return None
    if validation is None and not detail:
        return default
    return detail


def describe_validation(fleet):
    """A fleet's gate in words."""
    setting = fleet.get("validation")
    if setting is None:
        return "none: nodes take work at their first heartbeat (set it with --validation)"
    parts = [f"built-in checks{'' if not setting.get('checks') else ' ' + ', '.join(setting['checks'])}"]
    parts.append(f"dcgmi diag -r {setting.get('dcgm_level', 1)}" if setting.get("dcgm_level", 1) else "no DCGM")
    if setting.get("command"):
        parts.append(f"then `{shlex.join(setting['command'])}` (limit {setting.get('timeout_seconds') or 600} s)")
    return "new and repaired nodes must pass: " + "; ".join(parts)


def _check_rows(checks):
    return [dict(c, where="node" if c.get("gpu") is None else f"GPU {c['gpu']}" + (
        f" ({c['serial']})" if c.get("serial") else "")) for c in checks]


CHECK_COLUMNS = [("CHECK", "name"), ("WHERE", "where"), ("RESULT", "status"), ("DETAIL", "detail")]


def show_validation(data, only_failed=False):
    """A validation: its state, then its checks (with `only_failed`, those that did not pass)."""
    show_record(data, [("VALIDATION", "id"), ("STATE", "state"), ("REASON", "reason"), ("STARTED", "started_at"),
                       ("FINISHED", "finished_at"), ("RETURNS TO", "returns_to")])
    checks = [c for c in data["checks"] if not only_failed or c["status"] == "failed"]
    if checks:
        click.echo("")
        show_table(_check_rows(checks), CHECK_COLUMNS)
    for check in data["checks"]:
        if check.get("output") and check["status"] == "failed":
            click.echo(f"\n{check['name']} output (end):\n{check['output'].rstrip()}")


def node_validation(node_id):
    """The node's latest validation, or None when it has none."""
    try:
        return current_client().get(f"/api/v1/nodes/{node_id}/validation")
    except ClientError as exc:
        if exc.status == 404:
            return None
        raise


@client_command(None, "validate")  # a command of `fleetd node` (fleetd.cli.nodes adds it)
@click.argument("handle", metavar="NODE")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for the result and print it.")
@click.option("--timeout", type=Duration(), default="2h", show_default=True, help="How long --wait waits.")
def node_validate(handle, wait, timeout):
    """Validate a node (by id or hostname) now: it takes no new work until its checks pass, then returns to
    where it was (ready, cordoned or drained); refused while tasks run on it."""
    node_id = resolve_id("node", handle)
    client = current_client()
    client.post(f"/api/v1/nodes/{node_id}/validate")
    data = node_validation(node_id)
    deadline = time.monotonic() + timeout
    while wait and data["state"] == "running" and time.monotonic() < deadline:  # bounded by --timeout
        time.sleep(POLL_SECONDS)
        data = node_validation(node_id)
    status = client.get(f"/api/v1/nodes/{node_id}")["status"]

    def human(d):
        if d["state"] == "running":
            click.echo(f"validating node {node_id}" + (" (still running; see `fleetd node show`)" if wait else ""))
            return
        show_validation(d, only_failed=d["state"] == "passed")
        click.echo(f"\nnode {node_id}: validation {d['state']}; now {status}")

    emit(data, human)
    if data["state"] == "failed":
        raise SystemExit(1)


@click.group()
def gpu():
    """GPU boards by serial number: history across hosts, RMA."""


def _show_gpu(data):
    show_record(data, [("SERIAL", "serial"), ("UUID", "uuid"), ("MODEL", "model"),
                       ("BOARD PART", "board_part_number"), ("VBIOS", "vbios"),
                       ("NODE", lambda d: d["node_id"] and f"{d['node_id']} ({d.get('hostname')}), GPU {d['index']}"),
                       ("HEALTHY", "healthy"), ("HEALTH", "health_reason"), ("ECC ERRORS", "ecc_uncorrected"),
                       ("RMA", lambda d: d["rma"] and f"{d['rma']['reason']} ({d['rma']['at']}, {d['rma']['actor']})"),
                       ("FLAGGED", lambda d: d["flagged"] or None), ("FIRST SEEN", "first_seen_at"),
                       ("LAST SEEN", "last_seen_at")])
    if data["history"]:
        click.echo("")
        show_table(data["history"], [c for c in EVENT_COLUMNS if c[0] not in ("FROM", "TO")], title="history")


@client_command(gpu, "show")
@click.argument("serial")
@click.option("--history", "limit", type=click.IntRange(1, 1000), default=200, show_default=True,
              help="Events of its history shown (the latest).")
def gpu_show(serial, limit):
    """A GPU by serial number: where it is, its health, RMA mark, and its history across hosts (XIDs, ECC
    errors, validations, health actions)."""
    emit(current_client().get(f"/api/v1/gpus/{serial}", limit=limit), _show_gpu)


@client_command(gpu, "rma")
@click.argument("serial")
@click.option("--reason", required=True, help="Why (kept with the mark and in the GPU's history).")
@click.option("--deadline", type=Duration(), default="1h", show_default=True,
              help="Drain deadline of its node: its running tasks are stopped after this.")
def gpu_rma(serial, reason, deadline):
    """Mark a GPU for RMA: it takes no more work, its node is drained for repair (undrained, the node
    validates first), and the board is flagged wherever it shows up again."""
    data = current_client().post(f"/api/v1/gpus/{serial}/rma", {"reason": reason, "deadline_seconds": deadline})
    node_text = f"; node {data['node_id']} drained for repair" if data.get("node_id") else ""
    emit(data, lambda d: click.echo(f"GPU {serial} marked for RMA{node_text}"))


COMMANDS = [gpu]
