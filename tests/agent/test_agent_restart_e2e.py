"""Restarting the agent (SIGTERM, start again) uses no attempt of the jobs it ran: a real `fleetd
serve` and a real `fleet-agent run` on fake GPUs, with a real `sleep` task. A task killed from
outside while the agent runs still fails."""

import os
import signal

import pytest

from agent.procfs import wait_gone
from tests.agent.conftest import Http, wait_until
from tests.agent.test_jobs_e2e import job_logs, submit, wait_job

pytestmark = pytest.mark.integration

# The task lease is long, so that the restart beats it: what settles the job is the agent's report.
SETTINGS = {
    "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1",
    "FLEETD_NODE_TTL_SECONDS": "2",
    "FLEETD_NODE_GRACE_SECONDS": "1",
    "FLEETD_LIVENESS_SWEEP_SECONDS": "0.5",
    "FLEETD_FAILOVER_GRACE_SECONDS": "1",
    "FLEETD_TASK_LEASE_SECONDS": "60",
    "FLEETD_LEASE_SWEEP_SECONDS": "0.5",
    "FLEETD_SCHEDULER_INTERVAL_SECONDS": "0.5",
}
ONE_ATTEMPT = {"max_attempts": 1, "on": ["node_lost", "preempted"]}
SLEEP = ["sh", "-c", 'echo "started $$ epoch $FLEET_TASK_EPOCH"; exec sleep 600']


def _started(http, job_id, count):
    """The pid of the count-th start of the job's task, from its log."""

    def find():
        lines = [
            line["text"] for line in job_logs(http, job_id) if line["text"].startswith("started ")
        ]
        return lines if len(lines) >= count else None

    lines = wait_until(find, timeout=60, message=f"start {count} in the job's log")
    return int(lines[count - 1].split()[1])


def _running(job):
    return job["state"] == "running" and job["tasks"][0]["state"] == "running"


def test_an_agent_restart_requeues_its_task_without_an_attempt_and_an_outside_kill_still_fails(
    server_factory, admin, agent_factory
):
    server = server_factory(**SETTINGS)
    http = Http(server.url, admin)
    http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()
    agent = agent_factory("host", shape="l4_x4", extra={"tasks_kill_grace_seconds": 2.0})
    agent.join(join["token"], server.url)
    agent.start()

    job = submit(http, SLEEP, name="sleeper", retry=ONE_ATTEMPT)
    wait_job(http, job["id"], _running, message="the job to run")
    first = _started(http, job["id"], 1)

    for restart in (1, 2):
        agent.signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0, agent.log
        assert wait_gone([first], 5)
        again = http("GET", f"/api/v1/jobs/{job['id']}", expect=200).json()
        assert again["state"] in ("queued", "running") and again["attempt"] == 1, (again, agent.log)
        agent.start()
        again = wait_job(
            http, job["id"], _running, message=f"the job to run after restart {restart}"
        )
        assert again["attempt"] == 1
        first = _started(http, job["id"], restart + 1)
    events = http("GET", f"/api/v1/jobs/{job['id']}/events", expect=200).json()["items"]
    requeued = [
        e["reason"]
        for e in events
        if e["to_status"] == "queued" and "without using an attempt" in e["reason"]
    ]
    # One per stop; fleetd may also have placed the job on the stopping agent again, which handed it
    # back.
    assert sum("fleet-agent stopped" in r for r in requeued) == 2, requeued
    assert all(
        "fleet-agent stopped" in r or "not started: fleet-agent is stopping" in r for r in requeued
    ), requeued

    # Killed from outside while the agent runs: the job's own failure, and no retry is left.
    os.kill(first, signal.SIGKILL)
    done = wait_job(http, job["id"])
    assert done["state"] == "failed" and done["attempt"] == 1, done
    assert done["tasks"][0]["state"] == "failed"
