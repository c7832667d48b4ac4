"""`fleetd job`: submit, list, show, logs, cancel, wait, why, share, unshare."""

import json
import os
import re
import shlex
import sys

import click

from fleetd.cli.output import emit, log_printer, money, show_record, show_table, wants_json
from fleetd.cli.params import Duration, GpuCount, Size, load_spec, parse_labels
from fleetd.cli.remote import (
    client_command,
    current_client,
    download_output,
    log_filter_options,
    log_filters,
    read_log_pages,
    resolve_id,
)
from fleetd.client import ClientError


@click.group()
def job():
    """Jobs: submit, list, show, logs, cancel, wait, share."""


JOB_COLUMNS = [
    ("ID", "id"),
    ("NAME", "name"),
    ("OWNER", "owner"),
    ("STATE", "state"),
    ("ATTEMPT", "attempt"),
    ("NODES", lambda j: ",".join(t["node_id"] or "-" for t in j["tasks"])),
    ("SUBMITTED", "submitted_at"),
    ("PENDING REASON", "pending_reason"),
]


@client_command(job, "submit", context_settings={"ignore_unknown_options": False})
@click.option(
    "-f", "--file", "spec_file", type=click.Path(dir_okay=False), help="JobSpec as YAML or JSON."
)
@click.option("--name", help="Job name (default: the command's first word).")
@click.option(
    "--gpus", type=GpuCount(), help="Whole GPUs per node, or a fraction 0 < x < 1 of one GPU."
)
@click.option(
    "--gpu-memory",
    "gpu_memory_bytes",
    type=Size(),
    help="GPU memory of each rank's slice of one GPU, e.g. 20G (binary units: 20G = 20 GiB).",
)
@click.option("--gpu-type", "gpu_types", multiple=True, help="Acceptable GPU model (repeatable).")
@click.option(
    "--cpus",
    type=click.FloatRange(min=0),
    help="Host CPUs per node, reserved and enforced (default: no limit).",
)
@click.option("--num-nodes", type=click.IntRange(min=1), help="Nodes (ranks) of a gang job.")
@click.option(
    "--mig",
    help="A MIG profile, e.g. 1g.10gb: each rank takes --gpus slices of it (default 1).",
)
@click.option(
    "--topology",
    type=click.Choice(["preferred", "required"]),
    help="Whether each rank's GPUs must be the best-linked set its node has (default: preferred).",
)
@click.option(
    "--same-block",
    type=click.Choice(["preferred", "required"]),
    help="Whether a gang's nodes must share one network block (default: preferred).",
)
@click.option("--env", "env", multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--fleet", "fleet_name", help="Run only on nodes of this fleet.")
@click.option("--project", help="Its project's key (default: your default project).")
@click.option("--max-runtime", type=Duration(), help="Stop the job after this long, e.g. 2h.")
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    help=(
        "Extra attempts after a lost node, a preemption or a failure of the job (default: 2, after "
        "a lost node or a preemption only)."
    ),
)
@click.option(
    "--wait",
    "wait_for_end",
    is_flag=True,
    help="Print the job's output while it runs, then its end; exit 0 only if it succeeded.",
)
@click.option(
    "--no-wait-for-capacity",
    "refuse_if_never",
    is_flag=True,
    help=(
        "Refuse the job when no enrolled node could ever hold it, instead of queueing it for nodes "
        "that may join later."
    ),
)
@click.argument("command", nargs=-1)
def job_submit(
    spec_file,
    name,
    gpus,
    gpu_memory_bytes,
    gpu_types,
    cpus,
    num_nodes,
    mig,
    topology,
    same_block,
    env,
    fleet_name,
    project,
    max_runtime,
    retries,
    wait_for_end,
    refuse_if_never,
    command,
):
    """Submit a job: fleetd job submit [OPTIONS] -- COMMAND [ARGS]..."""
    spec = load_spec(spec_file) if spec_file else {}
    if command:
        spec["command"] = list(command)
    if not spec.get("command"):
        raise click.UsageError("give a command after --, or a spec file with one")
    spec.setdefault("name", name or os.path.basename(str(spec["command"][0])) or "job")
    if name:
        spec["name"] = name
    resources = spec.setdefault("resources", {})
    for key, value in (
        ("gpus", gpus),
        ("gpu_memory_bytes", gpu_memory_bytes),
        ("cpus", cpus),
        ("mig", mig),
        ("topology", topology),
    ):
        if value is not None:
            resources[key] = value
    if same_block:
        spec.setdefault("network", {})["same_block"] = same_block
    if gpu_types:
        resources["gpu_types"] = list(gpu_types)
    if num_nodes:
        spec["num_nodes"] = num_nodes
    if env:
        spec["env"] = {**spec.get("env", {}), **parse_labels(env)}
    if fleet_name:
        spec.setdefault("node_selector", {})["fleet"] = fleet_name
    if project:
        spec["project"] = project
    if max_runtime:
        spec["max_runtime_seconds"] = max_runtime
    if retries is not None:
        spec["retry"] = {"max_attempts": retries + 1, "on": ["node_lost", "preempted", "failed"]}
    data = current_client().request(
        "POST",
        "/api/v1/jobs",
        json=spec,
        params={"wait_for_capacity": "false"} if refuse_if_never else None,
    )
    if wait_for_end:
        if wants_json():
            data = _wait_job(data["id"], None)  # stdout is the JSON of the ended job, nothing else
        else:
            # As `docker run`: the job's output as it comes (stderr lines to stderr), then how it
            # ended.
            click.echo(
                f"job {data['id']} {data['state']}; printing its output until it ends "
                f"(Ctrl-C stops the waiting, not the job: `fleetd job cancel {data['id']}`)",
                err=True,
            )
            try:
                data = _follow_logs(data["id"], None, log_printer(len(data["tasks"]) > 1))
            except KeyboardInterrupt:
                job_id = data["id"]
                click.echo(
                    f"\nstopped waiting; job {job_id} goes on (`fleetd job logs -f {job_id}` "
                    f"follows it, `fleetd job cancel {job_id}` stops it)",
                    err=True,
                )
                sys.exit(130)
    emit(
        data,
        lambda d: click.echo(
            f"job {d['id']} {d['state']}"
            + (f": {d['pending_reason']}" if d["pending_reason"] else "")
            + (
                f" ({_result_reason(d['id'])})"
                if wait_for_end and d["state"] != "succeeded"
                else ""
            )
        ),
    )
    if wait_for_end and data["state"] != "succeeded":
        sys.exit(1)


def _result_reason(job_id):
    """Why an ended job did not succeed, as its result says (`rank 1 failed (exit code 3)`)."""
    try:
        return (
            current_client().get(f"/api/v1/jobs/{job_id}/result").get("reason")
            or "no reason recorded"
        )
    except ClientError as exc:
        return f"its result cannot be read: {exc.message}"


@client_command(job, "list")
@click.option(
    "--state",
    type=click.Choice(["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]),
    help="Only jobs in this state.",
)
@click.option("--owner", help="Only jobs submitted by the token of this name.")
@click.option("--name", help="Only jobs of this name.")
def job_list(state, owner, name):
    """List jobs (a submitter sees its own)."""
    items = list(current_client().paginate("/api/v1/jobs", state=state, owner=owner, name=name))
    emit(items, lambda rows: show_table(rows, JOB_COLUMNS))


@client_command(job, "show")
@click.argument("handle", metavar="JOB")
def job_show(handle):
    """Show a job (by id or name) and its ranks."""
    job_id = resolve_id("job", handle)

    def human(d):
        show_record(
            d,
            JOB_COLUMNS[:5]
            + [
                ("STARTED", "started_at"),
                ("ENDED", "ended_at"),
                ("OUTCOME", "outcome"),
                ("PRICE/H", lambda j: money(j.get("price_per_hour"))),
                ("COST", lambda j: money(j.get("cost_so_far"))),
                ("PENDING REASON", "pending_reason"),
                ("COMMAND", lambda j: shlex.join(j["spec"]["command"])),
            ],
        )
        click.echo("")
        show_table(
            d["tasks"],
            [
                ("RANK", "rank"),
                ("TASK", "id"),
                ("NODE", "node_id"),
                ("STATE", "state"),
                ("EXIT", "exit_code"),
                ("GPUS", "gpus"),
                ("REASON", "reason"),
            ],
        )

    emit(current_client().get(f"/api/v1/jobs/{job_id}"), human)


@client_command(job, "logs")
@click.argument("handle", metavar="JOB")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the job ends.")
@click.option(
    "--rank", type=click.IntRange(min=0), help="Only this rank's lines (default: every rank)."
)
@log_filter_options
def job_logs(handle, follow, rank, **filters):
    """Print a job's output in order, by id or name (stderr lines go to stderr): the whole of it,
    from fleetd's output store; filter by time, text and stream."""
    job_id = resolve_id("job", handle)
    if wants_json():

        def show(line):
            click.echo(json.dumps(line, sort_keys=True))
    else:
        show = log_printer(False)
    query = log_filters(**filters)
    if follow:
        _follow_logs(job_id, rank, show, query)
    else:
        _read_logs(job_id, rank, None, show, query)


@client_command(job, "output")
@click.argument("handle", metavar="JOB")
@click.option("-o", "--output", "out_path", help="Write it to this file (default: stdout).")
@click.option("--rank", type=click.IntRange(min=0), help="Only this rank's output.")
@click.option("--attempt", type=click.IntRange(min=1), help="Only this attempt's output.")
@click.option("--stream", type=click.Choice(["stdout", "stderr", "system"]), help="One stream.")
def job_output(handle, out_path, rank, attempt, stream):
    """Download a job's whole output as text, by id or name (several ranks: each under a
    header line)."""
    job_id = resolve_id("job", handle)
    written = download_output(
        f"/api/v1/jobs/{job_id}/output", out_path, rank=rank, attempt=attempt, stream=stream
    )
    if out_path not in (None, "-"):
        click.echo(f"wrote {written} bytes to {out_path}", err=True)


def _read_logs(job_id, rank, after, show, query=None):
    """Print every line of a job's log after `after`; returns the seq of the last one."""
    return read_log_pages(f"/api/v1/jobs/{job_id}/logs", after, show, rank=rank, **(query or {}))


def _follow_logs(job_id, rank, show, query=None):
    """Print a job's lines as they come until it has ended; returns the ended job."""
    client, after = current_client(), None
    for _ in range(100_000_000):  # bounded: a follow of years would still end
        after = _read_logs(job_id, rank, after, show, query)
        data = client.get(f"/api/v1/jobs/{job_id}", wait_seconds=2)
        if data["state"] in JOB_ENDED:
            _read_logs(job_id, rank, after, show, query)  # the lines stored before it ended
            return data
    return data


@client_command(job, "cancel")
@click.argument("handle", metavar="JOB")
@click.option(
    "--wait",
    "wait_for_end",
    is_flag=True,
    help="Wait until its processes have stopped (the job is cancelled), not only until asked.",
)
def job_cancel(handle, wait_for_end):
    """Cancel a job (by id or name): `cancelling` while its nodes stop its processes, then
    `cancelled`."""
    job_id = resolve_id("job", handle)
    data = current_client().post(f"/api/v1/jobs/{job_id}/cancel")
    if wait_for_end and data["state"] not in JOB_ENDED:
        data = _wait_job(job_id, None)

    def human(d):
        if d["state"] == "cancelling":
            click.echo(
                f"job {job_id} cancelling: its processes are being stopped "
                f"(`fleetd job wait {job_id}` waits until they have)"
            )
        else:
            click.echo(f"job {job_id} {d['state']}")

    emit(data, human)


JOB_ENDED = ("succeeded", "failed", "cancelled")  # `cancelling` is not: its processes may still run


def _wait_job(job_id, timeout):
    import time

    client = current_client()
    deadline = None if timeout is None else time.monotonic() + timeout
    for _ in range(10_000_000):
        left = 30 if deadline is None else max(0, min(30, deadline - time.monotonic()))
        data = client.get(f"/api/v1/jobs/{job_id}", wait_seconds=left)
        if data["state"] in JOB_ENDED or (deadline and time.monotonic() >= deadline):
            return data
    return data


@client_command(job, "wait")
@click.argument("handle", metavar="JOB")
@click.option("--timeout", type=Duration(), help="Give up after this long (exit 2).")
def job_wait(handle, timeout):
    """Wait for a job (by id or name) to end; exit 0 if it succeeded, 1 if not, 2 on timeout."""
    job_id = resolve_id("job", handle)
    data = _wait_job(job_id, timeout)
    emit(
        data,
        lambda d: click.echo(
            f"job {job_id} {d['state']}" + (f" ({d['outcome']})" if d.get("outcome") else "")
        ),
    )
    if data["state"] not in JOB_ENDED:
        sys.exit(2)
    if data["state"] != "succeeded":
        sys.exit(1)


@client_command(job, "why")
@click.argument("handle", metavar="JOB")
def job_why(handle):
    """Why a job (by id or name) waits: its pending reason and, per node, the filter that rejects
    it."""
    job_id = resolve_id("job", handle)
    client = current_client()
    data = client.get(f"/api/v1/jobs/{job_id}")
    if data["state"] != "queued":

        def placed(d):
            click.echo(
                f"job {job_id} is {data['state']}: it waits for nothing"
                + (
                    ""
                    if data["state"] in JOB_ENDED
                    else f" (`fleetd job show {job_id}` says where it runs)"
                )
            )
            for task in data.get("tasks") or ():
                if task.get("link_class"):  # which GPUs it got and how they are linked
                    click.echo(
                        f"rank {task['rank']} on {task['node_id']}: GPUs "
                        f"{', '.join(task['gpus'])}, weakest link {task['link_class']}"
                    )
                if " in block " in (task.get("reason") or ""):  # a gang's block, leaf and why
                    click.echo(f"rank {task['rank']}: {task['reason']}")

        emit({"job": data, "simulation": None}, placed)
        return
    explanation = client.post("/api/v1/cluster/simulate-schedule", data["spec"])
    result = {"job": data, "simulation": explanation}
    # A rule (a quota, a bid, a set-aside) holds the job before any node is tried; where it would go
    # once that is lifted is a simulation without the job's team (and so without its quota).
    blocker = explanation.get("error") or (
        data["pending_reason"] if _RULE_RE.search(data["pending_reason"] or "") else None
    )
    if blocker and not explanation["schedulable"] and data["spec"].get("team"):
        explanation = client.post(
            "/api/v1/cluster/simulate-schedule", dict(data["spec"], team=None)
        )
        result["simulation"] = explanation

    def human(d):
        if blocker:
            click.echo(f"job {job_id} is queued, blocked: {blocker}")
            if explanation["schedulable"]:
                click.echo(
                    "it would go to "
                    + ", ".join(p["node_id"] for p in explanation["placement"])
                    + " once that is lifted"
                )
        else:
            click.echo(
                f"job {job_id} is queued"
                + (f": {data['pending_reason']}" if data["pending_reason"] else "")
            )
            if explanation["schedulable"]:
                click.echo(
                    "it fits now on "
                    + ", ".join(p["node_id"] for p in explanation["placement"])
                    + " (the scheduler places it within moments)"
                )
                for p in explanation["placement"]:
                    if p.get("link_note"):  # which GPU set it would get, and why
                        click.echo(f"rank {p['rank']} on {p['node_id']}: {p['link_note']}")
                    if p.get("block"):  # which block and leaf a gang's rank would get
                        click.echo(
                            f"rank {p['rank']} on {p['node_id']}: block {p['block']}"
                            + (f", leaf {p['leaf']}" if p.get("leaf") else "")
                        )
                notes = {p.get("network_note") for p in explanation["placement"]} - {None, ""}
                for note in sorted(notes):  # why the gang would go to those blocks
                    click.echo(note)
        if not explanation["schedulable"] and explanation["filter_detail"]:
            show_table(
                explanation["filter_detail"],
                [("NODE", "node_id"), ("STAGE", "stage"), ("REASON", "reason")],
            )

    emit(result, human)


@client_command(job, "share")
@click.argument("handle", metavar="JOB")
@click.option(
    "--expires-in",
    type=Duration(),
    help="The link stops working this long from now, e.g. 7d (default: when revoked).",
)
def job_share(handle, expires_in):
    """Make a read-only link to a job (by id or name) that anyone may open without a token: its
    state, result and the tail of its output. The link is shown this once."""
    job_id = resolve_id("job", handle)
    body = {} if expires_in is None else {"expires_in_seconds": expires_in}
    data = current_client().post(f"/api/v1/jobs/{job_id}/share", body)

    def human(d):
        click.echo(d["url"])
        if d.get("expires_at"):
            click.echo(f"expires {d['expires_at']}", err=True)
        click.echo(f"revoke it with: fleetd job unshare {d['token']}", err=True)

    emit(data, human)


@client_command(job, "unshare")
@click.argument("link", metavar="TOKEN")
def job_unshare(link):
    """Revoke a job's share link, given its token or the whole link: it stops working at once."""
    token = link.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    current_client().delete(f"/api/v1/shares/{token}")
    emit({"revoked": True}, lambda d: click.echo("share link revoked"))


# (fleetd/services/placement/scheduling.py).
_RULE_RE = re.compile(r"at its quota|spot minimum|^set aside:")


COMMANDS = [job]
