"""`fleetd instance`: long-running reserved GPU workloads."""

import json
import os
import shlex
import sys

import click

from fleetd.cli.output import (
    EVENT_COLUMNS,
    byte_size,
    describe_error,
    emit,
    fail,
    log_printer,
    money,
    number,
    show_record,
    show_table,
    span,
    wants_json,
)
from fleetd.cli.params import Duration, GpuCount, Size, load_spec, parse_duration, parse_labels
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
def instance():
    """Instances: long-running reserved GPU workloads (create, list, show, stop, resume, rm,
    connect, logs)."""


# The states in which an instance's processes have ended (docs/api.md, Instance states): only a
# resume (or, after a lost node, the node's return) runs it again.
INSTANCE_AT_REST = ("stopped", "interrupted", "failed", "deleted")
INSTANCE_STATES = [
    "pending",
    "starting",
    "running",
    "restarting",
    "stopping",
    "stopped",
    "interrupted",
    "failed",
    "deleting",
    "deleted",
]
# Long polls ask for less than the client's 30 s read timeout, so that a full wait is never taken
# for a dead server.
_LONG_POLL_SECONDS = 25


class PortSpec(click.ParamType):
    """PORT or PORT/http or PORT/tcp -> {port, protocol}."""

    name = "port[/http|/tcp]"

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        port, slash, protocol = value.strip().partition("/")
        protocol = protocol.lower()
        if (
            not port.isdigit()
            or not 1 <= int(port) <= 65535
            or (slash and protocol not in ("http", "tcp"))
        ):
            self.fail(
                f"{value!r} is not PORT, PORT/http or PORT/tcp with 1 <= PORT <= 65535", param, ctx
            )
        return (
            {"port": int(port), "protocol": protocol} if slash else {"port": int(port)}
        )  # fleetd: http


class IdleStop(click.ParamType):
    """PCT:DURATION -> {gpu_util_below_percent, for_seconds}."""

    name = "pct:duration"

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        percent, sep, duration = value.strip().partition(":")
        below: float | None
        try:
            below = float(percent)
            seconds = parse_duration(duration) if sep else None
        except (ValueError, click.BadParameter):
            below = seconds = None
        if below is None or seconds is None or not 0 <= below <= 100:
            self.fail(
                f"{value!r} is not PERCENT:DURATION like 5:30m (stop once every GPU stayed under "
                "5% utilization for 30 minutes)",
                param,
                ctx,
            )
        return {
            "gpu_util_below_percent": int(below) if below.is_integer() else below,
            "for_seconds": seconds,
        }


def _instance_ports(inst):
    """Declared ports, each with the node's public port once it runs: `8888/http->31001`."""
    published = {p["private_port"]: p for p in ((inst.get("runtime") or {}).get("ports") or [])}
    out = []
    for port in (inst.get("spec") or {}).get("ports") or []:
        text = f"{port['port']}/{port.get('protocol') or 'http'}"
        public = published.get(port["port"])
        if public and public.get("public_port"):
            text += f"->{public['public_port']}"
        out.append(text)
    return (
        ", ".join(out) or None
    )  # a space: a narrow terminal wraps the list rather than cutting it


def _instance_gpus(inst):
    resources = (inst.get("spec") or {}).get("resources") or {}
    text = number(resources.get("gpus") or 0)
    return text + (f" ({','.join(resources['gpu_types'])})" if resources.get("gpu_types") else "")


INSTANCE_COLUMNS = [
    ("ID", "id"),
    ("NAME", "name"),
    ("STATE", "state"),
    ("NODE", "node_id"),
    ("GPUS", _instance_gpus),
    ("PORTS", _instance_ports),
    ("PRICE/H", lambda i: money(i.get("price_per_hour"))),
    ("COST", lambda i: money(i.get("cost_so_far"))),
    ("PENDING REASON", "pending_reason"),
]


def _instance_line(d):
    """`instance ID STATE: reason` as submit prints a job: why it waits, or why it failed, restarts
    or was interrupted."""
    reason = d.get("pending_reason") or (
        d.get("status_reason") if d["state"] in ("failed", "restarting", "interrupted") else ""
    )
    return f"instance {d['id']} {d['state']}" + (f": {reason}" if reason else "")


def _read_instance(client, instance_id, wait_seconds):
    """The instance, answered as soon as its state changes; a deleted one (404 once it is gone) as
    `{id, state: deleted}`."""
    try:
        return client.get(f"/api/v1/instances/{instance_id}", wait_seconds=wait_seconds)
    except ClientError as exc:
        if exc.status != 404:
            raise
        return {
            "id": instance_id,
            "state": "deleted",
            "pending_reason": "",
            "status_reason": "deleted",
        }


def _wait_instance(instance_id, done, timeout=None, on_change=None):
    """Ask for the instance (answered as soon as its state changes) until `done(instance)`; returns
    the last answer, which is not done only when `timeout` seconds passed."""
    import time

    client = current_client()
    deadline = None if timeout is None else time.monotonic() + timeout
    data, seen = None, None
    for _ in range(10_000_000):  # bounded: a wait of years would still end
        left = (
            _LONG_POLL_SECONDS
            if deadline is None
            else max(0, min(_LONG_POLL_SECONDS, deadline - time.monotonic()))
        )
        data = _read_instance(client, instance_id, round(left, 1))
        now_seen = (data["state"], data.get("pending_reason"))
        if on_change and now_seen != seen:
            on_change(data)
        seen = now_seen
        if done(data) or (deadline is not None and time.monotonic() >= deadline):
            return data
    return data


def _at_rest(d):
    """Nothing more happens by itself: stopped, failed, deleted, or interrupted by preemption (an
    instance whose node was lost runs on by itself when the node is back)."""
    return d["state"] in INSTANCE_AT_REST and not (
        d["state"] == "interrupted" and d.get("interruption") == "node_lost"
    )


def _running_or_at_rest(d):
    return d["state"] == "running" or _at_rest(d)


def _wait_running(instance_id, data, timeout, verb):
    """--wait of create and resume: until it runs (exit 0), or rests (exit 1), or the timeout
    (exit 2)."""
    quiet = wants_json()

    def tell(d):
        if not quiet:
            click.echo(_instance_line(d), err=True)

    if data["state"] != "running":
        if not quiet:
            click.echo(
                f"instance {instance_id} {data['state']}; waiting until it runs (Ctrl-C stops the "
                f"waiting, not the instance: `fleetd instance stop {instance_id}`)",
                err=True,
            )
        try:
            data = _wait_instance(instance_id, _running_or_at_rest, timeout, tell)
        except KeyboardInterrupt:
            click.echo(
                f"\nstopped waiting; instance {instance_id} was {verb} and goes on "
                f"(`fleetd instance show {instance_id}` shows it)",
                err=True,
            )
            sys.exit(130)
    emit(data, lambda d: click.echo(_instance_line(d)))
    if data["state"] != "running":
        sys.exit(1 if _at_rest(data) else 2)


@client_command(instance, "create")
@click.option(
    "-f",
    "--file",
    "spec_file",
    type=click.Path(dir_okay=False),
    help="InstanceSpec as YAML or JSON; the options below override it.",
)
@click.option(
    "--name", help="Instance name (default: the command's first word, or the image's name)."
)
@click.option("--gpus", type=GpuCount(), help="GPUs to reserve.")
@click.option(
    "--gpu-memory",
    "gpu_memory_bytes",
    type=Size(),
    help="GPU memory of its slice of one GPU, e.g. 20G (binary units: 20G = 20 GiB).",
)
@click.option("--gpu-type", "gpu_types", multiple=True, help="Acceptable GPU model (repeatable).")
@click.option(
    "--cpus",
    type=click.FloatRange(min=0),
    help="Host CPUs, reserved and enforced (default: no limit).",
)
@click.option(
    "--memory",
    "memory_bytes",
    type=Size(),
    help="Host memory, e.g. 64G (binary units: 64G = 64 GiB).",
)
@click.option("--image", help="Container image to run (without it, a command is required).")
@click.option(
    "--port",
    "ports",
    type=PortSpec(),
    multiple=True,
    help="Port the workload listens on, PORT[/http|/tcp] (default http; repeatable); "
    "`fleetd instance connect` gives its address.",
)
@click.option(
    "--volume",
    "volume_bytes",
    type=Size(),
    help="Persistent volume kept across stop and resume, e.g. 100G (0: none).",
)
@click.option(
    "--volume-mount", "volume_mount_path", help="Where the volume is mounted (default /workspace)."
)
@click.option("--env", "env", multiple=True, help="KEY=VALUE (repeatable).")
@click.option(
    "--spot", is_flag=True, help="Spot class: cheaper, may be interrupted by on-demand work."
)
@click.option("--bid", type=click.FloatRange(min=0), help="Spot bid per GPU-hour (with --spot).")
@click.option("--fleet", "fleet_name", help="Run only on nodes of this fleet.")
@click.option("--project", help="Its project's key (default: your default project).")
@click.option(
    "--label",
    "labels",
    multiple=True,
    help="Run only on nodes with this KEY=VALUE label (repeatable).",
)
@click.option(
    "--restart",
    type=click.Choice(["always", "on-failure", "never"]),
    help="Restart its process when it exits: always, on-failure (the default) or never.",
)
@click.option(
    "--idle-stop",
    type=IdleStop(),
    help="Stop it once its GPUs stayed under PCT% utilization for DURATION, e.g. 5:30m.",
)
@click.option(
    "--wait",
    "wait_running",
    is_flag=True,
    help="Wait until it runs; exit 0 once it does, 1 if it stopped or failed first.",
)
@click.option("--timeout", type=Duration(), help="With --wait: give up after this long (exit 2).")
@click.argument("command", nargs=-1)
def instance_create(
    spec_file,
    name,
    gpus,
    gpu_memory_bytes,
    gpu_types,
    cpus,
    memory_bytes,
    image,
    ports,
    volume_bytes,
    volume_mount_path,
    env,
    spot,
    bid,
    fleet_name,
    project,
    labels,
    restart,
    idle_stop,
    wait_running,
    timeout,
    command,
):
    """Create an instance: fleetd instance create [OPTIONS] [-- COMMAND [ARGS]...]"""
    spec = load_spec(spec_file) if spec_file else {}
    if command:
        spec["command"] = list(command)
    if image:
        spec["image"] = image
    if not spec.get("command") and not spec.get("image"):
        raise click.UsageError("give a command after --, or --image (or a spec file with one)")
    if bid is not None and not spot and spec.get("priority_class") != "spot":
        raise click.UsageError("--bid is a spot instance's bid: add --spot")
    default_name = (
        os.path.basename(str(spec["command"][0]))
        if spec.get("command")
        else str(spec["image"]).rsplit("/", 1)[-1].split("@")[0].split(":")[0]
    )
    spec["name"] = name or spec.get("name") or default_name or "instance"
    resources = spec.setdefault("resources", {})
    for key, value in (
        ("gpus", gpus),
        ("gpu_memory_bytes", gpu_memory_bytes),
        ("cpus", cpus),
        ("memory_bytes", memory_bytes),
    ):
        if value is not None:
            resources[key] = value
    resources.setdefault("gpus", 0)
    if gpu_types:
        resources["gpu_types"] = list(gpu_types)
    if ports:
        spec["ports"] = list(ports)
    if volume_bytes is not None:
        spec["volume_bytes"] = volume_bytes
    if volume_mount_path:
        spec["volume_mount_path"] = volume_mount_path
    if env:
        spec["env"] = {**spec.get("env", {}), **parse_labels(env)}
    if spot:
        spec["priority_class"] = "spot"
    if bid is not None:
        spec["bid"] = bid
    if fleet_name:
        spec.setdefault("node_selector", {})["fleet"] = fleet_name
    if project:
        spec["project"] = project
    if labels:
        selector = spec.setdefault("node_selector", {})
        selector["labels"] = {**selector.get("labels", {}), **parse_labels(labels)}
    if restart:
        spec["restart"] = restart
    if idle_stop:
        spec["idle_stop"] = idle_stop
    data = current_client().post("/api/v1/instances", spec)
    if wait_running:
        _wait_running(data["id"], data, timeout, "created")
        return
    emit(data, lambda d: click.echo(_instance_line(d)))


@client_command(instance, "list")
@click.option(
    "--state",
    type=click.Choice(INSTANCE_STATES),
    help="Only instances in this state (deleted ones are listed only so).",
)
@click.option("--owner", help="Only instances created with the token of this name.")
@click.option("--name", help="Only instances of this name.")
def instance_list(state, owner, name):
    """List instances (a submitter sees its own)."""
    items = list(
        current_client().paginate("/api/v1/instances", state=state, owner=owner, name=name)
    )
    # On a terminal too narrow for one line a row, the pending reason wraps within its column.
    emit(items, lambda rows: show_table(rows, INSTANCE_COLUMNS))


def _volume(spec, runtime):
    """Its size, and where a container sees it (a host process finds it in $FLEET_VOLUME)."""
    volume = spec.get("volume_bytes") or 0
    if not volume:
        text = "none"
    elif spec.get("image"):
        text = f"{byte_size(volume)} at {spec.get('volume_mount_path') or '/workspace'}"
    else:
        text = f"{byte_size(volume)} in $FLEET_VOLUME"
    if runtime.get("volume_used_bytes") is not None:
        text += f", {byte_size(runtime['volume_used_bytes'])} used"
    return text


def _last_exit(d):
    last = d.get("last_exit")
    if not last:
        return None
    text = f"{last.get('reason') or last.get('exit_code')} at {last.get('at')}"
    if d["state"] == "restarting" and last.get("backoff_seconds") is not None:
        text += (
            f"; starts again in {number(last['backoff_seconds'])}s (at {d.get('next_start_at')})"
        )
    return text


def _show_instance(d):
    spec = d.get("spec") or {}
    runtime = d.get("runtime") or {}
    command = spec.get("command")
    rests = d["state"] in INSTANCE_AT_REST
    show_record(
        d,
        [
            ("ID", "id"),
            ("NAME", "name"),
            ("OWNER", "owner"),
            ("TEAM", "team"),
            ("STATE", "state"),
            ("REASON", "status_reason"),
            ("PENDING REASON", "pending_reason"),
            ("WANTED", "desired_state"),
            ("NODE", "node_id"),
            ("IMAGE", lambda _: spec.get("image")),
            ("COMMAND", lambda _: shlex.join(command) if command else None),
            ("GPUS", _instance_gpus),
            (
                "CLASS",
                lambda _: (
                    (spec.get("priority_class") or "on-demand")
                    + (f", bid {number(spec['bid'])}" if spec.get("bid") is not None else "")
                ),
            ),
            ("RESTART", lambda _: spec.get("restart")),
            ("LAST EXIT", _last_exit),
            (
                "INTERRUPTED BY",
                lambda _: (
                    d.get("interrupted_by") and "{kind} {name} ({id})".format(**d["interrupted_by"])
                ),
            ),
            ("VOLUME", lambda _: _volume(spec, runtime)),
            (
                "IDLE STOP",
                lambda _: (
                    spec.get("idle_stop")
                    and "under {}% GPU utilization for {}".format(
                        number(spec["idle_stop"]["gpu_util_below_percent"]),
                        span(spec["idle_stop"]["for_seconds"]),
                    )
                ),
            ),
            ("CREATED", "created_at"),
            ("STARTED", "started_at"),
            ("STOPPED", lambda _: d.get("stopped_at") if rests else None),
            ("RUNS", "runs"),
            ("UPTIME", lambda _: span(runtime.get("uptime_seconds"))),
            ("RESTARTS", lambda _: runtime.get("restarts")),
            ("PRICE/H", lambda i: money(i.get("price_per_hour"))),
            ("COST", lambda i: money(i.get("cost_so_far"))),
        ],
    )
    container = runtime.get("container") or {}
    if container:
        cpu, memory = container.get("cpu_percent"), container.get("memory_percent")
        click.echo(
            f"{'CPU, MEMORY'.ljust(14)}  {'-' if cpu is None else number(round(cpu, 1))}% CPU, "
            f"{'-' if memory is None else number(round(memory, 1))}% memory"
        )
    published = {p["private_port"]: p for p in runtime.get("ports") or []}
    if spec.get("ports"):
        click.echo("")
        rows = [dict(p, public=published.get(p["port"]) or {}) for p in spec["ports"]]
        show_table(
            rows,
            [
                ("PORT", "port"),
                ("PROTOCOL", "protocol"),
                ("PUBLIC PORT", lambda p: p["public"].get("public_port")),
                ("ADDRESS", lambda p: p["public"].get("ip")),
                ("PUBLIC IP", lambda p: p["public"].get("is_ip_public")),
            ],
        )
    if runtime.get("gpus"):
        click.echo("")
        show_table(
            runtime["gpus"],
            [
                ("UUID", "uuid"),
                ("GPU UTIL %", "gpu_util_percent"),
                ("MEMORY UTIL %", "memory_util_percent"),
            ],
        )


@client_command(instance, "show")
@click.argument("handle", metavar="INSTANCE")
def instance_show(handle):
    """Show an instance (by id or name): state, why it waits, node, ports, GPU figures, price and
    cost."""
    instance_id = resolve_id("instance", handle)
    emit(current_client().get(f"/api/v1/instances/{instance_id}"), _show_instance)


@client_command(instance, "stop")
@click.argument("handle", metavar="INSTANCE")
@click.option("--wait", "wait_stopped", is_flag=True, help="Wait until its processes have stopped.")
def instance_stop(handle, wait_stopped):
    """Stop an instance (by id or name): its processes end and its GPUs are freed; its volume is
    kept for `resume`. It reads stopping until its node reports that its processes ended."""
    instance_id = resolve_id("instance", handle)
    data = current_client().post(f"/api/v1/instances/{instance_id}/stop")
    if wait_stopped and data["state"] not in INSTANCE_AT_REST:
        data = _wait_instance(instance_id, lambda d: d["state"] in INSTANCE_AT_REST)
    emit(data, lambda d: click.echo(_instance_line(d)))


@client_command(instance, "resume")
@click.argument("handle", metavar="INSTANCE")
@click.option("--gpus", type=GpuCount(), help="GPUs to reserve this time (default: as before).")
@click.option(
    "--bid", type=click.FloatRange(min=0), help="New spot bid per GPU-hour (spot instances)."
)
@click.option(
    "--wait",
    "wait_running",
    is_flag=True,
    help="Wait until it runs; exit 0 once it does, 1 if it stopped or failed first.",
)
@click.option("--timeout", type=Duration(), help="With --wait: give up after this long (exit 2).")
def instance_resume(handle, gpus, bid, wait_running, timeout):
    """Resume a stopped instance (by id or name) on the node that holds its volume (it waits while
    that node lacks the GPUs)."""
    instance_id = resolve_id("instance", handle)
    body = {k: v for k, v in (("gpus", gpus), ("bid", bid)) if v is not None}
    data = current_client().post(f"/api/v1/instances/{instance_id}/resume", body)
    if wait_running:
        _wait_running(instance_id, data, timeout, "resumed")
        return
    emit(data, lambda d: click.echo(_instance_line(d)))


@client_command(instance, "rm")
@click.argument("handle", metavar="INSTANCE")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def instance_rm(handle, yes):
    """Delete an instance (by id or name): it is stopped and its volume is deleted (asks first,
    unless --yes); it reads deleting until its node has removed the volume, then it is gone."""
    instance_id = resolve_id("instance", handle)
    if not yes:
        data = current_client().get(f"/api/v1/instances/{instance_id}")
        volume = (data.get("spec") or {}).get("volume_bytes") or 0
        what = f" and its {byte_size(volume)} volume" if volume else ""
        try:
            agreed = click.confirm(
                f"delete instance {data['name']} ({instance_id}){what}? this cannot be undone",
                err=True,
            )
        except click.Abort:
            agreed = False
        if not agreed:
            fail(f"instance {instance_id} not deleted (answer y, or pass --yes)")
    data = current_client().delete(f"/api/v1/instances/{instance_id}")
    if data:  # 202: its processes are stopping, or its node has yet to remove its volume
        emit(
            data, lambda d: click.echo(f"deleting instance {instance_id}: {d.get('status_reason')}")
        )
        return
    emit(
        {"id": instance_id, "deleted": True},
        lambda d: click.echo(f"deleted instance {instance_id}"),
    )


@client_command(instance, "connect")
@click.argument("handle", metavar="INSTANCE")
@click.option(
    "--port", type=click.IntRange(1, 65535), help="Which declared port (default: its first)."
)
@click.option(
    "--wait",
    "wait_running",
    is_flag=True,
    help="Wait until the instance runs, however long that takes.",
)
@click.option(
    "--timeout",
    type=Duration(),
    help=(
        "Wait at most this long (exit 2), e.g. 5m as GPU clouds wait for a connection; implies "
        "--wait."
    ),
)
def instance_connect(handle, port, wait_running, timeout):
    """Print the URL of a port of a running instance, by id or name (http://HOST:PORT or tcp://HOST:PORT)."""
    import time

    instance_id = resolve_id("instance", handle)
    client, data = current_client(), None
    wait_running = wait_running or timeout is not None
    deadline = None if timeout is None else time.monotonic() + timeout
    # Each request waits at most a long-poll's slice (the server caps one at 30 s); --wait asks
    # again.
    for _ in range(10_000_000 if wait_running else 1):  # bounded: a wait of years would still end
        left = (
            _LONG_POLL_SECONDS
            if deadline is None
            else min(_LONG_POLL_SECONDS, deadline - time.monotonic())
        )
        try:
            data = client.get(
                f"/api/v1/instances/{instance_id}/connection",
                port=port,
                wait_seconds=round(max(0, left), 1) if wait_running else None,
            )
            break
        except ClientError as exc:
            if (
                exc.status != 504
            ):  # 504: not running within the wait; 409: stopped, so it never will by itself
                raise
            if not wait_running:
                fail(
                    f"{describe_error(exc)}\n(`fleetd instance connect --wait {instance_id}` waits "
                    f"until it runs)"
                )
            if deadline is not None and time.monotonic() >= deadline:
                click.echo(
                    f"fleetd: instance {instance_id} did not run within {timeout:g} s", err=True
                )
                sys.exit(2)
    emit(data, lambda d: click.echo(d["url"]))


@client_command(instance, "logs")
@click.argument("handle", metavar="INSTANCE")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing new lines until the instance stops."
)
@log_filter_options
def instance_logs(handle, follow, **filters):
    """Print an instance's output in order, by id or name (stderr lines go to stderr); filter by
    time, text and stream."""
    instance_id = resolve_id("instance", handle)
    if wants_json():

        def show(line):
            click.echo(json.dumps(line, sort_keys=True))
    else:
        show = log_printer(False)
    path = f"/api/v1/instances/{instance_id}"
    query = log_filters(**filters)
    after = read_log_pages(path + "/logs", None, show, **query)
    if not follow:
        return
    client = current_client()
    for _ in range(100_000_000):  # bounded: a follow of years would still end
        data = _read_instance(client, instance_id, 2)
        after = read_log_pages(path + "/logs", after, show, **query)
        if _at_rest(data):
            return


@client_command(instance, "output")
@click.argument("handle", metavar="INSTANCE")
@click.option("-o", "--output", "out_path", help="Write it to this file (default: stdout).")
@click.option("--stream", type=click.Choice(["stdout", "stderr", "system"]), help="One stream.")
def instance_output(handle, out_path, stream):
    """Download the whole output of an instance's runs as text, by id or name."""
    instance_id = resolve_id("instance", handle)
    written = download_output(f"/api/v1/instances/{instance_id}/output", out_path, stream=stream)
    if out_path not in (None, "-"):
        click.echo(f"wrote {written} bytes to {out_path}", err=True)


@client_command(instance, "events")
@click.argument("handle", metavar="INSTANCE")
def instance_events(handle):
    """An instance's events (by id or name), oldest first."""
    instance_id = resolve_id("instance", handle)
    items = list(current_client().paginate(f"/api/v1/instances/{instance_id}/events"))
    emit(items, lambda rows: show_table(rows, EVENT_COLUMNS))


COMMANDS = [instance]
