"""The server reconciles what it holds with what nodes say: a task a live node stops listing ends
`lost` after the delivery grace (services/agents/work.py), and a GPU hold that outlived its task is
freed and counted (services/nodes/holds.py)."""

import pytest

from fleetd.db import database
from fleetd.models import Job

GRACE = 20  # 2 heartbeat intervals of 10 s


@pytest.fixture
def fleet(api, clock):
    clock.advance(
        61
    )  # past the failover grace (2 x TTL) of a fleetd that just started: nothing is judged in it
    api.create_fleet("gpu-a")
    return api.create_join_token("gpu-a")


def listing(*assignments, state="running"):
    return [{"id": a["task_id"], "epoch": a["epoch"], "state": state} for a in assignments]


def job_events(api, job_id):
    resp = api.get(f"/api/v1/jobs/{job_id}/events")
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["items"]


def gpus_used(api):
    return api.get("/api/v1/cluster/status").get_json()["gpu"]["used"]


def leaked_gpus_freed(api):
    text = api.get("/metrics").get_data(as_text=True)
    return float(
        next(
            line.split()[1]
            for line in text.splitlines()
            if line.startswith("fleetd_leaked_gpus_freed_total ")
        )
    )


def test_a_task_its_live_node_stops_listing_is_lost_after_the_grace_and_its_job_retries(
    api, fleet, clock
):
    node, session = api.ready_node(fleet, "n1", gpu_count=1)
    job = api.submit(resources={"gpus": 1})
    first = api.start_task(session)
    clock.advance(10)
    api.heartbeat(session, tasks=listing(first))
    clock.advance(10)
    api.heartbeat(session)  # the agent no longer has it (it forgot it, or lost it in a crash)
    assert api.run_task("leases") == {
        "expired": 0,
        "reconciled": 0,
    }  # 10 s unlisted: within the grace
    clock.advance(GRACE)
    api.heartbeat(session)
    assert api.run_task("leases") == {
        "expired": 0,
        "reconciled": 1,
    }  # long before its 40 s lease runs out
    retried = api.job(job["id"])
    assert (
        retried["attempt"] == 2 and retried["state"] == "running"
    )  # placed again at once: its GPU is free
    reasons = [e["reason"] for e in job_events(api, job["id"]) if e["to_status"] == "lost"]
    assert len(reasons) == 1 and reasons[0].startswith(
        f"rank 0: reconciled: node {node} is alive and has not listed the task since "
    )
    second = api.start_task(session)
    assert second["task_id"] == first["task_id"] and second["epoch"] == first["epoch"] + 1
    api.task_call(
        session, first, "finish", expect=409, outcome="succeeded", exit_code=0
    )  # the old epoch is fenced


def test_an_assignment_in_flight_or_not_yet_taken_is_not_reconciled(api, fleet, clock):
    _, session = api.ready_node(fleet, "n1", gpu_count=2)
    api.submit(resources={"gpus": 1})
    delivered = api.acquire(session)
    api.heartbeat(session)  # sent before the assignment arrived, received after it
    assert api.run_task("leases") == {"expired": 0, "reconciled": 0}
    clock.advance(10)
    api.heartbeat(session, tasks=listing(delivered, state="starting"))
    undelivered = api.submit(name="not-taken", resources={"gpus": 1})  # the node never acquires it
    for _ in range(3):
        clock.advance(10)
        api.heartbeat(session, tasks=listing(delivered))
    assert api.run_task("leases") == {"expired": 0, "reconciled": 0}  # only the lease judges it
    clock.advance(15)
    api.heartbeat(session, tasks=listing(delivered))
    assert api.run_task("leases") == {"expired": 1, "reconciled": 0}
    assert api.job(undelivered["id"])["attempt"] == 2


def test_a_listed_task_of_a_cancelling_job_is_left_to_its_lease(api, fleet, clock):
    _, session = api.ready_node(fleet, "n1", gpu_count=1)
    job = api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    assert api.post(f"/api/v1/jobs/{job['id']}/cancel").get_json()["state"] == "cancelling"
    for _ in range(3):  # its process takes long to stop; the node lists it all along (not renewed)
        clock.advance(10)
        assert api.heartbeat(session, tasks=listing(assignment))["cancel"] == [
            assignment["task_id"]
        ]
    assert api.run_task("leases") == {"expired": 0, "reconciled": 0}
    assert api.job(job["id"])["state"] == "cancelling"


def test_a_gpu_held_by_the_stale_listing_of_an_ended_task_is_freed_and_counted(api, fleet, clock):
    node, session = api.ready_node(fleet, "n1", gpu_count=2)
    job = api.submit(resources={"gpus": 2}, retry={"max_attempts": 1, "on": ["node_lost"]})
    assignment = api.start_task(session)
    api.heartbeat(session, tasks=listing(assignment))
    # The node's heartbeats go elsewhere from now on (another replica): the task's lease runs out
    # here, and no heartbeat here ever replaces the listing that says it runs.
    clock.advance(45)
    assert api.run_task("leases") == {"expired": 1, "reconciled": 0}
    assert api.job(job["id"])["state"] == "failed"
    assert gpus_used(api) == 2  # the ended task's process would still be stopping: its GPUs held
    assert api.run_task("gpu_holds") == {
        "freed": 0
    }  # not yet older than any live node's listing (2 x 40 s)
    clock.advance(40)
    assert api.run_task("gpu_holds") == {"freed": 2}
    assert gpus_used(api) == 0 and leaked_gpus_freed(api) == 2
    assert api.run_task("gpu_holds") == {"freed": 0}  # fixed once
    # A fresh listing from the node counts again at once.
    api.heartbeat(session, tasks=listing(assignment))
    assert gpus_used(api) == 2


def test_an_active_task_of_an_ended_job_is_cancelled_its_node_told_and_its_gpus_counted(
    api, fleet, clock
):
    _, session = api.ready_node(fleet, "n1", gpu_count=2)
    job = api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    with database.connection_context():  # what a transition refused half-way once left behind
        Job.update(state="succeeded").where(Job.id == job["id"]).execute()
    assert gpus_used(api) == 1
    assert api.run_task("gpu_holds") == {"freed": 1}
    assert leaked_gpus_freed(api) == 1
    task = api.job(job["id"])["tasks"][0]
    assert task["state"] == "cancelled"
    reasons = [e["reason"] for e in job_events(api, job["id"]) if e["to_status"] == "cancelled"]
    assert reasons == [
        f"rank 0: reconciled: its job {job['id']} is succeeded, yet the task was running on node "
        f"{task['node_id']} holding 1 GPU(s)"
    ]
    reply = api.post(
        "/api/v1/agent/acquire", {"wait_seconds": 0}, token=session, agent=True
    ).get_json()
    assert reply["cancel"] == [assignment["task_id"]]
    api.heartbeat(session)  # its process ended
    assert gpus_used(api) == 0 and api.run_task("gpu_holds") == {"freed": 0}


def test_no_hold_is_freed_while_tasks_run_and_nodes_list_them(api, fleet, clock):
    _, session = api.ready_node(fleet, "n1", gpu_count=2)
    api.submit(resources={"gpus": 2})
    assignment = api.start_task(session)
    for _ in range(12):
        clock.advance(10)
        api.heartbeat(session, tasks=listing(assignment))
        assert api.run_task("leases") == {"expired": 0, "reconciled": 0}
        assert api.run_task("gpu_holds") == {"freed": 0}
    assert gpus_used(api) == 2 and leaked_gpus_freed(api) == 0
