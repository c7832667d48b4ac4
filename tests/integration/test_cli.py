"""The `fleetd` CLI against a real server: tables, --json, config from login, one-line errors."""

import json
import os
import stat
import subprocess

import pytest

from tests.integration.conftest import fleetd_cmd

pytestmark = pytest.mark.integration


@pytest.fixture
def run(server, admin, tmp_path):
    """Run `fleetd ...` with FLEETD_URL/FLEETD_TOKEN set; returns the CompletedProcess."""
    env = dict(
        os.environ,
        FLEETD_URL=server.url,
        FLEETD_TOKEN=admin,
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        COLUMNS="200",
    )

    def run(*args, expect=0, **env_overrides):
        proc = subprocess.run(
            fleetd_cmd(*args),
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, **env_overrides},
        )
        assert proc.returncode == expect, proc.stdout + proc.stderr
        return proc

    run.url, run.env = server.url, env
    return run


def test_operator_flow_fleet_join_token_and_node(run):
    run(
        "fleet",
        "create",
        "gpu-a",
        "--no-validation",
        "--label",
        "zone=eu-1",
        "--description",
        "rack one",
    )
    out = run("join-token", "create", "--fleet", "gpu-a", "--ttl", "2h", "--single-use").stdout
    join_line = next(line for line in out.splitlines() if "fleet-agent join" in line).strip()
    # The secret travels in the environment, never in argv (where `ps` shows it).
    assert join_line.startswith("FLEET_AGENT_JOIN_TOKEN=flj_")
    assert join_line.endswith(" fleet-agent join --server " + run.url)
    token = join_line.split()[0].split("=", 1)[1]
    assert "--token" not in join_line
    listed = json.loads(run("join-token", "list", "--fleet", "gpu-a", "--json").stdout)
    assert listed[0]["max_uses"] == 1 and "token" not in listed[0]
    assert token not in run("join-token", "list", "--fleet", "gpu-a").stdout
    fleets = run("fleet", "list").stdout
    assert "gpu-a" in fleets and "zone=eu-1" in fleets
    assert json.loads(run("fleet", "show", "gpu-a", "--json").stdout)["description"] == "rack one"
    assert json.loads(run("node", "list", "--json").stdout) == []


def test_token_create_list_revoke(run):
    created = json.loads(
        run(
            "token",
            "create",
            "--name",
            "ci",
            "--role",
            "submitter",
            "--expires-in",
            "30d",
            "--json",
        ).stdout
    )
    assert created["token"].startswith("fla_")
    table = run("token", "list").stdout
    assert "ci" in table and created["token"] not in table
    run("token", "revoke", created["id"])
    proc = run("fleet", "list", expect=1, FLEETD_TOKEN=created["token"])
    assert proc.stderr.strip() == (
        "fleetd: unauthorized: token revoked (check --token/FLEETD_TOKEN, or run `fleetd login`)"
    )


def test_errors_are_one_line_without_traceback(run, server):
    submitter = json.loads(
        run("token", "create", "--name", "s", "--role", "submitter", "--json").stdout
    )["token"]
    cases = [
        (("node", "show", "nope"), {}, "fleetd: not_found: node nope not found"),
        (("fleet", "create", "x"), {"FLEETD_TOKEN": submitter}, "fleetd: forbidden: "),
        (("fleet", "list"), {"FLEETD_TOKEN": "garbage"}, "fleetd: unauthorized: "),
        (
            ("fleet", "list"),
            {"FLEETD_URL": "http://127.0.0.1:9"},
            "fleetd: cannot connect to fleetd at http://127.0.0.1:9",
        ),
    ]
    for args, env, prefix in cases:
        proc = run(*args, expect=1, **env)
        assert proc.stderr.startswith(prefix), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_login_saves_url_and_token_privately_for_later_commands(run, server, admin, tmp_path):
    proc = run("login", "--url", server.url, "--token", admin, FLEETD_URL="", FLEETD_TOKEN="")
    assert "as token:admin (admin)" in proc.stdout
    path = tmp_path / "config" / "fleetd" / "config.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    run("fleet", "create", "from-login", FLEETD_URL="", FLEETD_TOKEN="")
    assert "from-login" in run("fleet", "list", FLEETD_URL="", FLEETD_TOKEN="").stdout


def test_node_actions_through_the_cli(run, server, admin):
    import requests

    from tests.conftest import gpus

    run("fleet", "create", "gpu-a", "--no-validation")
    token = json.loads(run("join-token", "create", "--fleet", "gpu-a", "--json").stdout)["token"]
    reg = requests.post(
        server.url + "/api/v1/agent/register",
        timeout=30,
        json={
            "hostname": "h1",
            "machine_id": "m1",
            "agent_version": "0.1",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**35},
            "gpus": gpus(8),
        },
        headers={"Authorization": f"Bearer {token}", "X-Fleet-Protocol": "1"},
    ).json()
    requests.post(
        server.url + "/api/v1/agent/heartbeat",
        json={},
        timeout=30,
        headers={"Authorization": f"Bearer {reg['session_token']}", "X-Fleet-Protocol": "1"},
    )
    node_id = reg["node_id"]
    assert "ready" in run("node", "list", "--fleet", "gpu-a").stdout
    shown = run("node", "show", node_id).stdout
    assert "H100" in shown and "80.0 GiB" in shown
    assert "now cordoned" in run("node", "cordon", node_id).stdout
    assert "now ready" in run("node", "uncordon", node_id).stdout
    assert (
        "now drained"
        in run("node", "drain", node_id, "--reason", "bios", "--deadline", "10m").stdout
    )
    assert "now ready" in run("node", "undrain", node_id).stdout
    events = json.loads(run("node", "events", node_id, "--json").stdout)
    assert [e["to_status"] for e in events if e["kind"] == "node.status"] == [
        "ready",
        "cordoned",
        "ready",
        "draining",
        "drained",
        "ready",
    ]
    status = run("status").stdout
    assert (
        "nodes: 1 (1 ready)" in status
        and "GPUs: 8 total = 0 used + 8 free + 0 blocked; 0 queued" in status
    )
    run("node", "revoke", node_id)
    run("fleet", "rm", "gpu-a", expect=1)
    run("node", "rm", node_id)
    run("fleet", "rm", "gpu-a")


def test_init_prints_the_admin_token_only_once(tmp_path):
    first = subprocess.run(
        fleetd_cmd("init", "--data-dir", str(tmp_path / "d")),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    second = subprocess.run(
        fleetd_cmd("init", "--data-dir", str(tmp_path / "d")),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert first.strip().splitlines()[-1].startswith("fla_")
    assert "fla_" not in second and "issued before" in second
    upgrade = subprocess.run(
        fleetd_cmd("db", "upgrade", "--data-dir", str(tmp_path / "d")),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "up to date" in upgrade


def test_job_commands_through_the_cli(run, server, tmp_path):
    import requests

    from tests.conftest import gpus

    run("fleet", "create", "gpu-a", "--no-validation")
    token = json.loads(run("join-token", "create", "--fleet", "gpu-a", "--json").stdout)["token"]
    agent = {"X-Fleet-Protocol": "1"}
    reg = requests.post(
        server.url + "/api/v1/agent/register",
        timeout=30,
        json={
            "hostname": "h1",
            "machine_id": "m1",
            "agent_version": "0.1",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**35},
            "gpus": gpus(2),
        },
        headers={"Authorization": f"Bearer {token}", **agent},
    ).json()
    agent["Authorization"] = f"Bearer {reg['session_token']}"
    requests.post(server.url + "/api/v1/agent/heartbeat", json={}, timeout=30, headers=agent)

    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: from-yaml\ncommand: [python, train.py]\nresources: {gpus: 1}\nenv: {EPOCHS: '3'}\n"
    )
    submitted = json.loads(
        run("job", "submit", "-f", str(spec), "--env", "LR=0.1", "--json").stdout
    )
    # fleetd serve places jobs in its scheduler loop, just after the submit answers.
    assert submitted["spec"]["env"] == {"EPOCHS": "3", "LR": "0.1"} and submitted["state"] in (
        "queued",
        "running",
    )
    job_id = submitted["id"]
    assignment = requests.post(
        server.url + "/api/v1/agent/acquire", json={"wait_seconds": 5}, timeout=30, headers=agent
    ).json()["assignment"]
    task = f"{server.url}/api/v1/agent/tasks/{assignment['task_id']}"
    requests.post(
        task + "/start", json={"epoch": assignment["epoch"], "pid": 1}, timeout=30, headers=agent
    )
    requests.post(
        task + "/logs",
        json={
            "epoch": assignment["epoch"],
            "lines": [["stdout", "epoch 1"], ["stderr", "warning"]],
        },
        timeout=30,
        headers=agent,
    )
    assert (
        run("job", "wait", job_id, "--timeout", "1", expect=2).stdout.strip()
        == f"job {job_id} running"
    )
    requests.post(
        task + "/finish",
        json={"epoch": assignment["epoch"], "outcome": "succeeded", "exit_code": 0},
        timeout=30,
        headers=agent,
    )
    assert run("job", "wait", job_id).stdout.strip() == f"job {job_id} succeeded (succeeded)"
    logs = run("job", "logs", job_id)
    assert logs.stdout == "epoch 1\n" and logs.stderr == "warning\n"
    assert "from-yaml" in run("job", "list", "--state", "succeeded").stdout
    assert "python train.py" in run("job", "show", job_id).stdout

    queued = json.loads(run("job", "submit", "--gpus", "4", "--json", "--", "sleep", "1").stdout)
    assert queued["state"] == "queued"
    shown = json.loads(run("job", "show", queued["id"], "--json").stdout)
    assert shown["pending_reason"] == (
        "no enrolled node could ever hold it: it needs 4 GPUs on one node, the most "
        "any matching node has is 2"
    )
    assert run("job", "cancel", queued["id"]).stdout.strip() == f"job {queued['id']} cancelled"
    assert run("job", "wait", queued["id"], expect=1).stdout.startswith(
        f"job {queued['id']} cancelled"
    )
    proc = run("job", "submit", "--gpus", "1.5", "--", "true", expect=1)
    assert proc.stderr == (
        "fleetd: invalid_request: resources.gpus: an integer from 0 to 1024, "
        "or a fraction 0.01 <= x < 1 of one GPU\n"
    )


def test_scheduling_policy_through_the_cli(run, server):
    run("fleet", "create", "gpu-a", "--no-validation")
    run("fleet", "update", "gpu-a", "--window", "00:00-00:00@sat,sun", "--timezone", "Europe/Paris")
    shown = json.loads(run("fleet", "show", "gpu-a", "--json").stdout)
    assert shown["availability"] == {
        "timezone": "Europe/Paris",
        "windows": [{"start": "00:00", "end": "00:00", "days": ["sat", "sun"]}],
    }
    run("fleet", "update", "gpu-a", "--always-open")
    assert json.loads(run("fleet", "show", "gpu-a", "--json").stdout)["availability"] is None
    run("gpu-type", "set", "NVIDIA H100 80GB HBM3", "--price", "4.5", "--spot-min-bid", "1.5")
    assert "4.5" in run("gpu-types").stdout
    run("quota", "set", "vision", "--max-gpus", "8", "--class", "spot")
    assert json.loads(run("quota", "list", "--json").stdout) == [
        {"team": "vision", "priority_class": "spot", "max_gpus": 8.0}
    ]
    run("quota", "rm", "vision")
    assert json.loads(run("quota", "list", "--json").stdout) == []
    job = json.loads(run("job", "submit", "--gpus", "1", "--json", "--", "true").stdout)
    why = run("job", "why", job["id"]).stdout
    assert why == f"job {job['id']} is queued: no node is enrolled\n"
