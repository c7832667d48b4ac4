"""Helpers of the instance tests: assignments of instance runs, a port range of their own, HTTP
probes."""

import os
import random
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from agent.ports import listening
from agent.procfs import recorded_pids, signal_pids, wait_gone
from agent.task.journal import read_state
from tests.support import wait_until
from tests.support.wire import ROOT

PY = sys.executable

# Serves HTTP on $FLEET_PORT_8000 from the volume (a file 'index.html' there answers GET /).
HTTP_SERVER = (
    "import functools, http.server, os\n"
    "handler = functools.partial(http.server.SimpleHTTPRequestHandler, "
    "directory=os.environ['FLEET_VOLUME'])\n"
    "print('serving on', os.environ['FLEET_PORT_8000'], flush=True)\n"
    "http.server.ThreadingHTTPServer(('127.0.0.1', int(os.environ['FLEET_PORT_8000'])), handler)"
    ".serve_forever()\n"
)


def instance_assignment(
    task_id, command, instance_id="inst-1", epoch=1, gpus=None, run_as=ROOT, **instance
):
    """An instance run's assignment (docs: the instances contract) with the given `instance` fields,
    run as `run_as` (root by default: see tests.support.wire.ROOT)."""
    spec = {
        "id": instance_id,
        "name": f"name-{instance_id}",
        "restart": "never",
        "ports": [],
        "volume_bytes": 0,
        "volume_mount_path": "/workspace",
        "image": None,
        "idle_stop": None,
    }
    spec.update(instance)
    return {
        "task_id": task_id,
        "job_id": f"job-{task_id}",
        "epoch": epoch,
        "rank": 0,
        "num_nodes": 1,
        "command": command,
        "env": {"GREETING": "hi"},
        "workdir": "",
        "gpus": gpus or [],
        "isolation": "exclusive",
        "max_runtime_seconds": None,
        "artifacts": [],
        "instance": spec,
        "run_as": run_as,
    }


PORTS_FLOOR = 10_000  # test port ranges lie between this and the kernel's ephemeral ports


def port_range(width=40):
    """(low, high): `width` ports, each free now, so that tests running at once do not share ports.

    The range lies below the kernel's ephemeral ports, where no outgoing connection or bind to port
    0 of a parallel test can take one of them meanwhile, in a block of its own per xdist worker."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    block = (ephemeral_low - PORTS_FLOOR) // workers
    first = PORTS_FLOOR + worker * block
    for _ in range(100):  # bounded: a block has hundreds of windows and few are in use
        low = random.randrange(first, first + block - width)
        if not any(listening(port) for port in range(low, low + width)):
            return low, low + width - 1
    raise AssertionError(f"no {width} free ports in {first}-{first + block - 1}")


def http_get(url, timeout=2.0):
    """(status, body) of GET url, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback URLs of the test
            return resp.status, resp.read().decode()
    except (urllib.error.URLError, ConnectionError, OSError):
        return None


def kill_left_instances(state_dir):
    """SIGKILL the processes of every run a state dir's journals name (what a failed test left
    running: instance processes outlive the agent by design). Returns the pids killed."""
    killed = []
    for path in Path(state_dir).glob("tasks/*/task.json"):
        try:
            record = read_state(path)
        except (OSError, ValueError):
            continue
        if record.get("task_id") is None or record.get("epoch") is None:
            continue
        pids = recorded_pids(record)
        signal_pids(pids, signal.SIGKILL)
        killed += pids
    wait_gone(killed, 10)
    return killed


def start_instance_agent(http, server_url, agent_factory, fleet="lab", env=None, **extra):
    """A started fleet-agent with 4 fake L4 GPUs in `fleet`, ready for instances (a port range of
    its own, no container runtime unless `extra` names one); returns it once its node is ready."""
    join = http(
        "POST", f"/api/v1/fleets/{fleet}/join-tokens", expect=201, json={"max_uses": 1}
    ).json()
    low, high = port_range()
    settings = {
        "tasks_kill_grace_seconds": 2.0,
        "ports_range": f"{low}-{high}",
        "containers_command": "none",
    }
    settings.update(extra)
    agent = agent_factory("host", shape="l4_x4", extra=settings, env=env)
    agent.join(join["token"], server_url, check=True)
    agent.start()
    node_id = agent.node()["node_id"]
    http.wait_node_ready(node_id)
    return agent


def wait_instance_state(http, instance_id, state, timeout=60):
    """The instance (REST) once it is in `state`; each look waits on fleetd's long poll for a
    change."""

    def check():
        found = http("GET", f"/api/v1/instances/{instance_id}?wait_seconds=2", expect=200).json()
        return found if found["state"] == state else None

    return wait_until(
        check, timeout=timeout, interval=0.05, message=f"instance {instance_id} {state}"
    )
