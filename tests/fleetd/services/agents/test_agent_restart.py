"""A task its agent stopped while shutting down (finish `lost` + `agent_stopping`) is requeued
without using an attempt; a task that failed, or one reported after an agent crash, counts as
before."""

import pytest


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    return api.create_join_token("gpu-a")


def _node(api, join, name):
    reg = api.register(join, machine_id=name, hostname=name, gpu_count=2)
    api.heartbeat(reg["session_token"])
    return reg["session_token"]


def _job(api, job_id):
    return api.get(f"/api/v1/jobs/{job_id}").get_json()


def _events(api, job_id):
    return api.get(f"/api/v1/jobs/{job_id}/events").get_json()["items"]


ONE_ATTEMPT = {"max_attempts": 1, "on": ["node_lost", "preempted"]}


def test_a_task_stopped_by_its_agent_shutting_down_is_requeued_keeping_its_attempt(api, fleet):
    session = _node(api, fleet, "n1")
    job = api.submit(retry=ONE_ATTEMPT)
    for _ in range(3):  # every restart of the agent: the same attempt again, never failed
        assignment = api.start_task(session)
        api.task_call(
            session,
            assignment,
            "finish",
            outcome="failed",
            exit_code=-15,
            lost=True,
            agent_stopping=True,
            reason="fleet-agent stopped",
        )
        again = _job(api, job["id"])
        assert again["state"] in ("queued", "running") and again["attempt"] == 1, again
    assert any(
        "agent was stopping" in e["reason"] and "without using an attempt" in e["reason"]
        for e in _events(api, job["id"])
    )
    # The run after the restarts ends as the job's own outcome says.
    assignment = api.start_task(session)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    assert _job(api, job["id"])["state"] == "succeeded"


def test_a_graceful_stop_reported_in_a_batch_also_keeps_the_attempt(api, fleet):
    session = _node(api, fleet, "n1")
    job = api.submit(retry=ONE_ATTEMPT)
    assignment = api.start_task(session)
    resp = api.post(
        "/api/v1/agent/finish",
        {
            "finishes": [
                {
                    "task_id": assignment["task_id"],
                    "epoch": assignment["epoch"],
                    "outcome": "failed",
                    "lost": True,
                    "agent_stopping": True,
                    "reason": "fleet-agent stopped",
                }
            ]
        },
        token=session,
        agent=True,
    )
    assert resp.status_code == 200 and resp.get_json()["results"][0]["status"] == 204, (
        resp.get_json()
    )
    again = _job(api, job["id"])
    assert again["state"] in ("queued", "running") and again["attempt"] == 1


def test_a_task_lost_without_a_graceful_stop_still_uses_an_attempt(api, fleet):
    # An agent that crashed reports its tasks at the next start with `lost` alone.
    session = _node(api, fleet, "n1")
    job = api.submit(retry=ONE_ATTEMPT)
    assignment = api.start_task(session)
    api.task_call(
        session,
        assignment,
        "finish",
        outcome="failed",
        lost=True,
        reason="fleet-agent restarted while the task ran; its processes were killed",
    )
    again = _job(api, job["id"])
    assert again["state"] == "failed" and again["attempt"] == 1


def test_a_task_that_failed_on_its_own_still_fails(api, fleet):
    session = _node(api, fleet, "n1")
    job = api.submit(retry=ONE_ATTEMPT)
    assignment = api.start_task(session)
    # agent_stopping without lost says nothing: the process ended on its own.
    api.task_call(
        session, assignment, "finish", outcome="failed", exit_code=-9, agent_stopping=True
    )
    assert _job(api, job["id"])["state"] == "failed"
