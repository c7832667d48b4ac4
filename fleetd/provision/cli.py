"""`fleetd bootstrap HOST...` and `fleetd bundle build`: click commands for the fleetd CLI."""

import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import click

from fleetd.cli.rollouts import show_rollout
from fleetd.client import Client, ClientError, credentials
from fleetd.provision import bootstrap as bs
from fleetd.provision import rendering
from fleetd.provision import rollout as rs
from fleetd.provision.bundle import BundleError, build_bundle, find_source_tree, read_bundle
from fleetd.provision.ssh import DEFAULT_KNOWN_HOSTS, HostSpec, SshOptions

REASON_WIDTH = 72
_DURATION_RE = re.compile(r"^(\d+)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class _Duration(click.ParamType):
    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return int(value)
        match = _DURATION_RE.match(str(value).strip().lower())
        if not match:
            self.fail(f"{value!r} is not a duration like 90s, 30m or 1h", param, ctx)
        return int(match.group(1)) * _UNITS[match.group(2)]


class _Spec(click.ParamType):
    name = "[user@]host[:port]"  # IPv6 addresses in brackets

    def convert(self, value, param, ctx):
        if isinstance(value, HostSpec):
            return value
        try:
            return HostSpec.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _labels(values):
    labels = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{value!r} must be KEY=VALUE", param_hint="--label")
        labels[key.strip()] = val.strip()
    return labels


def _cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fleetd" / "bundles"


class _Reporter:
    """Progress per host: rich bars on a terminal, one line per step otherwise (CI, Terraform
    logs)."""

    def __init__(self, hosts, steps, enabled):
        self.steps = steps
        self.lock = threading.Lock()
        self.progress = None
        self.tasks = {}
        self.enabled = enabled
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        console = Console(stderr=True)
        if console.is_terminal:
            self.progress = Progress(
                TextColumn("{task.fields[host]:<24}"),
                BarColumn(bar_width=20),
                TextColumn("{task.fields[step]:<10} {task.description}"),
                console=console,
            )
            for host in hosts:
                self.tasks[host] = self.progress.add_task(
                    "waiting", total=len(steps), host=host, step=""
                )

    def __enter__(self):
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()

    def __call__(self, host, step, message):
        if not self.enabled:
            return
        if self.progress is not None:
            done = (
                len(self.steps)
                if step in ("done", "failed")
                else (self.steps.index(step) if step in self.steps else 0)
            )
            if (
                host not in self.tasks
            ):  # a host named otherwise than announced (an IPv6 address in brackets)
                self.tasks[host] = self.progress.add_task(
                    "waiting", total=len(self.steps), host=host, step=""
                )
            self.progress.update(
                self.tasks[host], completed=done, step=step, description=message[:120]
            )
            return
        with self.lock:
            click.echo(f"{time.strftime('%H:%M:%S')} {host}: {step}: {message}", err=True)


def _show_results(results):
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for header in ("HOST", "NODE", "GPUS", "RESULT", "REASON"):
        # A long reason wraps within its column instead of widening every row.
        table.add_column(
            header,
            no_wrap=header in ("HOST", "NODE"),
            overflow="fold",
            max_width=REASON_WIDTH if header == "REASON" else None,
        )
    for r in results:
        style = "red" if not r.ok else None
        table.add_row(
            r.host,
            r.node_id or "-",
            "-" if r.gpus is None else str(r.gpus),
            r.result,
            r.reason,
            style=style,
        )
    (Console() if sys.stdout.isatty() else Console(width=240)).print(table)


# A provisioning run on the operator's saved session refreshes it first unless it lasts this much
# longer (a session lasts an hour): a run longer than the session needs a token of its own.
RUN_SESSION_SECONDS = 1800


def _client(url, token):
    """The client of a provisioning run: the token given (the tool's own, or an operator's), else
    the operator's saved `fleetd login` (a session is refreshed first when it ends within the
    next RUN_SESSION_SECONDS). fleetd records every change of the run with
    whoever this is."""
    try:
        url, token = credentials(url, token, ahead=RUN_SESSION_SECONDS)
    except ClientError as exc:
        raise click.ClickException(exc.message) from None
    if not token:
        raise click.ClickException(
            "an admin token is needed: --token, FLEETD_TOKEN or `fleetd login`"
        )
    return Client(url, token)


def ssh_flags(fn):
    """How to reach the hosts over SSH: the options `fleetd bootstrap` and `fleetd rollout start`
    share (their values become SshOptions through ssh_options)."""
    options = [
        click.option(
            "--user", "-u", help="SSH user (default: from ~/.ssh/config, else your login name)."
        ),
        click.option(
            "--key",
            "-i",
            "keys",
            multiple=True,
            type=click.Path(dir_okay=False),
            help="SSH private key (repeatable; default: ssh-agent and ~/.ssh/id_*).",
        ),
        click.option(
            "--port",
            "-p",
            type=click.IntRange(1, 65535),
            help="SSH port of hosts given without one (default: from ~/.ssh/config, else 22).",
        ),
        click.option(
            "--jump", "-J", type=_Spec(), help="Bastion to connect through, [user@]host[:port]."
        ),
        click.option(
            "--known-hosts",
            default=DEFAULT_KNOWN_HOSTS,
            show_default=True,
            type=click.Path(dir_okay=False),
            help=(
                "known_hosts file the host keys are checked against (also "
                "/etc/ssh/ssh_known_hosts)."
            ),
        ),
        click.option(
            "--accept-new-host-keys",
            is_flag=True,
            help=(
                "Trust hosts whose key is unknown on first use and record their keys; changed keys "
                "are still refused."
            ),
        ),
        click.option(
            "--sudo",
            is_flag=True,
            help="Become root with `sudo -n` (passwordless sudo) on the hosts.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def preflight_flags(fn):
    """What preflight checks on each host before anything changes there: the options `fleetd
    bootstrap` and `fleetd rollout start` share (bootstrap.judge_preflight judges them)."""
    options = [
        click.option(
            "--python",
            "python",
            default="python3",
            show_default=True,
            help="Python on the hosts (>= 3.10).",
        ),
        click.option(
            "--install-dir",
            default="/opt/fleet-agent",
            show_default=True,
            help="Where the agent's installs go on the hosts (versions/, the link current).",
        ),
        click.option(
            "--min-free-mb",
            type=click.IntRange(min=0),
            default=512,
            show_default=True,
            help="Free disk space preflight requires for the install directory.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def ssh_options(user, keys, port, jump, known_hosts, accept_new_host_keys, connect_timeout, sudo):
    """SshOptions from the values of the ssh_flags options."""
    return SshOptions(
        user=user,
        port=port,
        key_filenames=tuple(keys),
        jump=jump,
        known_hosts=known_hosts,
        accept_new_host_keys=accept_new_host_keys,
        connect_timeout=connect_timeout,
        sudo=sudo,
    )


# Their own -h: a command loaded lazily caches its help option from the first context it sees,
# which is not always the fleetd group's (a test may invoke it alone).
HELP = {"help_option_names": ["-h", "--help"]}


@click.command(context_settings=HELP)
@click.argument("hosts", nargs=-1, required=True, type=_Spec())
@click.option("--fleet", "fleet_name", help="Fleet the hosts join (required unless --remove).")
@click.option(
    "--remove",
    is_flag=True,
    help="Drain, stop, uninstall and delete the nodes of these hosts instead.",
)
@click.option(
    "--force",
    is_flag=True,
    help=(
        "With --remove: a host that cannot be reached over SSH still has its node drained and "
        "deleted in fleetd (found by address or hostname); nothing on the host is touched."
    ),
)
@click.option(
    "--allow-downgrade",
    is_flag=True,
    help="Install a bundle older than the installed agent (refused otherwise).",
)
@click.option(
    "--readmit",
    is_flag=True,
    help=(
        "Enrol a host whose node was revoked again, under its old node id (refused otherwise: a "
        "rerun never undoes a revoke)."
    ),
)
@click.option(
    "--url",
    envvar="FLEETD_URL",
    help="fleetd URL for this command (FLEETD_URL; default: saved by login).",
)
@click.option(
    "--token",
    envvar="FLEETD_TOKEN",
    help="Admin API token (FLEETD_TOKEN; default: saved by login).",
)
@click.option(
    "--server-url",
    "server_urls",
    multiple=True,
    envvar="FLEETD_AGENT_SERVER_URL",
    help=(
        "URL the agents reach fleetd at, when it differs from --url; several (replicas) repeated "
        "or comma-separated, tried in turn by the agents (FLEETD_AGENT_SERVER_URL: comma- or "
        "space-separated)."
    ),
)
@ssh_flags
@click.option(
    "--parallel",
    type=click.IntRange(1, 256),
    default=10,
    show_default=True,
    help="Hosts at a time.",
)
@preflight_flags
@click.option(
    "--bundle",
    "bundle_path",
    type=click.Path(dir_okay=False, exists=True),
    help="Offline bundle from `fleetd bundle build` (default: build one now into ~/.cache/fleetd).",
)
@click.option(
    "--label", "labels", multiple=True, help="Node label KEY=VALUE for every host (repeatable)."
)
@click.option(
    "--devices-backend",
    default="nvml",
    show_default=True,
    help="Agent devices.backend; fake:<path on the host> for demos and tests.",
)
@click.option(
    "--ca-file",
    type=click.Path(dir_okay=False, exists=True),
    help="CA bundle the agents verify fleetd with; installed as <config dir>/ca.pem.",
)
@click.option(
    "--tls-pin", default="", help="SHA-256 fingerprint of fleetd's certificate, instead of a CA."
)
@click.option(
    "--wait-timeout",
    type=_Duration(),
    default="3m",
    show_default=True,
    help="How long to wait for each node to become ready.",
)
@click.option(
    "--drain-deadline",
    type=_Duration(),
    default="1h",
    show_default=True,
    help="Drain deadline before an upgrade or a removal (running tasks are stopped after it).",
)
@click.option("--connect-timeout", type=_Duration(), default="15s", show_default=True)
@click.option(
    "--result-file",
    type=click.Path(dir_okay=False),
    help="Also write the results as JSON to this file.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the results as JSON instead of a table."
)
def bootstrap(
    hosts,
    fleet_name,
    remove,
    force,
    allow_downgrade,
    readmit,
    url,
    token,
    server_urls,
    user,
    keys,
    port,
    jump,
    known_hosts,
    accept_new_host_keys,
    parallel,
    sudo,
    python,
    bundle_path,
    labels,
    devices_backend,
    ca_file,
    tls_pin,
    wait_timeout,
    drain_deadline,
    connect_timeout,
    min_free_mb,
    install_dir,
    result_file,
    as_json,
):
    """Install and enrol fleet-agent on HOSTs over SSH, or --remove them.

    Exit status 0 when every host succeeded, 1 when any failed (the others still complete).
    """
    if not remove and not fleet_name:
        raise click.UsageError("--fleet is required (or --remove)")
    if force and not remove:
        raise click.UsageError(
            "--force goes with --remove (it removes nodes of hosts that cannot be reached)"
        )
    client = _client(url, token)
    names = [str(h) for h in hosts]
    if len(set(names)) != len(names):
        raise click.UsageError("a host is given twice")
    try:
        agent_urls = rendering.server_urls(",".join(server_urls) if server_urls else client.url)
    except rendering.TemplateError as exc:
        raise click.BadParameter(
            str(exc).removeprefix("fleet_agent_"), param_hint="--server-url"
        ) from None
    options = bs.BootstrapOptions(
        fleet=fleet_name or "",
        server_url=agent_urls,
        python=python,
        labels=_labels(labels),
        devices_backend=devices_backend,
        tls_pin=tls_pin,
        ca_pem=Path(ca_file).read_text() if ca_file else "",
        install_dir=install_dir,
        wait_timeout=wait_timeout,
        drain_deadline=drain_deadline,
        min_free_mb=min_free_mb,
        allow_downgrade=allow_downgrade,
        force_remove=force,
        readmit=readmit,
    )
    ssh = ssh_options(
        user, keys, port, jump, known_hosts, accept_new_host_keys, connect_timeout, sudo
    )
    if not remove:
        try:
            options.validate = (
                client.get(f"/api/v1/fleets/{fleet_name}").get("validation") is not None
            )
            options.bundle = read_bundle(bundle_path) if bundle_path else _default_bundle()
        except ClientError as exc:
            raise click.ClickException(f"fleet {fleet_name}: {exc.message}") from None
        except BundleError as exc:
            raise click.ClickException(str(exc)) from None
    steps = bs.REMOVE_STEPS if remove else bs.STEPS
    # Progress goes to stderr: it never mixes with --json on stdout.
    with _Reporter(names, steps, enabled=True) as reporter:
        results = bs.Bootstrapper(client, options, ssh, progress=reporter).run(
            list(hosts), parallel=parallel, remove=remove
        )
    if result_file:
        _write_results(Path(result_file), results)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        _show_results(results)
    failed = [r for r in results if not r.ok]
    if failed:
        if not as_json:
            click.echo(f"fleetd: {len(failed)} of {len(results)} host(s) failed", err=True)
        sys.exit(1)


def _write_results(path, results):
    """Write the results as JSON, atomically (Terraform outputs read this file)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    # 0600: results name hosts and nodes; they are nobody else's business (Terraform's .fleet-nodes
    # too).
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older partial file may have had another mode
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps([r.to_dict() for r in results], indent=2) + "\n")
    os.replace(partial, path)


def _default_bundle():
    """A bundle of the running fleetd version, built once into the cache directory."""
    from fleetd import __version__

    cached = _cache_dir() / f"fleet-agent-bundle-{__version__}.tar.gz"
    if cached.is_file() and find_source_tree() is None:
        return read_bundle(cached)
    click.echo(
        f"building the offline bundle into {cached.parent} (use --bundle to reuse one)", err=True
    )
    return build_bundle(cached.parent, log=lambda m: None)


@click.group(context_settings=HELP)
def bundle():
    """Offline bundles of fleet-agent for hosts without internet access."""


@bundle.command("build")
@click.option(
    "--output",
    "-o",
    "output",
    default="dist",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory the bundle is written to.",
)
@click.option(
    "--source",
    type=click.Path(file_okay=False, exists=True),
    help="fleetd source tree to build (default: the one this fleetd runs from).",
)
@click.option(
    "--python-version",
    "python_versions",
    multiple=True,
    help="Target Python X.Y of the hosts (repeatable; default: this Python, built locally).",
)
@click.option(
    "--platform",
    "platforms",
    multiple=True,
    help="Target platform tag with --python-version (repeatable; default: manylinux x86_64).",
)
@click.option(
    "--find-links", multiple=True, help="Extra wheel directory or URL for pip (repeatable)."
)
@click.option("--no-index", is_flag=True, help="Use only --find-links, no package index.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def bundle_build(output, source, python_versions, platforms, find_links, no_index, as_json):
    """Build fleet-agent-bundle-<version>.tar.gz: the agent and all its dependencies as wheels."""
    for version in python_versions:
        if not re.fullmatch(r"3\.\d{1,2}", version):
            raise click.BadParameter(f"{version!r} is not X.Y", param_hint="--python-version")
    try:
        built = build_bundle(
            output,
            source=source,
            python_versions=python_versions,
            platforms=platforms,
            find_links=find_links,
            no_index=no_index,
            log=(lambda m: None) if as_json else (lambda m: click.echo(m, err=True)),
        )
    except BundleError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(dict(built.manifest, path=str(built.path), sha256=built.sha256), indent=2)
        )
    else:
        click.echo(
            f"{built.path}  fleet-agent {built.version}, {len(built.manifest['wheels'])} wheels, "
            f"{built.size / 2**20:.1f} MiB, Python {', '.join(built.manifest['python_versions'])}, "
            f"sha256 {built.sha256}"
        )


@bundle.command("show")
@click.argument("path", type=click.Path(dir_okay=False, exists=True))
def bundle_show(path):
    """Check a bundle against its manifest and print the manifest."""
    try:
        built = read_bundle(path)
    except BundleError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(dict(built.manifest, sha256=built.sha256), indent=2))


@click.command("start", context_settings=HELP)
@click.option(
    "--fleet", "fleet_name", help="Fleet whose nodes are upgraded (required unless --rollout)."
)
@click.option(
    "--bundle",
    "bundle_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="Offline bundle from `fleetd bundle build` to roll out.",
)
@click.option(
    "--batch",
    default="1",
    show_default=True,
    help=(
        "Nodes upgraded at a time after the canaries: a number, or a percentage of the nodes (10%)."
    ),
)
@click.option(
    "--canary",
    type=click.IntRange(0, 1000),
    default=1,
    show_default=True,
    help="Nodes upgraded first, alone; if one fails, the rollout pauses before any other node.",
)
@click.option(
    "--max-failures",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Failed nodes after the canaries before the rollout pauses by itself.",
)
@click.option(
    "--window",
    "window_specs",
    multiple=True,
    metavar="[DAYS ]HH:MM-HH:MM",
    help=(
        "When nodes may begin their upgrade, e.g. 22:00-06:00 or 'sat,sun 00:00-23:59' "
        "(repeatable; default: any time). A node under way when the window closes finishes."
    ),
)
@click.option(
    "--timezone", default="UTC", show_default=True, help="Time zone of --window (IANA name)."
)
@click.option(
    "--url",
    envvar="FLEETD_URL",
    help="fleetd URL for this command (FLEETD_URL; default: saved by login).",
)
@click.option(
    "--token",
    envvar="FLEETD_TOKEN",
    help="Admin API token (FLEETD_TOKEN; default: saved by login).",
)
@ssh_flags
@preflight_flags
@click.option(
    "--server-url",
    "server_urls",
    multiple=True,
    help=(
        "Preflight checks that each host reaches fleetd at this URL (repeatable or "
        "comma-separated) before its node is drained; the agents' config is left as it is."
    ),
)
@click.option(
    "--wait-timeout",
    type=_Duration(),
    default="3m",
    show_default=True,
    help="How long to wait for each node's agent to come back on the new bundle.",
)
@click.option(
    "--drain-deadline",
    type=_Duration(),
    default="1h",
    show_default=True,
    help="Drain deadline of each node (running tasks are stopped after it).",
)
@click.option(
    "--connect-timeout",
    type=_Duration(),
    default="15s",
    show_default=True,
    help="How long an SSH connection to a host may take.",
)
@click.option(
    "--allow-downgrade", is_flag=True, help="Roll out a bundle older than a node's agent."
)
@click.option(
    "--rollout",
    "rollout_id",
    help=(
        "Drive this rollout, which fleetd holds already, instead of starting one: one whose driver "
        "stopped (--wait at a pause, then `rollout resume|retry`; a killed one). --bundle must be "
        "its bundle."
    ),
)
@click.option(
    "--wait",
    "for_ci",
    is_flag=True,
    help=(
        "For CI: exit once the rollout ends or pauses, with a status per state: 0 done, 3 failed, "
        "4 aborted, 5 paused (it stays paused in fleetd)."
    ),
)
@click.option("--json", "as_json", is_flag=True, help="Print the rollout as JSON at the end.")
def rollout_start(
    fleet_name,
    bundle_path,
    batch,
    canary,
    max_failures,
    window_specs,
    timezone,
    url,
    token,
    user,
    keys,
    port,
    jump,
    known_hosts,
    accept_new_host_keys,
    sudo,
    python,
    install_dir,
    min_free_mb,
    server_urls,
    wait_timeout,
    drain_deadline,
    connect_timeout,
    allow_downgrade,
    rollout_id,
    for_ci,
    as_json,
):
    """Upgrade the agents of a fleet to a bundle over SSH: canaries first, then batch by batch.

    Each node is drained (to the deadline), upgraded, restarted, validated (its agent comes back on
    the new bundle) and returned to the state its operator left it in; a failed node stays drained.
    The rollout lives in fleetd: `fleetd rollout status|pause|resume|abort ID` work from any
    machine, and this command obeys them between nodes, waiting while it is paused. Exit status 0
    when every node was upgraded, else 1; with --wait, one per state the rollout ends or pauses in
    (0 done, 3 failed, 4 aborted, 5 paused).
    """
    if not fleet_name and not rollout_id:
        raise click.UsageError("--fleet is required (or --rollout)")
    batch = batch.strip()
    if not re.fullmatch(r"[1-9]\d{0,5}|([1-9]\d?|100)%", batch):
        raise click.BadParameter(
            f"{batch!r} is not a number of nodes or a percentage (10%)", param_hint="--batch"
        )
    try:
        window = rs.parse_window(window_specs, timezone)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--window") from None
    client = _client(url, token)
    try:
        checked_urls = rendering.server_urls(",".join(server_urls)) if server_urls else None
    except rendering.TemplateError as exc:
        raise click.BadParameter(
            str(exc).removeprefix("fleet_agent_"), param_hint="--server-url"
        ) from None
    existing = None
    try:
        if rollout_id:
            existing = client.get(f"/api/v1/rollouts/{rollout_id}")
            fleet_name = existing["fleet"]
        fleet = client.get(f"/api/v1/fleets/{fleet_name}")
        bundle = read_bundle(bundle_path)
    except ClientError as exc:
        what = f"rollout {rollout_id}" if rollout_id and existing is None else f"fleet {fleet_name}"
        raise click.ClickException(f"{what}: {exc.message}") from None
    except BundleError as exc:
        raise click.ClickException(str(exc)) from None
    if existing is not None and existing["bundle_sha256"] != bundle.sha256:
        raise click.ClickException(
            f"rollout {rollout_id} rolls out bundle {existing['bundle_sha256'][:12]} "
            f"(fleet-agent {existing['bundle_version']}), not {bundle.path.name} "
            f"({bundle.sha256[:12]}): give its bundle"
        )
    options = bs.BootstrapOptions(
        fleet=fleet["name"],
        server_url=checked_urls or client.url,
        bundle=bundle,
        python=python,
        install_dir=install_dir,
        min_free_mb=min_free_mb,
        wait_timeout=wait_timeout,
        drain_deadline=drain_deadline,
        allow_downgrade=allow_downgrade,
        upgrade_only=True,
        check_server_url=checked_urls is not None,
        validate=fleet.get("validation") is not None,
    )
    driver = rs.RolloutDriver(
        client,
        options,
        ssh_options(
            user, keys, port, jump, known_hosts, accept_new_host_keys, connect_timeout, sudo
        ),
        stop_when_paused=for_ci,
    )
    try:
        started = existing or driver.start(
            fleet["name"], int(batch) if batch.isdigit() else batch, canary, max_failures, window
        )
    except ClientError as exc:
        raise click.ClickException(f"rollout of fleet {fleet_name}: {exc.message}") from None
    now_state = f" ({started['state']})" if existing else ""
    click.echo(
        f"rollout {started['id']}{now_state}: fleet {fleet_name} to fleet-agent {bundle.version} "
        f"(bundle sha256 {bundle.sha256[:12]}), "
        f"{sum(n['state'] == 'pending' for n in started['nodes'])} node(s)",
        err=True,
    )
    hosts = ["rollout"] + [
        n["address"] or n["hostname"] for n in started["nodes"] if n["state"] == "pending"
    ]
    with _Reporter(list(dict.fromkeys(hosts)), rs.STEPS, enabled=True) as reporter:
        driver.progress = reporter
        try:
            final = driver.run(started["id"])
        except ClientError as exc:
            raise click.ClickException(
                f"rollout {started['id']}: {exc.message} (it stays in fleetd: "
                f"`fleetd rollout status {started['id']}`)"
            ) from None
    if as_json:
        click.echo(json.dumps(final, indent=2))
    else:
        show_rollout(final)
    if for_ci:
        status = rs.EXIT_STATUS.get(final["state"], 1)
        if status:
            hint = (
                f": `fleetd rollout resume|retry {final['id']}`, then `fleetd rollout start "
                f"--rollout {final['id']} --bundle ...` drives it on; or `fleetd rollout abort "
                f"{final['id']}`"
                if final["state"] == "paused"
                else ""
            )
            click.echo(
                f"fleetd: rollout {final['id']} is {final['state']} ({final['state_reason']})"
                + hint,
                err=True,
            )
        sys.exit(status)
    upgraded = final["state"] == "done" and all(
        n["state"] in ("done", "skipped") for n in final["nodes"]
    )
    if not upgraded:
        click.echo(
            f"fleetd: rollout {final['id']} is {final['state']} ({final['state_reason']})", err=True
        )
        sys.exit(1)
