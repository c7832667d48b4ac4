"""`fleet-agent status` agrees with itself: the config and state dir it read, and a running agent
that is not the one this config describes."""

import json
import socket
import subprocess
import sys

import pytest

from tests.agent.conftest import agent_factory, wait_until  # noqa: F401 - the fixture
from tests.integration.conftest import Http

pytestmark = pytest.mark.integration


def status(config, env):
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_status_of_an_unenrolled_config_while_another_agent_runs_says_so_instead_of_ready(
    server, admin, agent_factory, tmp_path
):  # noqa: F811 - the fixture
    http = Http(server.url, admin)
    http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
    token = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()[
        "token"
    ]
    with socket.socket() as probe:  # a fixed port, so that both configs name the same local API
        probe.bind(("127.0.0.1", 0))
        listen = f"127.0.0.1:{probe.getsockname()[1]}"
    running = agent_factory("running", env={"FLEET_AGENT_LOCAL_API_LISTEN": listen})
    running.join(token, server.url)
    running.start()
    node_id = running.node()["node_id"]
    wait_until(
        lambda: (
            "running at" in status(running.config, running.env)
            and ", ready" in status(running.config, running.env)
        ),
        message="the agent to be ready",
    )

    # The same local API address, another (empty) state dir: what `fleet-agent status` without
    # --config sees on a host whose agent runs with a config elsewhere.
    other = tmp_path / "other.toml"
    other.write_text(
        f'state_dir = {json.dumps(str(tmp_path / "empty-state"))}\nmachine_id = "other"\n'
        f'[local_api]\nlisten = "{listen}"\n[devices]\n'
        f"backend = {json.dumps('fake:' + str(running.shape))}\n"
    )
    said = status(other, running.env)
    lines = dict(
        line.split(":", 1) for line in said.splitlines() if line[:1].isalpha() and ":" in line
    )
    assert lines["config"].strip() == str(other)
    assert lines["state"].strip() == str(tmp_path / "empty-state")
    assert lines["node"].strip().startswith("not enrolled in this state dir")
    assert (
        lines["agent"]
        .strip()
        .startswith(
            f"an agent answers at http://{listen}, but this state dir holds no enrolment: "
            "that agent runs with another config; run `fleet-agent status --config FILE`"
        )
    )
    assert ", ready" not in lines["agent"]
    report = json.loads(
        subprocess.run(
            [sys.executable, "-m", "agent", "status", "--json", "--config", str(other)],
            capture_output=True,
            text=True,
            timeout=60,
            env=running.env,
            check=True,
        ).stdout
    )
    assert (
        report["config"] == str(other)
        and report["node"] is None
        and "another config" in report["mismatch"]
    )

    # Its own config: no mismatch.
    own = status(running.config, running.env)
    assert f"node:     {node_id} in fleet lab" in own and "another config" not in own
