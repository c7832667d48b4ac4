"""The validation gate and GPU history on the command line: `fleetd node validate`,
`fleetd gpu show|rma`, the options of a fleet's validation (fleet create, update) and what
`node show` prints of a validation."""

import functools
import shlex
import time
from typing import Any

import click

from fleetd.cli.output import EVENT_COLUMNS, emit, show_record, show_table
from fleetd.cli.params import Duration
from fleetd.cli.remote import client_command, current_client, resolve_id
from fleetd.client import ClientError

POLL_SECONDS = 1.0


# The CLI's options of a fleet's validation setting, in the order `--help` lists them: (option,
# the setting's key, click's keywords). Each value goes through the API's own schema before it is
# sent.
_SETTING_OPTIONS: tuple[
    tuple[str, str, dict[str, Any]], ...
] = (  # click.option's keywords: of many types
    (
        "--validation-check",
        "checks",
        dict(
            multiple=True,
            metavar="CHECK",
            help="A built-in check to run, repeatable (default: every one; the "
            "names are in docs/validation.md, e.g. pcie_link).",
        ),
    ),
    (
        "--dcgm-level",
        "dcgm_level",
        dict(
            type=click.IntRange(0, 4),
            help="Run `dcgmi diag -r N` where DCGM is installed (default 1; 0: never).",
        ),
    ),
    (
        "--validation-command",
        "command",
        dict(
            metavar="COMMAND",
            help="A command nodes also run to validate (a burn-in, an NCCL test), as an "
            "unprivileged user; it must exit 0. Split like a shell would.",
        ),
    ),
    (
        "--validation-timeout",
        "timeout_seconds",
        dict(type=Duration(), help="Time limit of --validation-command (default 10m)."),
    ),
    (
        "--validation-command-as-root",
        "command_as_root",
        dict(
            is_flag=True,
            default=None,
            help="Run --validation-command as root (default: as an unprivileged user).",
        ),
    ),
    (
        "--expected-gpus",
        "expected_gpus",
        dict(type=int, help="GPUs every node must have (default: as many as the node reports)."),
    ),
    (
        "--driver-version",
        "driver_version",
        dict(
            help="Pin the driver version nodes must run, e.g. 550.54.15 "
            "(default: what most of the fleet's validated nodes run)."
        ),
    ),
    (
        "--cuda-version",
        "cuda_version",
        dict(help="Pin the CUDA driver version, e.g. 12.4 (default: the fleet's most common)."),
    ),
    (
        "--mig-mode",
        "mig_mode",
        dict(
            type=click.Choice(["enabled", "disabled"]),
            help="The MIG mode every GPU must be in (default: any, no change pending).",
        ),
    ),
    (
        "--max-temperature",
        "max_temperature_c",
        dict(type=int, metavar="CELSIUS", help="The hottest an idle GPU may be (default 85)."),
    ),
    (
        "--pcie-width",
        "pcie_width",
        dict(
            type=int,
            help="The PCIe link width each GPU's link must reach at its maximum (default 16).",
        ),
    ),
)


def validation_options(default):
    """--validation/--no-validation and one option per key of a fleet's validation setting; the
    command receives them as one `validation` argument: the setting (validation_body), or `default`
    when none was given."""

    def decorate(fn):
        @functools.wraps(fn)
        def command(**kwargs):
            given = {key: kwargs.pop(key) for _, key, _ in _SETTING_OPTIONS}
            kwargs["validation"] = validation_body(kwargs.pop("validation"), given, default)
            return fn(**kwargs)

        for option, key, extra in reversed(_SETTING_OPTIONS):
            extra = dict(extra)
            extra.setdefault("default", None)
            command = click.option(option, key, **extra)(command)
        return click.option(
            "--validation/--no-validation",
            "validation",
            default=None,
            help="Validate new and repaired nodes before they take work (fleet create: on). "
            "The other validation options replace a fleet's whole setting.",
        )(command)

    return decorate


def validation_body(validation, given, default):
    """The `validation` field of a fleet's body from the options `given` ({setting key: value or
    None}): None (no gate), the setting, loaded through the API's schema (a bad value is a usage
    error here, with the API's words), or `default` when nothing was said (... for update: leave it
    as it is)."""
    # The server's own rules; imported here, so that the CLI loads no server module until it needs
    # one.
    from fleetd.schemas.validation import ValidationSettingSchema

    detail = {
        key: value
        for key, value in given.items()
        if value is not None and value is not False and value != ()
    }
    if "command" in detail:
        detail["command"] = shlex.split(detail["command"])
    if "timeout_seconds" in detail:
        detail["timeout_seconds"] = int(detail["timeout_seconds"])
    if "checks" in detail:
        detail["checks"] = list(detail["checks"])
    if validation is False:
        if detail:
            raise click.UsageError("--no-validation takes no other validation option")
        return None
    if validation is None and not detail:
        return default
    errors = ValidationSettingSchema().validate(detail)
    if errors:
        flags = {key: option for option, key, _ in _SETTING_OPTIONS}
        said = "; ".join(
            f"{flags.get(key, key)}: {' '.join(_flatten(msgs))}"
            for key, msgs in sorted(errors.items())
        )
        raise click.UsageError(f"bad validation setting: {said}")
    return detail


def _flatten(messages):
    if isinstance(messages, dict):
        return [m for value in messages.values() for m in _flatten(value)]
    if isinstance(messages, list):
        return [m for value in messages for m in _flatten(value)]
    return [str(messages)]


def describe_validation(fleet):
    """A fleet's gate in words."""
    setting = fleet.get("validation")
    if setting is None:
        return "none: nodes take work at their first heartbeat (set it with --validation)"
    parts = [
        f"built-in checks{'' if not setting.get('checks') else ' ' + ', '.join(setting['checks'])}"
    ]
    parts.append(
        f"dcgmi diag -r {setting.get('dcgm_level', 1)}"
        if setting.get("dcgm_level", 1)
        else "no DCGM"
    )
    pins = [
        text.format(setting[key])
        for key, text in (
            ("expected_gpus", "{} GPUs"),
            ("driver_version", "driver {}"),
            ("cuda_version", "CUDA {}"),
            ("mig_mode", "MIG {}"),
            ("max_temperature_c", "idle below {} °C"),
            ("pcie_width", "PCIe x{}"),
        )
        if setting.get(key) is not None
    ]
    if pins:
        parts.append(", ".join(pins))
    if setting.get("command"):
        parts.append(
            f"then `{shlex.join(setting['command'])}` (limit "
            f"{setting.get('timeout_seconds') or 600} s"
            + (", as root)" if setting.get("command_as_root") else ")")
        )
    return "new and repaired nodes must pass: " + "; ".join(parts)


def _check_rows(checks):
    return [
        dict(
            c,
            where="node"
            if c.get("gpu") is None
            else f"GPU {c['gpu']}" + (f" ({c['serial']})" if c.get("serial") else ""),
        )
        for c in checks
    ]


CHECK_COLUMNS = [("CHECK", "name"), ("WHERE", "where"), ("RESULT", "status"), ("DETAIL", "detail")]


def show_validation(data, only_failed=False):
    """A validation: its state, then its checks (with `only_failed`, those that did not pass)."""
    show_record(
        data,
        [
            ("VALIDATION", "id"),
            ("STATE", "state"),
            ("REASON", "reason"),
            ("STARTED", "started_at"),
            ("FINISHED", "finished_at"),
            ("RETURNS TO", "returns_to"),
        ],
    )
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
@click.option(
    "--wait/--no-wait", default=True, show_default=True, help="Wait for the result and print it."
)
@click.option(
    "--timeout", type=Duration(), default="2h", show_default=True, help="How long --wait waits."
)
def node_validate(handle, wait, timeout):
    """Validate a node (by id or hostname) now: it takes no new work until its checks pass, then
    returns to where it was (ready, cordoned or drained); refused while tasks run on it."""
    node_id = resolve_id("node", handle)
    client = current_client()
    client.post(f"/api/v1/nodes/{node_id}/validate")
    data = node_validation(node_id)
    deadline = time.monotonic() + timeout
    while (
        wait and data["state"] == "running" and time.monotonic() < deadline
    ):  # bounded by --timeout
        time.sleep(POLL_SECONDS)
        data = node_validation(node_id)
    status = client.get(f"/api/v1/nodes/{node_id}")["status"]

    def human(d):
        if d["state"] == "running":
            click.echo(
                f"validating node {node_id}"
                + (" (still running; see `fleetd node show`)" if wait else "")
            )
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
    show_record(
        data,
        [
            ("SERIAL", "serial"),
            ("UUID", "uuid"),
            ("MODEL", "model"),
            ("BOARD PART", "board_part_number"),
            ("VBIOS", "vbios"),
            (
                "NODE",
                lambda d: (
                    d["node_id"] and f"{d['node_id']} ({d.get('hostname')}), GPU {d['index']}"
                ),
            ),
            ("HEALTHY", "healthy"),
            ("HEALTH", "health_reason"),
            ("ECC ERRORS", "ecc_uncorrected"),
            (
                "RMA",
                lambda d: (
                    d["rma"] and f"{d['rma']['reason']} ({d['rma']['at']}, {d['rma']['actor']})"
                ),
            ),
            ("FLAGGED", lambda d: d["flagged"] or None),
            ("MIG BLOCKED", lambda d: d.get("mig_blocked") or None),
            ("FIRST SEEN", "first_seen_at"),
            ("LAST SEEN", "last_seen_at"),
        ],
    )
    if data["history"]:
        click.echo("")
        show_table(
            data["history"],
            [c for c in EVENT_COLUMNS if c[0] not in ("FROM", "TO")],
            title="history",
        )


@client_command(gpu, "list")
@click.option(
    "--state",
    type=click.Choice(["all", "rma", "flagged", "ok", "mig_blocked"]),
    default="all",
    show_default=True,
    help=(
        "rma: marked for RMA; flagged: marked and seen again in a node; ok: neither; "
        "mig_blocked: a dynamic MIG repartition failed on it."
    ),
)
@click.option("--model", help="Only boards of this model.")
def gpu_list(state, model):
    """GPU boards fleetd has seen, by serial: where each is, its model and RMA mark."""
    items = list(current_client().paginate("/api/v1/gpus", state=state, model=model))
    emit(
        items,
        lambda rows: show_table(
            rows,
            [
                ("SERIAL", "serial"),
                ("MODEL", "model"),
                ("NODE", lambda d: d["node_id"] and f"{d['node_id']} ({d.get('hostname')})"),
                ("GPU", "index"),
                ("RMA", lambda d: d["rma"] and d["rma"]["reason"]),
                ("FLAGGED", lambda d: d["flagged"] or None),
                ("MIG BLOCKED", lambda d: d.get("mig_blocked") or None),
                ("LAST SEEN", "last_seen_at"),
            ],
        ),
    )


@client_command(gpu, "clear-rma")
@click.argument("serial")
def gpu_clear_rma(serial):
    """Clear a GPU's RMA mark (a repaired or replaced board returns); its node stays as it is."""
    data = current_client().delete(f"/api/v1/gpus/{serial}/rma")
    emit(data, lambda d: click.echo(f"GPU {serial}: RMA mark cleared"))


@client_command(gpu, "clear-mig-block")
@click.argument("serial")
def gpu_clear_mig_block(serial):
    """Clear a GPU's dynamic MIG block (a repartition failed there): it takes work again."""
    data = current_client().delete(f"/api/v1/gpus/{serial}/mig-block")
    emit(data, lambda d: click.echo(f"GPU {serial}: MIG block cleared"))


@client_command(gpu, "show")
@click.argument("serial")
@click.option(
    "--history",
    "limit",
    type=click.IntRange(1, 1000),
    default=200,
    show_default=True,
    help="Events of its history shown (the latest).",
)
def gpu_show(serial, limit):
    """A GPU by serial number: where it is, its health, RMA mark, and its history across hosts
    (XIDs, ECC errors, validations, health actions)."""
    emit(current_client().get(f"/api/v1/gpus/{serial}", limit=limit), _show_gpu)


@client_command(gpu, "rma")
@click.argument("serial")
@click.option("--reason", required=True, help="Why (kept with the mark and in the GPU's history).")
@click.option(
    "--deadline",
    type=Duration(),
    default="1h",
    show_default=True,
    help="Drain deadline of its node: its running tasks are stopped after this.",
)
def gpu_rma(serial, reason, deadline):
    """Mark a GPU for RMA: it takes no more work, its node is drained for repair (undrained, the
    node validates first), and the board is flagged wherever it shows up again."""
    data = current_client().post(
        f"/api/v1/gpus/{serial}/rma", {"reason": reason, "deadline_seconds": deadline}
    )
    node_text = f"; node {data['node_id']} drained for repair" if data.get("node_id") else ""
    emit(data, lambda d: click.echo(f"GPU {serial} marked for RMA{node_text}"))


COMMANDS = [gpu]
