"""Agent fixtures: the fake NVML with scenarios, real fleetd and fleet-agent processes."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent import fake_nvml as fake_module
from agent.cgroups import Cgroups
from agent.task.journal import read_state
from tests.integration.conftest import FleetdProcess, Http, admin, data_dir, fleetd_cmd, server_factory  # noqa: F401
from tests.support import wait_until  # noqa: F401 - the agent tests import it from here

SHAPES = Path(__file__).resolve().parent.parent / "fixtures" / "nvml"
SCENARIOS = ("h100_x8", "a100_mig_x2", "l4_x4", "gpu_lost", "no_driver")


def shape_path(name):
    """Path of a host shape fixture."""
    return SHAPES / f"{name}.json"




class FakeNvml:
    """Scenarios for the fake NVML: `use(name)` copies a shape to a writable file and returns its path;
    the other methods act on the shape in use in this process."""

    def __init__(self, root):
        self.root = root

    def use(self, name):
        path = self.root / f"{name}.json"
        shutil.copy(shape_path(name), path)
        return path

    add_process = staticmethod(fake_module.add_process)
    inject_xid = staticmethod(fake_module.inject_xid)
    update_gpu = staticmethod(fake_module.update_gpu)


@pytest.fixture
def fake_nvml(tmp_path):
    """The fake NVML with scenarios (h100_x8, a100_mig_x2, l4_x4, gpu_lost, no_driver)."""
    yield FakeNvml(tmp_path)
    fake_module.reset()


def rewrite_shape(path, change):
    """Apply change(dict) to a shape file atomically, with a new mtime."""
    data = json.loads(Path(path).read_text())
    change(data)
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(data))
    before = os.stat(path).st_mtime_ns
    os.replace(tmp, path)
    if os.stat(path).st_mtime_ns == before:  # coarse file-system clocks
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


class FixedPortFleetd(FleetdProcess):
    """`fleetd serve` on a chosen port, so that it can be stopped and started again at the same URL."""

    def __init__(self, data_dir, port, env=None):
        super().__init__(data_dir, env, bind=f"127.0.0.1:{port}")
        self.port = port


class AgentProcess:
    """`fleet-agent` commands with their own config, state dir and fake host shape."""

    def __init__(self, root, name, shape="h100_x8", server_url="", extra=None, env=None):
        self.root = Path(root) / name
        self.root.mkdir(parents=True)
        self.name = name
        self.shape = self.root / "shape.json"
        shutil.copy(shape_path(shape), self.shape)
        self.state_dir = self.root / "state"
        self.config = self.root / "agent.toml"
        settings = {"state_dir": str(self.state_dir), "machine_id": name, "backoff_max_seconds": 1.0,
                    "request_timeout_seconds": 5.0}
        if server_url:
            settings["server_url"] = server_url
        settings.update(extra or {})
        lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
        lines += ["[labels]", 'simulated = "true"', "[local_api]", 'listen = "127.0.0.1:0"',
                  "[devices]", f"backend = {json.dumps('fake:' + str(self.shape))}", "poll_seconds = 0.2"]
        self.config.write_text("\n".join(lines) + "\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_AGENT_")}
        self.env.update(env or {})
        self.proc = None
        self.lines = []
        self._new_line = threading.Condition()

    def cmd(self, *args):
        return [sys.executable, "-m", "agent", *args, "--config", str(self.config)]

    def join(self, token, server_url, *extra, check=True):
        """Run `fleet-agent join`; returns the CompletedProcess."""
        result = subprocess.run(self.cmd("join", "--server", server_url, *extra), capture_output=True, text=True,
                                timeout=60, env=dict(self.env, FLEET_AGENT_JOIN_TOKEN=token))
        if check:
            assert result.returncode == 0, result.stderr
        return result

    def start(self, *extra, env=None):
        """Start `fleet-agent run` in the background."""
        self.lines = []
        self._eof = False
        self.proc = subprocess.Popen(self.cmd("run", *extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=dict(self.env, **(env or {})))
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()
        return self

    def _pump(self, stream):
        for line in stream:
            with self._new_line:
                self.lines.append(line)
                self._new_line.notify_all()
        with self._new_line:
            self._eof = True
            self._new_line.notify_all()

    def wait_for_line(self, pattern, timeout=30.0, count=1):
        """The count-th log line matching `pattern` (a regex match); AssertionError on timeout or exit."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._new_line:
            while True:
                found = [m for m in (regex.search(line) for line in self.lines) if m]
                if len(found) >= count:
                    return found[count - 1]
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._eof:
                    raise AssertionError(f"no {count} line(s) matching {pattern!r}:\n{self.log}")
                self._new_line.wait(min(remaining, 0.5))

    @property
    def local_url(self):
        return self.wait_for_line(r"local API on (\S+),").group(1)

    @property
    def log(self):
        return "".join(self.lines)

    def node(self):
        return json.loads((self.state_dir / "node.json").read_text())

    def local_token(self):
        return (self.state_dir / "local-api.token").read_text().strip()

    def signal(self, signum):
        os.kill(self.proc.pid, signum)

    def wait(self, timeout=30):
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def remove_task_cgroups(self):
        """Kill what is left in the task cgroups of a killed agent and remove them (a restart would)."""
        cgroups = Cgroups("")
        for state in self.state_dir.glob("tasks/*/task.json"):
            try:
                path = read_state(state).get("cgroup")
            except (OSError, ValueError):
                continue
            if path and os.path.isdir(path):
                cgroups.remove(path)


@pytest.fixture
def agent_factory(tmp_path):
    """Create AgentProcess objects; every started process is killed at the end."""
    made = []

    def make(name, **kwargs):
        agent = AgentProcess(tmp_path / "agents", name, **kwargs)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.kill()
        agent.remove_task_cgroups()
