"""Helpers of the instance tests: assignments of instance runs, a port range of their own, HTTP probes."""

import signal
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

from agent.procfs import recorded_pids, signal_pids, wait_gone
from agent.task.journal import read_state

PY = sys.executable

# Serves HTTP on $FLEET_PORT_8000 from the volume (a file 'index.html' there answers GET /).
HTTP_SERVER = ("import functools, http.server, os\n"
               "handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=os.environ['FLEET_VOLUME'])\n"
               "print('serving on', os.environ['FLEET_PORT_8000'], flush=True)\n"
               "http.server.ThreadingHTTPServer(('127.0.0.1', int(os.environ['FLEET_PORT_8000'])), handler)"
               ".serve_forever()\n")


def instance_assignment(task_id, command, instance_id="inst-1", epoch=1, gpus=None, **instance):
    """An instance run's assignment (docs: the instances contract) with the given `instance` fields."""
    spec = {"id": instance_id, "name": f"name-{instance_id}", "restart": "never", "ports": [],
            "volume_bytes": 0, "volume_mount_path": "/workspace", "image": None, "idle_stop": None}
    spec.update(instance)
    return {"task_id": task_id, "job_id": f"job-{task_id}", "epoch": epoch, "rank": 0, "num_nodes": 1,
            "command": command, "env": {"GREETING": "hi"}, "workdir": "", "gpus": gpus or [],
            "isolation": "exclusive", "max_runtime_seconds": None, "artifacts": [], "instance": spec}


def port_range(width=40):
    """(low, high): `width` ports starting at one free now, so that tests running at once do not share ports."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        low = sock.getsockname()[1]
    low = min(low, 65535 - width)
    return low, low + width - 1


def http_get(url, timeout=2.0):
    """(status, body) of GET url, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback URLs of the test
            return resp.status, resp.read().decode()
    except (urllib.error.URLError, ConnectionError, OSError):
        return None


def kill_left_instances(state_dir):
    """SIGKILL the processes of every run a state dir's journals name (what a failed test left running:
    instance processes outlive the agent by design). Returns the pids killed."""
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
