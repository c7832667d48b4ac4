"""`fleetd instance connect --timeout` waits for a connection in long-poll slices, at most that long."""

import json

import pytest

from tests.integration.conftest import admin, data_dir, server, server_factory  # noqa: F401 - fixtures
from tests.integration.test_cli import run  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def test_connect_with_a_timeout_gives_up_with_exit_2_when_the_instance_never_runs(run):
    inst = json.loads(run("instance", "create", "--gpus", "4", "--port", "8888", "--json", "--", "sleep", "1d").stdout)
    proc = run("instance", "connect", inst["id"], "--timeout", "1s", expect=2)  # no node: pending throughout
    assert proc.stderr.strip() == f"fleetd: instance {inst['id']} did not run within 1 s"
    assert proc.stdout == ""
