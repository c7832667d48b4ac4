"""Real `fleetd serve` processes on loopback, and the fixtures that start them (exposed to every
test package by tests/conftest.py): `data_dir`, `admin` (`fleetd init`'s first admin token),
`server_factory` (start(**env) -> FleetdProcess; every one is killed at the end) and `server`."""

import os
import subprocess
import sys

import pytest

from tests.support.process import LoggedProcess

START_TIMEOUT = 30
# Webhook receivers in tests listen on loopback, which fleetd refuses unless allowed; a test of the
# refusal itself starts fleetd with FLEETD_WEBHOOKS_ALLOW_TARGETS="" (the default: nothing allowed).
ALLOW_LOOPBACK_WEBHOOKS = {"FLEETD_WEBHOOKS_ALLOW_TARGETS": "127.0.0.0/8"}


def fleetd_cmd(*args):
    return [sys.executable, "-m", "fleetd", *args]


class FleetdProcess(LoggedProcess):
    """`fleetd serve` on `bind` (a free loopback port unless told otherwise); the log (stderr) is
    kept for assertions and `url` is where it listens once started."""

    def __init__(self, data_dir, env=None, bind="127.0.0.1:0"):
        super().__init__()
        self.data_dir = data_dir
        self.env = {**os.environ, **ALLOW_LOOPBACK_WEBHOOKS, **(env or {})}
        self.bind = bind
        self.url = None

    def start(self):
        self._spawn(
            fleetd_cmd("serve", "--bind", self.bind, "--data-dir", str(self.data_dir)),
            self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            self.url = self.wait_for_line(r"listening on (http://\S+)", START_TIMEOUT).group(1)
        except AssertionError:
            self.kill()
            raise AssertionError("fleetd serve did not start:\n" + self.log) from None
        return self


def fleetd_init(data_dir, env=None):
    """Run `fleetd init` (with `env` added to the environment); returns the first admin token."""
    out = subprocess.run(
        fleetd_cmd("init", "--data-dir", str(data_dir)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=dict(os.environ, **(env or {})),
    ).stdout
    return out.strip().splitlines()[-1]


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "fleetd-data"


@pytest.fixture
def server_factory(data_dir):
    """start(**env) -> a started FleetdProcess over `data_dir`; every one started is killed at the
    end."""
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
