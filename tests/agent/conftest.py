"""Agent fixtures: the fake NVML with scenarios, stand-in fleetds (`fleetd`, `fakes`) and
fleet-agent processes; real `fleetd serve` processes come from tests/conftest.py
(tests/support/server.py)."""

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent import fake_nvml as fake_module
from agent.cgroups import Cgroups
from agent.keeper import KEEPER_FILE, read_json, same_process
from agent.procfs import find_mount, signal_pids
from agent.task.journal import read_state
from tests.agent.fakefleetd import FakeFleetd
from tests.support import wait_until  # noqa: F401 - the agent tests import it from here
from tests.support.http import Http  # noqa: F401 - the agent tests import it from here
from tests.support.process import LoggedProcess
from tests.support.workloads import Gate

SHAPES = Path(__file__).resolve().parent.parent / "fixtures" / "nvml"
TEST_CGROUPS = "fleet-agent-tests"  # below the cgroup v2 mount: one parent per test agent below it
SCENARIOS = ("h100_x8", "a100_mig_x2", "h100_mig_x2", "l4_x4", "gpu_lost", "no_driver")


def shape_path(name):
    """Path of a host shape fixture."""
    return SHAPES / f"{name}.json"


class FakeNvml:
    """Scenarios for the fake NVML: `use(name)` copies a shape to a writable file and returns its
    path; the other methods act on the shape in use in this process."""

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


class AgentProcess(LoggedProcess):
    """`fleet-agent` commands with their own config, state dir and fake host shape; `run` keeps its
    output."""

    def __init__(self, root, name, shape="h100_x8", server_url="", extra=None, env=None):
        super().__init__()
        self.root = Path(root) / name
        self.root.mkdir(parents=True)
        self.name = name
        self.shape = self.root / "shape.json"
        shutil.copy(shape_path(shape), self.shape)
        self.state_dir = self.root / "state"
        self.config = self.root / "agent.toml"
        # Task cgroups are named by task id, and the stand-in fleetd's ids repeat from test to test:
        # each agent gets a cgroup parent of its own, so that agents of tests run at once never
        # share one.
        self.cgroup_parent = f"{TEST_CGROUPS}/{name}-{os.getpid()}-{secrets.token_hex(4)}"
        settings = {
            "state_dir": str(self.state_dir),
            "machine_id": name,
            "backoff_max_seconds": 1.0,
            "request_timeout_seconds": 5.0,
            "limits_cgroup_parent": self.cgroup_parent,
        }
        if server_url:
            settings["server_url"] = server_url
        settings.update(extra or {})
        lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
        lines += [
            "[labels]",
            'simulated = "true"',
            "[local_api]",
            'listen = "127.0.0.1:0"',
            "[devices]",
            f"backend = {json.dumps('fake:' + str(self.shape))}",
            "poll_seconds = 0.2",
        ]
        self.config.write_text("\n".join(lines) + "\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_AGENT_")}
        self.env.update(env or {})

    def cmd(self, *args):
        return [sys.executable, "-m", "agent", *args, "--config", str(self.config)]

    def join(self, token, server_url, *extra, check=True):
        """Run `fleet-agent join`; returns the CompletedProcess."""
        result = subprocess.run(
            self.cmd("join", "--server", server_url, *extra),
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(self.env, FLEET_AGENT_JOIN_TOKEN=token),
        )
        if check:
            assert result.returncode == 0, result.stderr
        return result

    def start(self, *extra, env=None):
        """Start `fleet-agent run` in the background."""
        self._spawn(
            self.cmd("run", *extra),
            dict(self.env, **(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        return self

    @property
    def local_url(self):
        return self.wait_for_line(r"local API on (\S+),").group(1)

    def node(self):
        return json.loads((self.state_dir / "node.json").read_text())

    def local_token(self):
        return (self.state_dir / "local-api.token").read_text().strip()

    def keeper_pid(self):
        """The pid of the agent's fence keeper (agent/keeper.py) while it runs, else None."""
        record = read_json(self.state_dir / KEEPER_FILE) or {}
        return record["pid"] if same_process(record) else None

    def remove_task_cgroups(self):
        """Kill what is left in the task cgroups of a killed agent and remove them (a restart
        would), and its fence keeper (which would go by itself once no job task is left)."""
        keeper = self.keeper_pid()
        if keeper is not None:
            signal_pids([keeper], signal.SIGKILL)
        cgroups = Cgroups("")
        for state in self.state_dir.glob("tasks/*/task.json"):
            try:
                path = read_state(state).get("cgroup")
            except (OSError, ValueError):
                continue
            if path and os.path.isdir(path):
                cgroups.remove(path)
        mount = find_mount("cgroup2")
        if mount:
            for parent in (
                self.cgroup_parent,
                TEST_CGROUPS,
            ):  # the second only once no test uses it
                try:
                    os.rmdir(os.path.join(mount, parent))
                except OSError:
                    pass


@pytest.fixture
def fleetd():
    """A stand-in fleetd (tests/agent/fakefleetd.py) on a loopback port."""
    fake = FakeFleetd().start()
    yield fake
    fake.stop()


@pytest.fixture
def gate():
    """A release the test opens (tests/support/workloads.py); tasks wait on it with `gate_wait`."""
    opened = Gate()
    yield opened
    opened.close()


@pytest.fixture
def gates():
    """Make as many gates as a test needs; all are closed at the end."""
    made = []

    def make():
        made.append(Gate())
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.fixture
def fakes():
    """Two stand-in fleetds, each on its own loopback port (replicas)."""
    started = [FakeFleetd().start(), FakeFleetd().start()]
    yield started
    for fake in started:
        fake.stop()


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
