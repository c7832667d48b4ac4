"""`fleetd job cancel`, `job wait` and `job list` with a job that is cancelling: asked to stop, its
process not yet gone."""

import json
import threading

import pytest
import requests

from tests.conftest import gpus
from tests.integration.test_cli import run  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def _node(run, url):
    """A registered, heartbeating stand-in node: the protocol headers of its session."""
    run("fleet", "create", "gpu-a", "--no-validation")
    token = json.loads(run("join-token", "create", "--fleet", "gpu-a", "--json").stdout)["token"]
    headers = {"X-Fleet-Protocol": "1"}
    reg = requests.post(
        url + "/api/v1/agent/register",
        timeout=30,
        json={
            "hostname": "h1",
            "machine_id": "m1",
            "agent_version": "0.1",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**35},
            "gpus": gpus(2),
        },
        headers={"Authorization": f"Bearer {token}", **headers},
    ).json()
    headers["Authorization"] = f"Bearer {reg['session_token']}"
    requests.post(url + "/api/v1/agent/heartbeat", json={}, timeout=30, headers=headers)
    return headers


def test_cancel_of_a_running_job_says_cancelling_and_wait_ends_once_the_process_has_stopped(
    run, server
):
    headers = _node(run, server.url)
    job = json.loads(run("job", "submit", "--gpus", "1", "--json", "--", "sleep", "600").stdout)
    assignment = requests.post(
        server.url + "/api/v1/agent/acquire", json={"wait_seconds": 5}, timeout=30, headers=headers
    ).json()["assignment"]
    task = f"{server.url}/api/v1/agent/tasks/{assignment['task_id']}"
    requests.post(
        task + "/start", json={"epoch": assignment["epoch"], "pid": 1}, timeout=30, headers=headers
    )

    said = run("job", "cancel", job["id"]).stdout
    assert said.startswith(f"job {job['id']} cancelling: its processes are being stopped")
    assert job["id"] in run("job", "list", "--state", "cancelling").stdout
    # Still cancelling: `job wait` does not take it for ended.
    assert (
        run("job", "wait", job["id"], "--timeout", "1", expect=2).stdout.strip()
        == f"job {job['id']} cancelling (cancelled)"
    )
    answers = []
    waiter = threading.Thread(
        target=lambda: answers.append(run("job", "cancel", job["id"], "--wait"))
    )
    waiter.start()
    # The node reports the process ended: the job is cancelled, and the waiting cancel answers.
    requests.post(
        task + "/finish",
        json={"epoch": assignment["epoch"], "outcome": "cancelled", "exit_code": 143},
        timeout=30,
        headers=headers,
    )
    waiter.join(timeout=60)
    assert answers and answers[0].stdout.strip() == f"job {job['id']} cancelled"
    assert run("job", "wait", job["id"], expect=1).stdout.startswith(f"job {job['id']} cancelled")
