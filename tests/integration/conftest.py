"""Real `fleetd` processes on loopback."""

import glob
import os
import pathlib
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from tests.support.http import Http  # noqa: F401 - tests import it from here

START_TIMEOUT = 30


def fleetd_cmd(*args):
    return [sys.executable, "-m", "fleetd", *args]


class FleetdProcess:
    """`fleetd serve` on a free loopback port; the log is kept for assertions."""

    def __init__(self, data_dir, env=None, bind="127.0.0.1:0"):
        self.data_dir = data_dir
        self.env = dict(os.environ, **(env or {}))
        self.bind = bind
        self.proc = None
        self.url = None
        self.lines = []

    def start(self):
        self.lines = []
        self.proc = subprocess.Popen(
            fleetd_cmd("serve", "--bind", self.bind, "--data-dir", str(self.data_dir)),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=self.env,
        )
        lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stderr, lines), daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                self.url = match.group(1)
                return self
            if line is None:
                break
        self.kill()
        raise AssertionError("fleetd serve did not start:\n" + "".join(self.lines))

    def _pump(self, stream, lines):
        for line in stream:
            self.lines.append(line)
            lines.put(line)
        lines.put(None)

    def signal(self, signum):
        os.kill(self.proc.pid, signum)

    def wait(self, timeout=30):
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    @property
    def log(self):
        return "".join(self.lines)


def fleetd_init(data_dir):
    """Run `fleetd init`; returns the first admin token."""
    out = subprocess.run(fleetd_cmd("init", "--data-dir", str(data_dir)), capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return out.strip().splitlines()[-1]


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "fleetd-data"


@pytest.fixture
def server_factory(data_dir):
    started = []

    def start(**env):
        proc = FleetdProcess(data_dir, env).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def admin(data_dir):
    return fleetd_init(data_dir)


@pytest.fixture
def server(server_factory, admin):
    return server_factory()


def _pg_bin(name):
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    return found


def _as_postgres(args):
    """Run a PostgreSQL tool as the postgres user when we are root (initdb refuses root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *args]
    return args


@pytest.fixture(scope="session")
def postgres_url():
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries are not installed (scripts/setup.sh installs them)")
    # Not under pytest's tmp dir: that is private to root, and the server runs as postgres.
    base = pathlib.Path(tempfile.mkdtemp(prefix="fleetd-pg-"))
    data = base / "data"
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(_as_postgres([initdb, "-D", str(data), "-A", "trust", "-U", "fleetd", "--no-sync"]),
                   check=True, capture_output=True, timeout=120)
    opts = f"-h 127.0.0.1 -p {port} -k {base} -c fsync=off"
    subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-o", opts, "-l", str(base / "log"), "-w", "-t", "60",
                                 "start"]), check=True, capture_output=True, timeout=120)
    try:
        yield f"postgresql://fleetd@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
