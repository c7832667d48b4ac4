"""`fleetd instance connect --timeout` waits for a connection in long-poll slices, at most that
long. The server here caps a long poll at 0.5 s, so every wait takes several slices, and writes its
access log."""

import json

import pytest
import requests

from tests.fleetd.cli.test_cli_instances import Agent, in_thread
from tests.integration.conftest import admin, data_dir, server_factory  # noqa: F401 - fixtures
from tests.integration.test_cli import run  # noqa: F401 - the fixture
from tests.support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def server(server_factory, admin):  # noqa: F811 - short long-poll slices, access log (DEBUG) on
    return server_factory(FLEETD_LONG_POLL_MAX_SECONDS="0.5", FLEETD_LOG_LEVEL="DEBUG")


def test_connect_with_a_timeout_gives_up_with_exit_2_when_the_instance_never_runs(run):
    inst = json.loads(
        run(
            "instance", "create", "--gpus", "4", "--port", "8888", "--json", "--", "sleep", "1d"
        ).stdout
    )
    proc = run(
        "instance", "connect", inst["id"], "--timeout", "1s", expect=2
    )  # no node: pending throughout
    assert proc.stderr.strip() == f"fleetd: instance {inst['id']} did not run within 1 s"
    assert proc.stdout == ""


CONNECTION_ANSWER = r'"GET /api/v1/instances/{}/connection\S* HTTP/1\.1" {}'


def test_connect_waits_on_past_a_slice_and_prints_the_url_once_the_instance_runs(run, server):
    agent = Agent(run, server.url)
    inst = json.loads(
        run(
            "instance", "create", "--gpus", "1", "--port", "8888", "--json", "--", "sleep", "1d"
        ).stdout
    )
    waiting, out = in_thread(lambda: run("instance", "connect", inst["id"], "--timeout", "60s"))
    # A first slice ended (504: not running yet) and the CLI asked again; only now does the node
    # start it.
    server.wait_for_line(CONNECTION_ANSWER.format(inst["id"], 504), timeout=30)
    shown = f"{server.url}/api/v1/instances/{inst['id']}"
    headers = {"Authorization": f"Bearer {run.env['FLEETD_TOKEN']}"}
    wait_until(
        lambda: requests.get(shown, headers=headers, timeout=10).json()["state"] == "starting",
        timeout=30,
        message="the scheduler to place the instance on the stand-in's node",
    )  # before a 0.5 s acquire
    agent.start([(8888, 40888, "http")])
    waiting.join(timeout=60)
    assert out and out[0].stdout == "http://127.0.0.1:40888/\n", "connect did not print the URL"
    server.wait_for_line(CONNECTION_ANSWER.format(inst["id"], 200), timeout=10)
