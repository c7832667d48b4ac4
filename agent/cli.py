"""`fleet-agent join | run | status | devices`."""

import hashlib
import json
import logging
import os
import re
import signal
import ssl
import sys

import click
import urllib3

from agent.client import FleetdError, display_url
from agent.config import (
    DEFAULT_CONFIG_PATH,
    ENV_PREFIX,
    ConfigError,
    load_config,
    node_server_urls,
    parse_labels,
)
from agent.daemon import EXIT_CONFIG, EXIT_FAILURE, Agent, enrol
from agent.devices import DeviceManager
from agent.logs import setup_logging
from agent.state import State

config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help=f"TOML config file (FLEET_AGENT_CONFIG; default {DEFAULT_CONFIG_PATH}).",
)


def _load(config_path, **overrides):
    try:
        return load_config(config_path, **overrides)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_CONFIG)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def cli():
    """fleet-agent: the fleetd host agent."""


@cli.command()
@click.option(
    "--server",
    "server_urls",
    multiple=True,
    help="fleetd URL; several (replicas) comma-separated or repeated, tried in turn "
    "(default: server_url from the config).",
)
@click.option(
    "--token",
    envvar="FLEET_AGENT_JOIN_TOKEN",
    required=True,
    help="Join token flj_... (or FLEET_AGENT_JOIN_TOKEN, which keeps it out of the process list).",
)
@click.option("--label", "labels", multiple=True, help="Extra node label key=value (repeatable).")
@click.option("--force", is_flag=True, help="Enrol again even if credentials are stored.")
@config_option
def join(server_urls, token, labels, force, config_path):
    """Enrol this host with a join token and store its credentials (once)."""
    config = _load(config_path, server_url=",".join(server_urls) if server_urls else None)
    setup_logging(config.log_level, stream=sys.stderr)
    logging.getLogger("agent.devices").setLevel(
        logging.WARNING
    )  # one line per GPU is for the service log
    try:
        extra = parse_labels(",".join(labels))
        config.labels = {**config.labels, **extra}
        node, registered = enrol(config, token, force=force)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except FleetdError as exc:
        click.echo(f"error: enrolment failed: {exc}", err=True)
        sys.exit(EXIT_FAILURE)
    if registered:
        click.echo(f"enrolled as node {node['node_id']} in fleet {node['fleet']}")
    else:
        click.echo(
            f"already enrolled as node {node['node_id']} in fleet {node['fleet']} (use --force to "
            f"enrol again)"
        )


@cli.command()
@click.option(
    "--deregister-on-stop", is_flag=True, help="Leave the fleet when stopped with SIGTERM."
)
@config_option
def run(deregister_on_stop: bool, config_path: str | None) -> None:
    """Run the agent service until SIGTERM (exit 3: revoked, re-enrol)."""
    config = _load(config_path)
    setup_logging(config.log_level)
    agent = Agent(config, deregister_on_stop=deregister_on_stop)

    def on_signal(signum, _frame):
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        code = agent.run()
    except (ConfigError, OSError) as exc:
        click.echo(f"error: {exc}", err=True)
        code = EXIT_CONFIG
    sys.exit(code)


def _discover(config):
    devices = DeviceManager(config.devices_backend, watch_xids=False)
    try:
        return devices.discover().to_dict()
    finally:
        devices.close()


def _gib(value):
    return f"{value / 2**30:.0f} GiB" if value else "?"


def _print_gpus(inventory):
    if inventory["reason"]:
        click.echo(f"no GPUs: {inventory['reason']}")
    for gpu in inventory["gpus"]:
        health = "healthy" if gpu["healthy"] else f"UNHEALTHY: {gpu['health_reason']}"
        extras = [_gib(gpu["memory_total_bytes"])]
        if gpu.get("numa_node") is not None:
            extras.append(f"NUMA {gpu['numa_node']}")
        if gpu.get("max_tflops"):
            extras.append(f"{gpu['max_tflops']:g} TFLOPS")
        if gpu.get("mig_mode") == "enabled":
            extras.append(f"MIG {len(gpu.get('mig_devices') or [])} instance(s)")
        click.echo(
            f"GPU {gpu['index']}: {gpu['model']} (UUID: {gpu['uuid']}) {', '.join(extras)}; "
            f"{health}"
        )


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@config_option
def devices(as_json, config_path):
    """List GPUs, like a friendlier `nvidia-smi -L`."""
    config = _load(config_path)
    setup_logging("error", stream=sys.stderr)
    inventory = _discover(config)
    if as_json:
        click.echo(json.dumps(inventory, indent=2))
    else:
        driver = inventory["driver_version"]
        if driver:
            click.echo(f"driver {driver}, CUDA {inventory['cuda_version'] or '?'}")
        _print_gpus(inventory)


def _ask_local_agent(config, state):
    """What the running agent says about itself, or {'running': False}."""
    host, port = config.local_api_host_port
    scheme = "https" if config.local_api_tls_cert else "http"
    base = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}"
    token = state.local_api_token(create=False)
    out = {"running": False, "url": base}
    try:
        http = _local_api_http(config)
    except (OSError, ValueError) as exc:
        out["error"] = f"cannot verify the local API: local_api.tls_cert: {exc}"
        return out
    try:
        # With the token the answer carries the details (node id, fleetd's URL), else only ready or
        # not.
        ready = http.request(
            "GET",
            base + "/readyz",
            timeout=3,
            headers={"Authorization": f"Bearer {token}"} if token else None,
        )
    except urllib3.exceptions.SSLError:
        out["error"] = (
            f"what answers at {base} is not the local API of local_api.tls_cert (another "
            f"certificate)"
        )
        return out
    except urllib3.exceptions.HTTPError:
        return out
    out["running"] = True
    try:
        body = json.loads(ready.data)
    except ValueError:
        body = {}
    out["ready"] = ready.status == 200
    out["readiness"] = body.get("data") or (body.get("error") or {}).get("details") or {}
    if token:
        try:
            resp = http.request(
                "GET",
                base + "/api/v1/devices",
                timeout=10,
                headers={"Authorization": f"Bearer {token}"},
            )
        except urllib3.exceptions.HTTPError:
            return out
        if resp.status == 200:
            out["gpus"] = json.loads(resp.data)["data"]
    return out


def _local_api_http(config):
    """A client for the agent's local API. Over TLS it trusts exactly the certificate that API
    serves (the first one in local_api.tls_cert, pinned by its SHA-256 fingerprint, whatever name or
    address the API listens on), so the bearer token sent to it never goes to anyone else."""
    if not config.local_api_tls_cert:
        return urllib3.PoolManager(retries=False)
    with open(config.local_api_tls_cert) as fh:
        first = re.search(
            r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", fh.read(), re.DOTALL
        )
    if first is None:
        raise ValueError("no PEM certificate in the file")
    fingerprint = hashlib.sha256(ssl.PEM_cert_to_DER_cert(first.group(0))).hexdigest()
    # The pin is the verification: urllib3 refuses a certificate with another fingerprint.
    return urllib3.PoolManager(retries=False, cert_reqs="CERT_NONE", assert_fingerprint=fingerprint)


def _config_source(config_path):
    """Which file the configuration came from, in words."""
    explicit = config_path or os.environ.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return explicit
    if os.path.exists(DEFAULT_CONFIG_PATH):
        return DEFAULT_CONFIG_PATH
    return f"none ({DEFAULT_CONFIG_PATH} is absent: defaults)"


def _mismatch(node, local):
    """Why the running agent is not the one this config describes, or None when it may well be."""
    if not local["running"]:
        return None
    running_node = local.get("readiness", {}).get("node_id")
    # A ready agent has a node; without this state dir's token it does not say which.
    if node is None and (
        running_node or local.get("readiness", {}).get("enrolled") or local.get("ready")
    ):
        return (
            f"an agent answers at {local['url']}"
            + (f" as node {running_node}" if running_node else "")
            + ", but this state dir holds no enrolment: that agent runs with another config"
        )
    if node is not None and running_node and running_node != node["node_id"]:
        return (
            f"the agent at {local['url']} is node {running_node}, not this state dir's node "
            f"{node['node_id']}: it runs with another config"
        )
    return None


@cli.command()
@click.option(
    "--off", is_flag=True, help="Say the host takes work again (ends the cordon it asked for)."
)
@click.option(
    "--local-api",
    "local_api",
    help="The running agent's local API URL (default: from local_api.listen).",
)
@config_option
def drain(off, local_api, config_path):
    """Tell fleetd through the running agent that this host takes no new work: fleetd cordons the
    node ("agent draining") from the next heartbeat until `fleet-agent drain --off`. Running work
    goes on."""
    config = _load(config_path)
    setup_logging("error", stream=sys.stderr)
    token = State(config.state_dir).local_api_token(create=False)
    host, port = config.local_api_host_port
    scheme = "https" if config.local_api_tls_cert else "http"
    base = local_api or f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
    if not token:
        raise click.ClickException(
            f"no local API token in {config.state_dir}: is the agent enrolled here?"
        )
    try:
        resp = _local_api_http(config).request(
            "POST",
            base + "/api/v1/draining",
            body=json.dumps({"draining": not off}),
            timeout=10,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
    except (OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
        raise click.ClickException(f"cannot reach the running agent at {base}: {exc}") from None
    if resp.status != 200:
        raise click.ClickException(
            f"the agent answered {resp.status}: {resp.data.decode(errors='replace')[:300]}"
        )
    click.echo(
        "draining: fleetd cordons this node at the next heartbeat"
        if not off
        else "not draining: fleetd ends the cordon this host asked for at the next heartbeat"
    )


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@config_option
def status(as_json, config_path):
    """What the agent knows: node, session, devices."""
    config = _load(config_path)
    setup_logging("error", stream=sys.stderr)
    state = State(config.state_dir)
    node = state.node()
    local = _ask_local_agent(config, state)
    if "gpus" in local:
        inventory = {"reason": "", "gpus": local.pop("gpus"), "source": "running agent"}
    else:
        inventory = dict(_discover(config), source="direct discovery")
    mismatch = _mismatch(node, local)
    readiness = local.get("readiness", {}) if local["running"] and not mismatch else {}
    report = {
        "config": _config_source(config_path),
        "state_dir": config.state_dir,
        "mismatch": mismatch,
        "node": node,
        "session": "stored" if state.session_token() else "missing",
        "server_urls": readiness.get("fleetd_urls")
        or [display_url(url) for url in (config.server_urls or node_server_urls(node))],
        "server_url_in_use": readiness.get("fleetd_url"),  # None unless the running agent says
        "agent": local,
        "devices": inventory,
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"config:   {report['config']}")
    click.echo(f"state:    {config.state_dir}")
    if node:
        stored = ", ".join(map(display_url, node_server_urls(node))) or "?"
        click.echo(f"node:     {node['node_id']} in fleet {node['fleet']} ({stored})")
        click.echo(
            f"machine:  {node.get('machine_id', '?')}, enrolled {node.get('registered_at', '?')}"
        )
    else:
        click.echo(
            "node:     not enrolled in this state dir (run `fleet-agent join`"
            + (", or see below" if mismatch else "")
            + ")"
        )
    click.echo(f"session:  {report['session']}")
    in_use, urls = report["server_url_in_use"], report["server_urls"]
    if in_use:
        others = f" (of {', '.join(urls)})" if urls and len(urls) > 1 else ""
        click.echo(f"fleetd:   {in_use} in use{others}")
    elif urls:
        click.echo(f"fleetd:   {', '.join(urls)}" + (" (in turn)" if len(urls) > 1 else ""))
    if mismatch:
        click.echo(
            f"agent:    {mismatch}; run `fleet-agent status --config FILE` with the config of that "
            f"agent (its unit's --config, or FLEET_AGENT_CONFIG), or stop it before enrolling this "
            f"one"
        )
    elif local["running"]:
        readiness = local.get("readiness", {})
        detail = (
            "ready" if local.get("ready") else f"not ready: session {readiness.get('session', '?')}"
        )
        if readiness.get("fleetd_error"):
            detail += f"; fleetd: {readiness['fleetd_error']}"
        click.echo(f"agent:    running at {local['url']}, {detail}")
    elif local.get("error"):
        click.echo(f"agent:    unknown ({local['error']})")
    else:
        click.echo(f"agent:    not running (nothing answers at {local['url']})")
    click.echo(f"devices:  {len(inventory['gpus'])} GPU(s), from {inventory['source']}")
    _print_gpus(inventory)
