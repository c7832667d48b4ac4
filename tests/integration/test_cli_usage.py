"""`fleetd usage`, `fleetd budget`, `fleetd storage-price` and `fleetd idle` against a real
`fleetd serve`: a run the test's stand-in agent reports, accounted by the ledger's task, shown as a
table, JSON and CSV."""

import csv
import io
import json

import pytest
import requests

from tests.conftest import gpus
from tests.integration.conftest import admin, data_dir, server, server_factory  # noqa: F401 - fixtures
from tests.integration.test_cli import run  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def call(run, path, body, token, agent=True):
    headers = {"Authorization": f"Bearer {token}"}
    if agent:
        headers["X-Fleet-Protocol"] = "1"
    resp = requests.post(run.url + path, json=body, timeout=30, headers=headers)
    assert resp.status_code in (200, 201, 204), resp.text
    return resp.json() if resp.content else None


def test_usage_budget_and_storage_price_commands(run):
    admin_token = run.env["FLEETD_TOKEN"]
    run("fleet", "create", "gpu-a", "--no-validation")
    join = json.loads(run("join-token", "create", "--fleet", "gpu-a", "--json").stdout)["token"]
    session = call(
        run,
        "/api/v1/agent/register",
        {
            "hostname": "h1",
            "machine_id": "m1",
            "agent_version": "0.1",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**35},
            "gpus": gpus(2),
        },
        join,
    )["session_token"]
    call(run, "/api/v1/agent/heartbeat", {}, session)
    run("gpu-type", "set", gpus(1)[0]["model"], "--price", "3600")  # a second costs 1
    call(
        run,
        "/api/v1/jobs",
        {"name": "train", "command": ["true"], "resources": {"gpus": 2}, "team": "ml"},
        admin_token,
        agent=False,
    )
    assignment = call(run, "/api/v1/agent/acquire", {"wait_seconds": 20}, session)["assignment"]
    task = f"/api/v1/agent/tasks/{assignment['task_id']}"
    call(run, task + "/start", {"epoch": assignment["epoch"], "pid": 4242}, session)
    call(
        run,
        task + "/finish",
        {"epoch": assignment["epoch"], "outcome": "succeeded", "exit_code": 0},
        session,
    )
    call(run, "/api/v1/admin/tasks/usage/run", {}, admin_token, agent=False)

    report = json.loads(run("usage", "--since", "1d", "--by", "team", "--json").stdout)
    (row,) = report["rows"]
    assert row["group"] == "ml" and row["runs"] == 1 and row["gpu_hours_allocated"] > 0
    assert row["cost"] == pytest.approx(
        row["gpu_hours_allocated"] * 3600, abs=0.005
    )  # hours are rounded to 1e-6
    parsed = list(csv.DictReader(io.StringIO(run("usage", "--by", "team", "--csv").stdout)))
    assert parsed == [{k: "" if v is None else str(v) for k, v in row.items()}]
    table = run("usage", "--by", "team").stdout
    assert "ml" in table and "TOTAL" in table and "GPU-H ALLOCATED" in table

    shown = json.loads(
        run("budget", "set", "ml", "--cost", "1000000", "--on-exceed", "block", "--json").stdout
    )
    assert shown["on_exceed"] == "block" and shown["used_cost"] == pytest.approx(
        row["cost"], rel=1e-3
    )
    assert "ml" in run("budget", "list").stdout and "block" in run("budget", "show", "ml").stdout
    run("budget", "rm", "ml")
    assert "no budget" in run("budget", "show", "ml", expect=1).stderr
    assert "0.25 per GB-month" in run("storage-price", "--set", "0.25").stdout
    assert json.loads(run("storage-price", "--json").stdout)["per_gb_month"] == 0.25
    assert json.loads(run("idle", "--json").stdout) == []
