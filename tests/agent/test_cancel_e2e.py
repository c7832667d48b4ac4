"""Cancel end to end: a real `fleetd serve` and a real `fleet-agent run` on fake GPUs. The stop
reaches the agent through its acquire long-poll, long before a heartbeat could carry it."""

import sys

import pytest

from agent.procfs import wait_gone
from tests.agent.conftest import Http, wait_until
from tests.agent.test_jobs_e2e import alive, job_logs, submit, wait_job
from tests.support.workloads import hold

pytestmark = pytest.mark.integration

PY = sys.executable
# Heartbeats a minute apart (the node's TTL well beyond): the heartbeat's `cancel` list, the
# fallback, cannot be what stops the task within this test.
SLOW_HEARTBEAT = {
    "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "60",
    "FLEETD_NODE_TTL_SECONDS": "300",
    "FLEETD_TASK_LEASE_SECONDS": "300",
    "FLEETD_SCHEDULER_INTERVAL_SECONDS": "0.5",
}
HEARTBEAT_SECONDS = 60.0


def test_cancel_of_a_running_job_stops_its_process_long_before_a_heartbeat_then_it_is_cancelled(
    server_factory, admin, agent_factory
):
    server = server_factory(**SLOW_HEARTBEAT)
    http = Http(server.url, admin)
    http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={}).json()
    agent = agent_factory(
        "host-0",
        shape="l4_x4",
        extra={"heartbeat_interval_seconds": HEARTBEAT_SECONDS, "tasks_kill_grace_seconds": 30.0},
    )
    agent.join(join["token"], server.url)
    agent.start()
    node_id = agent.node()["node_id"]
    wait_until(
        lambda: http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()["status"] == "ready",
        timeout=60,
        message="the node to be ready",
    )
    code = "import os\nprint(os.getpid(), flush=True)\n" + hold(600)
    job = submit(http, [PY, "-c", code], name="cancel-me")
    lines = wait_until(
        lambda: job_logs(http, job["id"]), timeout=60, interval=0.05, message="the pid in the log"
    )
    pid = int(lines[0]["text"])
    assert alive(pid)
    heartbeat_before = http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()[
        "last_heartbeat_at"
    ]

    answer = http("POST", f"/api/v1/jobs/{job['id']}/cancel", expect=200).json()
    assert answer["state"] == "cancelling" and answer["tasks"][0]["state"] == "running"
    # SIGTERM ends it (the grace before SIGKILL is 30 s); the agent heard of it through acquire.
    assert wait_gone([pid], 10), agent.log
    done = wait_job(http, job["id"], timeout=30)
    assert done["state"] == "cancelled" and done["tasks"][0]["state"] == "cancelled", done
    # No heartbeat came between the cancel and the end: none can have carried the stop.
    assert (
        http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()["last_heartbeat_at"]
        == heartbeat_before
    )
    agent.wait_for_line(r"task \S+: cancelled, exit code 143")
    assert "stopping task" in agent.log and "cancelled by fleetd" in agent.log
