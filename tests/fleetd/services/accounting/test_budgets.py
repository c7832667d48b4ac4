"""Team budgets over the real API: thresholds delivered once each to a real receiver, a blocked
team's job and new instance wait naming the budget and run when it is raised, stop_spot stops the
team's spot work, the roles and bad input."""

import json

import pytest

from tests.conftest import ApiClient
from tests.support.webhooks import SECRET, receiver  # noqa: F401 - receiver is a fixture

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def team(api):
    """A fleet with one 2-GPU node, GPUs at 1.0 per GPU-hour, and a submitter of team ml."""
    api.create_fleet("gpu-a")
    _, session = api.ready_node(api.create_join_token("gpu-a"), "host-1", gpu_count=2)
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 1.0})
    resp = api.post("/api/v1/tokens", {"name": "alice", "role": "submitter", "team": "ml"})
    return session, ApiClient(api.app, resp.get_json()["token"])


def put_budget(api, team, expect=200, **body):
    resp = api.call("PUT", f"/api/v1/budgets/{team}", json=body)
    assert resp.status_code == expect, resp.get_json()
    return resp.get_json()


def run_hours(api, session, hours, clock, assignment=None):
    """The node's next assignment (or this one) runs `hours` on its GPUs, with a ledger pass every
    half hour."""
    assignment = assignment or api.start_task(session)
    for _ in range(int(hours * 2)):
        clock.advance(1800)
        api.heartbeat(session)
        api.run_task("usage")
    return assignment


def test_thresholds_are_delivered_once_each(api, team, receiver, clock):  # noqa: F811 - the fixture
    session, alice = team
    hook = api.post(
        "/api/v1/webhooks", {"url": receiver.url, "secret": SECRET, "events": ["budget.threshold"]}
    ).get_json()
    assert put_budget(api, "ml", limit_cost=4.0) == {
        "team": "ml",
        "period": "month",
        "month": "2026-01",
        "limit_cost": 4.0,
        "limit_gpu_hours": None,
        "on_exceed": "notify",
        "used_cost": 0.0,
        "used_gpu_hours": 0.0,
        "used_percent": 0.0,
        "exceeded": False,
        "updated_at": "2026-01-01T12:00:00.000Z",
        "updated_by": "token:admin",
    }
    alice.submit(resources={"gpus": 2})
    running = run_hours(api, session, 1.5, clock)  # 3.0 of 4.0: 75 %
    api.run_task("usage")
    api.run_task("webhooks")
    run_hours(api, session, 1.5, clock, running)  # 6.0: 150 %
    api.run_task("usage")
    api.run_task("webhooks")
    api.run_task("webhooks")
    sent = sorted(
        (json.loads(body) for _, _, body in receiver.requests), key=lambda d: d["data"]["threshold"]
    )
    assert [
        (d["kind"], d["subject"], d["data"]["threshold"]) for d in sent
    ] == [  # sent concurrently: any order
        ("budget.threshold", "team/ml", 50),
        ("budget.threshold", "team/ml", 80),
        ("budget.threshold", "team/ml", 100),
    ]
    assert sent[2]["data"]["used_cost"] >= 4.0 and sent[2]["data"]["month"] == "2026-01"
    shown = alice.get("/api/v1/budgets/ml").get_json()
    assert (
        shown["exceeded"]
        and shown["used_cost"] == pytest.approx(6.0)
        and shown["used_gpu_hours"] == 6.0
    )
    assert api.get(f"/api/v1/webhooks/{hook['id']}/deliveries").status_code == 200


def test_a_blocked_team_waits_naming_the_budget_and_runs_when_it_is_raised(api, team, clock):
    session, alice = team
    put_budget(api, "ml", limit_gpu_hours=2.0, on_exceed="block")
    first = alice.submit(resources={"gpus": 2})
    assignment = run_hours(api, session, 1, clock)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    api.run_task("usage")
    waiting = alice.submit(resources={"gpus": 1})
    shown = alice.job(waiting["id"])
    assert shown["state"] == "queued"
    assert (
        "budget" in shown["pending_reason"]
        and "ml" in shown["pending_reason"]
        and "2 GPU-hours" in shown["pending_reason"]
    ), shown["pending_reason"]
    assert alice.job(first["id"])["cost_so_far"] == pytest.approx(2.0)
    other = api.submit(resources={"gpus": 1})  # another team's (none) work is not held back
    assert api.job(other["id"])["state"] == "running"
    put_budget(api, "ml", limit_gpu_hours=10.0, on_exceed="block")
    assert alice.job(waiting["id"])["state"] == "running"


def test_stop_spot_stops_the_teams_spot_work_and_holds_its_new_spot_work(api, team, clock):
    session, alice = team
    put_budget(api, "ml", limit_cost=0.5, on_exceed="stop_spot")
    spot = alice.submit(resources={"gpus": 1}, priority_class="spot", bid=1.0)
    run_hours(api, session, 1, clock)
    assert alice.job(spot["id"])["state"] in ("cancelling", "cancelled")
    again = alice.submit(resources={"gpus": 1}, priority_class="spot", bid=1.0)
    assert "spot work waits" in alice.job(again["id"])["pending_reason"]
    on_demand = alice.submit(resources={"gpus": 1})
    assert alice.job(on_demand["id"])["state"] == "running"


def test_budget_roles_and_bad_input(api, team):
    _, alice = team
    put_budget(api, "cv", limit_cost=1.0)
    assert alice.get("/api/v1/budgets/cv").status_code == 404  # another team's budget
    assert alice.call("PUT", "/api/v1/budgets/ml", json={"limit_cost": 9.0}).status_code == 403
    assert [b["team"] for b in api.get("/api/v1/budgets").get_json()["items"]] == ["cv"]
    for body in (
        {},
        {"limit_cost": -1},
        {"limit_cost": 1, "on_exceed": "explode"},
        {"limit_gpu_hours": "x"},
        {"limit_cost": None, "limit_gpu_hours": None},
    ):
        resp = api.call("PUT", "/api/v1/budgets/ml", json=body)
        assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "invalid_request", (
            body
        )
    assert api.get("/api/v1/budgets/ml").status_code == 404
    assert api.delete("/api/v1/budgets/cv").status_code == 204
    assert api.delete("/api/v1/budgets/cv").status_code == 404


def test_stop_spot_stops_the_teams_spot_instances_too(api, team, clock):
    session, alice = team
    put_budget(api, "ml", limit_cost=0.5, on_exceed="stop_spot")
    inst = alice.post(
        "/api/v1/instances",
        {
            "name": "nb",
            "command": ["sleep", "1d"],
            "resources": {"gpus": 1},
            "priority_class": "spot",
            "bid": 1.0,
        },
    ).get_json()
    assignment = run_hours(api, session, 1, clock)
    shown = alice.get(f"/api/v1/instances/{inst['id']}").get_json()
    assert shown["state"] == "stopping" and shown["desired_state"] == "stopped"
    assert "budget" in shown["status_reason"], shown["status_reason"]
    api.task_call(session, assignment, "finish", outcome="cancelled", reason="stopped")
    assert alice.get(f"/api/v1/instances/{inst['id']}").get_json()["state"] == "stopped"


def test_a_blocked_teams_new_instance_waits_naming_the_budget_and_starts_when_it_is_raised(
    api, team, clock
):
    session, alice = team
    put_budget(api, "ml", limit_gpu_hours=1.0, on_exceed="block")
    alice.submit(resources={"gpus": 2})
    assignment = run_hours(api, session, 0.5, clock)  # 1 GPU-hour: 100 %
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    api.run_task("usage")
    created = alice.post(
        "/api/v1/instances", {"name": "nb", "command": ["sleep", "1d"], "resources": {"gpus": 1}}
    )
    assert created.status_code == 201, created.get_json()
    inst = created.get_json()
    shown = alice.get(f"/api/v1/instances/{inst['id']}").get_json()
    assert shown["state"] == "pending" and shown["node_id"] is None, shown
    assert shown["pending_reason"].startswith(
        "team ml's budget for 2026-01 (1 GPU-hours) is exceeded"
    ), shown
    assert api.acquire(session) is None  # nothing of it reaches the node
    put_budget(api, "ml", limit_gpu_hours=5.0, on_exceed="block")
    api.start_task(session)
    assert alice.get(f"/api/v1/instances/{inst['id']}").get_json()["state"] in (
        "starting",
        "running",
    )
