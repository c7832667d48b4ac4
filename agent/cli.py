"""`fleet-agent join | run | status | devices`."""

import json
import logging
import signal
import sys

import click
import requests

from agent.client import FleetdError
from agent.config import ConfigError, load_config, parse_labels
from agent.daemon import EXIT_CONFIG, EXIT_FAILURE, Agent, enrol
from agent.devices import DeviceManager
from agent.logs import setup_logging
from agent.state import State

config_option = click.option("--config", "config_path", type=click.Path(dir_okay=False),
                             help="TOML config file (default /etc/fleet-agent/agent.toml).")


def _load(config_path, **overrides):
    try:
        return load_config(config_path, **overrides)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_CONFIG)


@click.group()
def cli():
    """fleet-agent: the fleetd host agent."""


@cli.command()
@click.option("--server", "server_url", help="fleetd URL (default: server_url from the config).")
@click.option("--token", envvar="FLEET_AGENT_JOIN_TOKEN", required=True,
              help="Join token flj_... (or FLEET_AGENT_JOIN_TOKEN, which keeps it out of the process list).")
@click.option("--label", "labels", multiple=True, help="Extra node label key=value (repeatable).")
@click.option("--force", is_flag=True, help="Enrol again even if credentials are stored.")
@config_option
def join(server_url, token, labels, force, config_path):
    """Enrol this host with a join token and store its credentials (once)."""
    config = _load(config_path, server_url=server_url)
    setup_logging(config.log_level, stream=sys.stderr)
    logging.getLogger("agent.devices").setLevel(logging.WARNING)  # one line per GPU is for the service log
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
        click.echo(f"already enrolled as node {node['node_id']} in fleet {node['fleet']} (use --force to enrol again)")


@cli.command()
@click.option("--deregister-on-stop", is_flag=True, help="Leave the fleet when stopped with SIGTERM.")
@config_option
def run(deregister_on_stop, config_path):
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
        click.echo(f"GPU {gpu['index']}: {gpu['model']} (UUID: {gpu['uuid']}) {', '.join(extras)}; {health}")


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
        ready = requests.get(base + "/readyz", timeout=3, verify=False)
    except requests.RequestException:
        return out
    out["running"] = True
    body = ready.json()
    out["ready"] = ready.status_code == 200
    out["readiness"] = body.get("data") or body.get("error", {}).get("details") or {}
    if token:
        resp = requests.get(base + "/api/v1/devices", timeout=10, verify=False,
                            headers={"Authorization": f"Bearer {token}"})
        if resp.status_code == 200:
            out["gpus"] = resp.json()["data"]
    return out


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
    report = {
        "state_dir": config.state_dir,
        "node": node,
        "session": "stored" if state.session_token() else "missing",
        "agent": local,
        "devices": inventory,
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if node:
        click.echo(f"node:     {node['node_id']} in fleet {node['fleet']} ({node.get('server_url', '?')})")
        click.echo(f"machine:  {node.get('machine_id', '?')}, enrolled {node.get('registered_at', '?')}")
    else:
        click.echo(f"node:     not enrolled (run `fleet-agent join`; state dir {config.state_dir})")
    click.echo(f"session:  {report['session']}")
    if local["running"]:
        readiness = local.get("readiness", {})
        detail = "ready" if local.get("ready") else f"not ready: session {readiness.get('session', '?')}"
        if readiness.get("fleetd_error"):
            detail += f"; fleetd: {readiness['fleetd_error']}"
        click.echo(f"agent:    running at {local['url']}, {detail}")
    else:
        click.echo(f"agent:    not running (nothing answers at {local['url']})")
    click.echo(f"devices:  {len(inventory['gpus'])} GPU(s), from {inventory['source']}")
    _print_gpus(inventory)
