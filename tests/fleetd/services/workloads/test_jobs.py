"""Jobs end to end through the API: submit, placement, the worker protocol, leases, gangs,
cancel."""

import datetime as dt
import threading

import pytest

from fleetd.clock import isoformat
from fleetd.db import database
from fleetd.services.placement.terms import TermsCache
from tests.conftest import ApiClient


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    return api.create_join_token("gpu-a")


# ---------------------------------------------------------------- submit and validation


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"command": []}, "command"),
        ({"command": "echo hi"}, "command"),
        ({"resources": {"gpus": 1.5}}, "resources"),
        ({"resources": {"gpus": -1}}, "resources"),
        ({"resources": {"gpus": 0.5}, "isolation": "exclusive"}, "isolation"),
        ({"bid": 1.0}, "bid"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"artifacts": [{"sha256": "0" * 64, "path": "../escape"}]}, "artifacts"),
        ({"retry": {"max_attempts": 0}}, "retry"),
        ({"surprise": True}, "surprise"),
    ],
)
def test_invalid_job_specs_are_refused_naming_the_field(api, spec, field):
    body = {"name": "bad", "command": ["true"], **spec}
    resp = api.post("/api/v1/jobs", body)
    assert resp.status_code == 400, resp.get_json()
    assert field in str(resp.get_json()["error"]["details"])
    assert api.get("/api/v1/jobs").get_json()["items"] == []


def test_a_job_named_new_is_refused_because_the_admin_ui_takes_that_path_for_its_form(api):
    resp = api.post("/api/v1/jobs", {"name": "new", "command": ["true"]})
    assert resp.status_code == 400, resp.get_json()
    error = resp.get_json()["error"]
    assert error["code"] == "invalid_request"
    assert error["details"]["fields"]["json"]["name"] == [
        "'new' is reserved (the admin UI's /ui/jobs/new); choose another name"
    ]
    simulated = api.post("/api/v1/cluster/simulate-schedule", {"name": "new", "command": ["true"]})
    assert simulated.status_code == 400 and "reserved" in str(
        simulated.get_json()["error"]["details"]
    )
    assert api.get("/api/v1/jobs").get_json()["items"] == []
    for near in ("New", "new-1", "renew"):
        assert api.post("/api/v1/jobs", {"name": near, "command": ["true"]}).status_code == 201, (
            near
        )


def test_job_referring_to_an_unknown_artifact_is_refused(api):
    resp = api.post(
        "/api/v1/jobs",
        {"name": "j", "command": ["true"], "artifacts": [{"sha256": "a" * 64, "path": "data.bin"}]},
    )
    assert resp.status_code == 400 and "artifact" in resp.get_json()["error"]["message"]


def test_job_waits_with_a_plain_reason_when_nothing_fits(api, fleet):
    api.ready_node(fleet, "n1", gpu_count=2)
    job = api.submit(resources={"gpus": 4})
    assert job["state"] == "queued"
    assert job["pending_reason"] == (
        "no enrolled node could ever hold it: it needs 4 GPUs on one node, the most "
        "any matching node has is 2"
    )


def test_submitters_see_only_their_own_jobs(api, fleet):
    alice = ApiClient(api.app, api.create_token("submitter", name="alice"))
    bob = ApiClient(api.app, api.create_token("submitter", name="bob"))
    job = alice.submit(name="alice-job")
    assert alice.get(f"/api/v1/jobs/{job['id']}").status_code == 200
    assert bob.get(f"/api/v1/jobs/{job['id']}").status_code == 404
    assert bob.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 404
    assert bob.get("/api/v1/jobs").get_json()["items"] == []
    assert [j["owner"] for j in api.get("/api/v1/jobs").get_json()["items"]] == ["alice"]
    assert api.get("/api/v1/jobs?owner=alice").get_json()["items"][0]["id"] == job["id"]


def test_the_name_filter_keeps_to_the_callers_jobs_and_leaves_out_instance_runs(api, fleet):
    alice = ApiClient(api.app, api.create_token("submitter", name="alice"))
    bob = ApiClient(api.app, api.create_token("submitter", name="bob"))
    first, second = alice.submit(name="train"), alice.submit(name="train")
    bobs = bob.submit(name="train")
    alice.submit(name="train-2")
    assert (
        api.post("/api/v1/instances", {"name": "train", "command": ["sleep", "1d"]}).status_code
        == 201
    )

    def named(client, name):
        resp = client.get("/api/v1/jobs", query_string={"name": name})
        assert resp.status_code == 200, resp.get_json()
        return [j["id"] for j in resp.get_json()["items"]]

    assert named(api, "train") == [first["id"], second["id"], bobs["id"]]  # not the instance's run
    assert named(alice, "train") == [first["id"], second["id"]]
    assert named(bob, "train") == [bobs["id"]]
    assert named(bob, "train-2") == [] and named(api, "trai") == []


# ---------------------------------------------------------------- the worker protocol


def test_single_node_job_runs_to_success_with_ordered_logs(api, fleet):
    node_id, session = api.ready_node(fleet, "n1")
    job = api.submit(
        name="hello",
        command=["echo", "hi"],
        env={"A": "1"},
        resources={"gpus": 1},
        max_runtime_seconds=60,
    )
    assert job["state"] == "running" and job["tasks"][0]["node_id"] == node_id
    assignment = api.acquire(session)
    assert assignment["command"] == ["echo", "hi"] and assignment["env"] == {"A": "1"}
    assert assignment["rank"] == 0 and assignment["num_nodes"] == 1 and len(assignment["gpus"]) == 1
    assert assignment["isolation"] == "exclusive" and assignment["max_runtime_seconds"] == 60
    assert api.acquire(session) is None  # delivered once
    api.task_call(session, assignment, "start", pid=100)
    for i in range(3):
        api.task_call(
            session,
            assignment,
            "logs",
            lines=[["stdout", f"line {2 * i}"], ["stderr", f"line {2 * i + 1}"]],
        )
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    done = api.job(job["id"])
    assert done["state"] == "succeeded" and done["tasks"][0]["state"] == "succeeded"
    logs = api.get(f"/api/v1/jobs/{job['id']}/logs").get_json()["items"]
    assert [line["text"] for line in logs] == [f"line {i}" for i in range(6)]
    assert [line["seq"] for line in logs] == sorted(line["seq"] for line in logs)
    after = api.get(f"/api/v1/jobs/{job['id']}/logs?after={logs[3]['seq']}").get_json()["items"]
    assert [line["text"] for line in after] == ["line 4", "line 5"]
    result = api.get(f"/api/v1/jobs/{job['id']}/result").get_json()
    assert result["outcome"] == "succeeded" and result["tasks"][0]["exit_code"] == 0
    kinds = [
        (e["kind"], e["to_status"])
        for e in api.get(f"/api/v1/jobs/{job['id']}/events").get_json()["items"]
    ]
    assert kinds[0] == ("job.submitted", "queued") and kinds[-1] == ("job.state", "succeeded")


def test_start_is_idempotent_for_the_same_epoch(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    api.submit()
    assignment = api.start_task(session)
    api.task_call(
        session, assignment, "start", pid=4242
    )  # the first answer was lost; the retry is fine
    api.task_call(session, assignment, "start", expect=409, epoch=assignment["epoch"] + 1)


def test_an_acquire_may_deliver_several_assignments_each_once(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    jobs = [api.submit(name=f"j{i}")["id"] for i in range(5)]

    def acquire(body):
        resp = api.post("/api/v1/agent/acquire", body, token=session, agent=True)
        assert resp.status_code == 200, resp.get_json()
        return resp.get_json()

    first = acquire({"wait_seconds": 0, "max_assignments": 3})
    assert [a["job_id"] for a in first["assignments"]] == jobs[:3] and first["assignment"] == first[
        "assignments"
    ][0]
    second = acquire({"wait_seconds": 0, "max_assignments": 3})
    assert [a["job_id"] for a in second["assignments"]] == jobs[3:]
    assert acquire({"wait_seconds": 0, "max_assignments": 3}) == {
        "assignment": None,
        "assignments": [],
        "cancel": [],
    }
    assert acquire({"wait_seconds": 0}) == {
        "assignment": None,
        "cancel": [],
    }  # without the field: the plain shape
    for bad in (0, 65, "2", 1.5):
        resp = api.post(
            "/api/v1/agent/acquire",
            {"wait_seconds": 0, "max_assignments": bad},
            token=session,
            agent=True,
        )
        assert (
            resp.status_code == 400
            and "max_assignments" in resp.get_json()["error"]["details"]["fields"]["json"]
        )


def test_a_finish_with_a_pid_reports_the_start_as_well(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit()
    assignment = api.acquire(session)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0, pid=321)
    done = api.job(job["id"])
    task = done["tasks"][0]
    assert done["state"] == "succeeded" and task["state"] == "succeeded"
    assert task["started_at"] is not None and task["started_at"] <= task["ended_at"]
    events = api.get(f"/api/v1/jobs/{job['id']}/events").get_json()["items"]
    task_steps = [(e["from_status"], e["to_status"]) for e in events if e["kind"] == "task.state"]
    assert task_steps[-2:] == [("assigned", "running"), ("running", "succeeded")]
    assert (
        "pid 321"
        in [e for e in events if e["to_status"] == "running" and e["kind"] == "task.state"][0][
            "reason"
        ]
    )


def test_finish_reports_sent_together_are_settled_and_answered_one_by_one(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    jobs = [api.submit(name=f"j{i}")["id"] for i in range(3)]
    api.run_task("scheduling")
    a, b, c = (api.acquire(session) for _ in range(3))
    reports = [
        {
            "task_id": a["task_id"],
            "epoch": a["epoch"],
            "outcome": "succeeded",
            "exit_code": 0,
            "pid": 10,
        },
        {
            "task_id": b["task_id"],
            "epoch": b["epoch"] + 1,
            "outcome": "succeeded",
            "exit_code": 0,
        },  # stale
        {
            "task_id": c["task_id"],
            "epoch": c["epoch"],
            "outcome": "failed",
            "exit_code": 3,
            "pid": 11,
        },
        {"task_id": "t-unknown", "epoch": 1, "outcome": "succeeded"},
    ]
    resp = api.post("/api/v1/agent/finish", {"finishes": reports}, token=session, agent=True)
    assert resp.status_code == 200, resp.get_json()
    results = resp.get_json()["results"]
    assert [(r["task_id"], r["status"]) for r in results] == [
        (a["task_id"], 204),
        (b["task_id"], 409),
        (c["task_id"], 204),
        ("t-unknown", 404),
    ]
    assert results[0]["error"] is None and results[1]["error"]["code"] == "conflict"
    assert results[1]["error"]["details"] == {"task_id": b["task_id"], "epoch": b["epoch"] + 1}
    assert results[3]["error"]["code"] == "not_found"
    states = {job_id: api.job(job_id) for job_id in jobs}
    by_job = {a["job_id"]: "succeeded", b["job_id"]: "running", c["job_id"]: "failed"}
    assert {j: states[j]["state"] for j in jobs} == by_job  # b still runs: its report was refused
    assert states[c["job_id"]]["tasks"][0]["exit_code"] == 3
    events = len(api.get(f"/api/v1/jobs/{a['job_id']}/events").get_json()["items"])
    # Sent again (its answer was lost): answered the same, settled once.
    again = api.post("/api/v1/agent/finish", {"finishes": reports[:1]}, token=session, agent=True)
    assert again.status_code == 200 and again.get_json()["results"][0]["status"] == 204
    assert len(api.get(f"/api/v1/jobs/{a['job_id']}/events").get_json()["items"]) == events
    assert api.job(b["job_id"])["state"] == "running"


def test_a_database_failure_in_finish_reports_together_settles_none_of_them(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    jobs = [api.submit(name=f"j{i}")["id"] for i in range(2)]
    api.run_task("scheduling")
    a, b = api.acquire(session), api.acquire(session)
    reports = [
        {
            "task_id": t["task_id"],
            "epoch": t["epoch"],
            "outcome": "succeeded",
            "exit_code": 0,
            "pid": 10,
        }
        for t in (a, b)
    ]
    # A real SQLite error while the second report is written, after the first one was: the trigger
    # names a table that does not exist, which SQLite only finds out when the trigger runs.
    with database.connection_context():
        database.execute_sql(
            f"CREATE TRIGGER fail_second BEFORE UPDATE ON task WHEN NEW.id = '{b['task_id']}' "
            f"BEGIN INSERT INTO no_such_table VALUES (1); END"
        )
    resp = api.post("/api/v1/agent/finish", {"finishes": reports}, token=session, agent=True)
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "unavailable", (
        resp.get_json()
    )
    assert resp.headers["Retry-After"] == "1"
    assert [api.job(job_id)["state"] for job_id in jobs] == [
        "running",
        "running",
    ]  # the first one too
    with database.connection_context():
        database.execute_sql("DROP TRIGGER fail_second")
    again = api.post(
        "/api/v1/agent/finish", {"finishes": reports}, token=session, agent=True
    )  # the agent's retry
    assert [r["status"] for r in again.get_json()["results"]] == [204, 204]
    assert [api.job(job_id)["state"] for job_id in jobs] == ["succeeded", "succeeded"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "finishes"),
        ({"finishes": []}, "finishes"),
        (
            {
                "finishes": [
                    {"task_id": f"t{i}", "epoch": 1, "outcome": "succeeded"} for i in range(65)
                ]
            },
            "finishes",
        ),
        ({"finishes": [{"task_id": "t1", "epoch": 1, "outcome": "succeeded"}] * 2}, "finishes"),
        ({"finishes": [{"task_id": "t1", "epoch": 1}]}, "outcome"),
        ({"finishes": [{"epoch": 1, "outcome": "succeeded"}]}, "task_id"),
        (
            {
                "finishes": [
                    {"task_id": "t1", "epoch": 1, "outcome": "succeeded", "started_seconds_ago": 1}
                ]
            },
            "started_seconds_ago",
        ),
        ({"finishes": "t1"}, "finishes"),
    ],
)
def test_finish_reports_together_are_refused_whole_when_one_does_not_validate(
    api, fleet, body, field
):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit()
    assignment = api.acquire(session)
    if body.get("finishes") and isinstance(body["finishes"], list) and len(body["finishes"]) == 1:
        body = {
            "finishes": [
                {
                    "task_id": assignment["task_id"],
                    "epoch": assignment["epoch"],
                    "outcome": "succeeded",
                }
            ]
            + body["finishes"]
        }
    resp = api.post("/api/v1/agent/finish", body, token=session, agent=True)
    assert resp.status_code == 400 and field in str(resp.get_json()["error"]["details"]), (
        resp.get_json()
    )
    assert api.job(job["id"])["state"] == "running"  # nothing settled
    assert (
        api.post("/api/v1/agent/finish", {"finishes": []}, agent=True).status_code == 403
    )  # admin, not a node


def test_a_finish_carrying_the_start_says_when_it_started_but_not_before_the_assignment(
    api, fleet, clock
):
    _, session = api.ready_node(fleet, "n1")
    jobs = [api.submit(name=f"j{i}") for i in range(2)]
    api.run_task("scheduling")
    assigned_at = clock.now()
    first, second = api.acquire(session), api.acquire(session)
    clock.advance(10)
    api.task_call(
        session, first, "finish", outcome="succeeded", exit_code=0, pid=11, started_seconds_ago=2.5
    )
    # An interval longer than the task was assigned (another host's measure): the assignment bounds
    # it.
    api.task_call(
        session, second, "finish", outcome="succeeded", exit_code=0, pid=12, started_seconds_ago=60
    )
    started = {j["id"]: api.job(j["id"])["tasks"][0]["started_at"] for j in jobs}
    assert started[first["job_id"]] == isoformat(clock.now() - dt.timedelta(seconds=2.5))
    assert started[second["job_id"]] == isoformat(assigned_at)
    # A start report says so too (the agent holds it a moment), bounded the same way.
    late = [api.submit(name=f"late{i}") for i in range(2)]
    api.run_task("scheduling")
    assigned_at = clock.now()
    fourth, fifth = api.acquire(session), api.acquire(session)
    clock.advance(5)
    api.task_call(session, fourth, "start", pid=13, started_seconds_ago=0.25)
    api.task_call(session, fifth, "start", pid=14, started_seconds_ago=3600)
    started = {j["id"]: api.job(j["id"])["tasks"][0]["started_at"] for j in late}
    assert started[fourth["job_id"]] == isoformat(clock.now() - dt.timedelta(seconds=0.25))
    assert started[fifth["job_id"]] == isoformat(assigned_at)
    # Without the start it means nothing, and is refused naming the field.
    job = api.submit(name="j3")
    api.run_task("scheduling")
    third = api.acquire(session)
    resp = api.post(
        f"/api/v1/agent/tasks/{third['task_id']}/finish",
        {"epoch": third["epoch"], "outcome": "succeeded", "started_seconds_ago": 1.0},
        token=session,
        agent=True,
    )
    assert resp.status_code == 400 and "started_seconds_ago" in str(resp.get_json()), (
        resp.get_json()
    )
    assert api.job(job["id"])["state"] != "succeeded"


def test_a_task_the_agent_ended_itself_is_retried_as_lost(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit()  # default retry: node_lost and preempted
    assignment = api.start_task(session)
    api.task_call(
        session,
        assignment,
        "finish",
        outcome="failed",
        exit_code=143,
        lost=True,
        reason="agent stopping",
    )
    again = api.job(job["id"])
    assert again["attempt"] == 2 and again["state"] in ("queued", "running")


def test_a_task_failed_by_an_unhealthy_gpu_is_retried_as_lost(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    api.task_call(
        session,
        assignment,
        "finish",
        outcome="failed",
        exit_code=137,
        reason=f"gpu_unhealthy: {assignment['gpus'][0]['uuid']}: critical XID 79",
    )
    again = api.job(job["id"])
    assert again["attempt"] == 2
    events = api.get(f"/api/v1/jobs/{job['id']}/events").get_json()["items"]
    assert any(e["to_status"] == "lost" and "gpu_unhealthy" in e["reason"] for e in events)


def test_failing_command_fails_the_job_with_its_exit_code(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit(command=["false"])
    assignment = api.start_task(session)
    api.task_call(session, assignment, "finish", outcome="failed", exit_code=3)
    result = api.get(f"/api/v1/jobs/{job['id']}/result").get_json()
    assert result["outcome"] == "failed" and result["tasks"][0]["exit_code"] == 3
    assert api.job(job["id"])["state"] == "failed"


def test_retry_on_failure_requeues_with_a_new_epoch_and_fences_the_old_one(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit(command=["flaky"], retry={"max_attempts": 2, "on": ["failed"]})
    first = api.start_task(session)
    api.task_call(session, first, "finish", outcome="failed", exit_code=1)
    again = api.job(job["id"])
    assert again["attempt"] == 2 and again["state"] == "running"
    second = api.acquire(session)
    assert second["task_id"] == first["task_id"] and second["epoch"] == first["epoch"] + 1
    api.task_call(session, first, "logs", expect=409, lines=[["stdout", "late"]])
    api.task_call(session, second, "start")
    api.task_call(session, second, "finish", outcome="failed", exit_code=1)
    assert api.job(job["id"])["state"] == "failed"


def test_expired_lease_requeues_on_another_node_and_fences_the_old_holder(api, fleet, clock):
    n1, s1 = api.ready_node(fleet, "n1", gpu_count=1)
    job = api.submit(resources={"gpus": 1})
    old = api.start_task(s1)
    n2, s2 = api.ready_node(fleet, "n2", gpu_count=1)
    api.submit(name="filler", resources={"gpus": 1})  # takes n2 for now
    filler = api.start_task(s2)
    for _ in range(3):  # n2 keeps heartbeating, n1 went silent
        clock.advance(20)
        api.heartbeat(
            s2, tasks=[{"id": filler["task_id"], "epoch": filler["epoch"], "state": "running"}]
        )
    assert api.run_task("leases") == {"expired": 1, "reconciled": 0}
    requeued = api.job(job["id"])
    assert requeued["attempt"] == 2 and requeued["state"] == "queued"
    api.task_call(s2, filler, "finish", outcome="succeeded", exit_code=0)  # frees n2
    assert api.job(job["id"])["tasks"][0]["node_id"] == n2
    new = api.start_task(s2)
    assert new["epoch"] == old["epoch"] + 1
    # The old holder comes back: its calls are fenced and its heartbeat says to kill the task.
    api.task_call(s1, old, "finish", expect=409, outcome="succeeded", exit_code=0)
    reply = api.heartbeat(
        s1, tasks=[{"id": old["task_id"], "epoch": old["epoch"], "state": "running"}]
    )
    assert reply["cancel"] == [old["task_id"]]
    api.task_call(s2, new, "finish", outcome="succeeded", exit_code=0)
    assert api.job(job["id"])["state"] == "succeeded"
    assert n1 != n2


def test_gang_job_is_placed_all_or_nothing_and_meets_at_the_rendezvous(api, fleet):
    _, s1 = api.ready_node(fleet, "n1")
    job = api.submit(num_nodes=2, resources={"gpus": 1})
    assert (
        job["state"] == "queued"
        and job["pending_reason"]
        == "no enrolled nodes could ever hold it: 1 node(s) could take a rank, it needs 2"
    )
    assert api.acquire(s1) is None
    _, s2 = api.ready_node(fleet, "n2")  # the second node's first heartbeat triggers a pass
    placed = api.job(job["id"])
    assert (
        placed["state"] == "running"
        and {t["node_id"] for t in placed["tasks"]} == {t["node_id"] for t in placed["tasks"]}
        and len({t["node_id"] for t in placed["tasks"]}) == 2
    )
    a, b = api.acquire(s1), api.acquire(s2)
    rank0, rank1 = (a, b) if a["rank"] == 0 else (b, a)
    s_rank0, s_rank1 = (s1, s2) if a["rank"] == 0 else (s2, s1)
    wait = api.get(
        f"/api/v1/agent/tasks/{rank1['task_id']}/rendezvous?wait_seconds=0.2",
        token=s_rank1,
        agent=True,
    )
    assert wait.status_code == 504 and wait.get_json()["error"]["code"] == "timeout"
    api.task_call(
        s_rank1, rank1, "rendezvous", expect=409, addr="10.0.0.2", port=29500
    )  # only rank 0
    api.task_call(s_rank0, rank0, "rendezvous", addr="10.0.0.1", port=29500)
    met = api.get(
        f"/api/v1/agent/tasks/{rank1['task_id']}/rendezvous?wait_seconds=1",
        token=s_rank1,
        agent=True,
    )
    assert met.get_json() == {"addr": "10.0.0.1", "port": 29500}


def test_no_rank_of_a_gang_learns_the_rendezvous_before_every_rank_has_arrived(api, fleet):
    sessions = [api.ready_node(fleet, f"n{i}")[1] for i in range(3)]
    job = api.submit(num_nodes=3, resources={"gpus": 1})
    held = {}
    for session in sessions:
        assignment = api.acquire(session)
        held[assignment["rank"]] = (session, assignment)

    def ask(rank):
        session, assignment = held[rank]
        return api.get(
            f"/api/v1/agent/tasks/{assignment['task_id']}/rendezvous?wait_seconds=0",
            token=session,
            agent=True,
        )

    api.task_call(*held[0], "rendezvous", addr="10.0.0.1", port=29500)
    for rank in (0, 1):  # rank 0 has published, rank 1 has arrived; rank 2 is still preparing
        late = ask(rank)
        assert (
            late.status_code == 504
            and "have not all arrived" in late.get_json()["error"]["message"]
        )
    assert {rank: ask(rank).get_json() for rank in (2, 1, 0)} == {
        r: {"addr": "10.0.0.1", "port": 29500} for r in range(3)
    }
    assert api.job(job["id"])["state"] == "running"
    # A quick rank 0 ends before a rank that had arrived reads the answer (between two of its
    # polls): the gang did start together, so that rank gets the address, not gang_not_met.
    api.task_call(*held[0], "start", pid=4242)
    api.task_call(*held[0], "finish", outcome="succeeded", exit_code=0)
    assert ask(2).get_json() == {"addr": "10.0.0.1", "port": 29500}
    assert api.job(job["id"])["state"] == "running"


def test_a_failed_rank_stops_the_whole_gang(api, fleet):
    _, s1 = api.ready_node(fleet, "n1")
    _, s2 = api.ready_node(fleet, "n2")
    job = api.submit(num_nodes=2, resources={"gpus": 1})
    a, b = api.start_task(s1), api.start_task(s2)
    api.task_call(s1, a, "finish", outcome="failed", exit_code=7)
    reply = api.heartbeat(s2, tasks=[{"id": b["task_id"], "epoch": b["epoch"], "state": "running"}])
    assert reply["cancel"] == [b["task_id"]]
    done = api.job(job["id"])
    assert done["state"] == "failed" and {t["state"] for t in done["tasks"]} == {
        "failed",
        "cancelled",
    }


def test_cancel_of_a_running_job_is_cancelling_until_the_node_reports_the_process_ended(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    cancelling = api.post(f"/api/v1/jobs/{job['id']}/cancel").get_json()
    assert cancelling["state"] == "cancelling" and cancelling["tasks"][0]["state"] == "running"
    # The heartbeat repeats the stop (the fallback), and renews no lease of a cancelling job.
    reply = api.heartbeat(
        session,
        tasks=[{"id": assignment["task_id"], "epoch": assignment["epoch"], "state": "running"}],
    )
    assert reply["cancel"] == [assignment["task_id"]]
    assert api.post(f"/api/v1/jobs/{job['id']}/cancel").get_json()["state"] == "cancelling"
    api.task_call(session, assignment, "finish", outcome="cancelled", exit_code=143)
    done = api.job(job["id"])
    assert done["state"] == "cancelled" and done["tasks"][0]["state"] == "cancelled"
    assert api.post(f"/api/v1/jobs/{job['id']}/cancel").get_json()["state"] == "cancelled"


def test_job_wait_answers_when_the_job_ends(api, fleet, make_app):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit()
    assignment = api.start_task(session)
    answers = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            ApiClient(api.app, api.token)
            .get(f"/api/v1/jobs/{job['id']}?wait_seconds=30")
            .get_json()
        )
    )
    waiter.start()
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    waiter.join(timeout=30)
    assert answers and answers[0]["state"] == "succeeded"


def test_jobs_that_need_nothing_go_to_the_least_busy_node(api, fleet):
    sessions = [api.ready_node(fleet, f"n{i}")[1] for i in range(3)]
    busy = api.submit(name="first")  # placed alone: the three nodes are alike and idle
    first = next(s for s in sessions if api.acquire(s) is not None)
    for i in range(5):
        api.submit(name=f"more-{i}")
    counts = {s: 0 for s in sessions}
    for session in sessions:
        for _ in range(10):
            if api.acquire(session) is None:
                break
            counts[session] += 1
    # Each submit here places its job at once (one pass each): the least busy node takes it, so five
    # more over three nodes, one of which runs one already, end two, two and one (the busy one).
    assert counts[first] == 1 and sorted(counts.values()) == [1, 2, 2], (busy["id"], counts)


def test_job_terms_cache_keeps_the_newest_entries_up_to_its_size(api):
    ids = [api.submit(name=f"j{i}")["id"] for i in range(5)]  # no node: they stay queued
    cache = TermsCache(size=3)
    with database.connection_context():
        terms = cache.get_many(ids)
        assert sorted(terms) == sorted(ids)  # all returned, the newest three kept
        assert sorted(cache._terms) == sorted(ids[2:])
        assert cache.get_many(ids[4:])[ids[4]] is terms[ids[4]]


def test_concurrent_submissions_lose_no_job_and_run_none_twice(api, fleet):
    sessions = [api.ready_node(fleet, f"n{i}", gpu_count=8)[1] for i in range(2)]
    submitted, lock = [], threading.Lock()

    def submit_many(worker):
        client = ApiClient(api.app, api.token)
        for i in range(50):
            resp = client.post("/api/v1/jobs", {"name": f"w{worker}-{i}", "command": ["true"]})
            assert resp.status_code == 201
            with lock:
                submitted.append(resp.get_json()["id"])

    threads = [threading.Thread(target=submit_many, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(set(submitted)) == 200
    api.run_task("scheduling")
    delivered = []
    for session in sessions:
        for _ in range(300):
            assignment = api.acquire(session)
            if assignment is None:
                break
            delivered.append(assignment["job_id"])
    assert sorted(delivered) == sorted(submitted)
    assert api.get("/api/v1/jobs?state=queued").get_json()["items"] == []


# ---------------------------------------------------------------- artifacts


def test_artifact_upload_download_limits_and_node_rule(make_app, clock):
    from tests.conftest import admin_client

    api = admin_client(make_app(artifact_max_bytes=1024), clock)
    up = api.call(
        "PUT",
        "/api/v1/artifacts",
        data=b"hello world",
        headers={"X-Artifact-Name": "hello.txt", "X-Artifact-Kind": "data"},
    )
    assert up.status_code == 201
    sha = up.get_json()["sha256"]
    assert sha == "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
    assert api.get(f"/api/v1/artifacts/{sha}").data == b"hello world"
    big = api.call("PUT", "/api/v1/artifacts", data=b"x" * 2048, headers={"X-Artifact-Name": "big"})
    assert big.status_code == 413 and big.get_json()["error"]["code"] == "payload_too_large"
    assert api.call("PUT", "/api/v1/artifacts", data=b"x").status_code == 400  # no name
    assert api.get("/api/v1/artifacts/" + "0" * 64).status_code == 404
    api.create_fleet("gpu-a")
    join = api.create_join_token("gpu-a")
    _, s1 = api.ready_node(join, "n1")
    _, s2 = api.ready_node(join, "n2", gpu_count=1)
    api.submit(resources={"gpus": 2}, artifacts=[{"sha256": sha, "path": "in/hello.txt"}])
    assignment = api.acquire(s1)
    assert assignment["artifacts"] == [{"sha256": sha, "path": "in/hello.txt"}]
    assert api.get(f"/api/v1/artifacts/{sha}", token=s1).data == b"hello world"
    assert api.get(f"/api/v1/artifacts/{sha}", token=s2).status_code == 403


@pytest.mark.parametrize(
    "finishes",
    [
        [None],
        [1],
        ["t1"],
        [{"task_id": 5, "epoch": 1, "outcome": "succeeded"}],
        [{"task_id": "t1", "epoch": "1", "outcome": "succeeded"}],
        [{"task_id": "t\u0000", "epoch": 1, "outcome": "succeeded"}],
        [{"task_id": "t1", "epoch": 1, "outcome": "succeeded", "exit_code": 999}],
    ],
)
def test_malformed_finish_reports_together_are_invalid_requests(api, fleet, finishes):
    _, session = api.ready_node(fleet, "n1")
    resp = api.post("/api/v1/agent/finish", {"finishes": finishes}, token=session, agent=True)
    assert resp.status_code == 400 and resp.get_json()["error"]["details"]["fields"]["json"]


@pytest.mark.parametrize(
    "how", [{"outcome": "failed", "exit_code": 1}, {"outcome": "failed", "lost": True}]
)
def test_a_gang_whose_rank_succeeded_runs_again_whole_when_another_rank_fails_and_retries(
    api, fleet, how
):
    _, s1 = api.ready_node(fleet, "n1")
    _, s2 = api.ready_node(fleet, "n2")
    job = api.submit(
        num_nodes=2, resources={"gpus": 1}, retry={"max_attempts": 3, "on": ["failed", "node_lost"]}
    )
    a, b = api.start_task(s1), api.start_task(s2)
    (r0, s_r0), (r1, s_r1) = sorted([(a, s1), (b, s2)], key=lambda pair: pair[0]["rank"])
    api.task_call(s_r0, r0, "finish", outcome="succeeded", exit_code=0)
    api.task_call(s_r1, r1, "finish", **how)  # answered 204: never refused, whatever rank 0 did
    again = api.job(job["id"])
    assert again["attempt"] == 2 and {t["state"] for t in again["tasks"]} <= {"pending", "assigned"}
    c, d = api.start_task(s1), api.start_task(s2)
    assert {c["epoch"], d["epoch"]} == {r0["epoch"] + 1} and {c["task_id"], d["task_id"]} == {
        r0["task_id"],
        r1["task_id"],
    }
    for assignment, session in ((c, s1), (d, s2)):
        api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    assert api.job(job["id"])["state"] == "succeeded"


def test_a_heartbeat_still_listing_the_last_epoch_never_stops_the_task_running_again_on_that_node(
    api, fleet
):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit(resources={"gpus": 1}, retry={"max_attempts": 2, "on": ["failed"]})
    first = api.start_task(session)
    api.task_call(session, first, "finish", outcome="failed", exit_code=1)
    again = api.job(job["id"])
    assert again["attempt"] == 2 and again["tasks"][0]["node_id"] is not None  # placed again, on n1
    # A heartbeat sent before the agent forgot epoch 1 lists it: the answer must not stop the task
    # by id, which would end epoch 2 on this node (the new assignment ends the old process anyway).
    reply = api.heartbeat(
        session, tasks=[{"id": first["task_id"], "epoch": first["epoch"], "state": "running"}]
    )
    assert reply["cancel"] == []
    second = api.start_task(session)
    assert second["epoch"] == first["epoch"] + 1
    api.task_call(session, second, "finish", outcome="succeeded", exit_code=0)
    assert api.job(job["id"])["state"] == "succeeded"


def test_a_rank_still_waiting_for_the_rendezvous_when_rank_0_has_ended_ends_the_attempt_at_once(
    api, fleet
):
    _, s1 = api.ready_node(fleet, "n1")
    _, s2 = api.ready_node(fleet, "n2")
    job = api.submit(
        num_nodes=2, resources={"gpus": 1}, retry={"max_attempts": 2, "on": ["failed"]}
    )
    a, b = api.acquire(s1), api.acquire(s2)
    (r0, s_r0), (r1, s_r1) = sorted([(a, s1), (b, s2)], key=lambda pair: pair[0]["rank"])
    api.task_call(s_r0, r0, "rendezvous", addr="10.0.0.1", port=29500)
    api.task_call(s_r0, r0, "start", pid=100)
    api.task_call(s_r0, r0, "finish", outcome="succeeded", exit_code=0)  # rank 1 never started
    late = api.get(
        f"/api/v1/agent/tasks/{r1['task_id']}/rendezvous?wait_seconds=1", token=s_r1, agent=True
    )
    assert (
        late.status_code == 409 and late.get_json()["error"]["details"]["reason"] == "gang_not_met"
    )
    again = api.job(job["id"])
    assert again["attempt"] == 2 and again["state"] in ("queued", "running"), (
        again
    )  # the gang runs again whole
    events = api.get(f"/api/v1/jobs/{job['id']}/events").get_json()
    items = events["items"] if isinstance(events, dict) else events
    assert any("never met rank 0 at the rendezvous" in (e["reason"] or "") for e in items)
