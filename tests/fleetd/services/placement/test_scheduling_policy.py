"""Capacity truth, simulate-schedule, GPU prices and bids, quotas, availability windows,
preemption."""

import pytest

from tests.conftest import ApiClient, gpus


@pytest.fixture
def join(api):
    api.create_fleet("gpu-a")
    return api.create_join_token("gpu-a")


def _node(api, join, name, count=2, model=None, fleet_join=None):
    body = {"gpus": gpus(count, model=model) if model else gpus(count)}
    for g in body["gpus"]:
        g["uuid"] = f"{name}-{g['uuid']}"
    reg = api.register(fleet_join or join, machine_id=name, hostname=name, **body)
    api.heartbeat(reg["session_token"])
    return reg["node_id"], reg["session_token"]


def _status(api):
    return api.get("/api/v1/cluster/status").get_json()


def _assert_sums(status):
    gpu = status["gpu"]
    assert gpu["total"] == gpu["used"] + gpu["free"] + gpu["blocked"]
    for series in gpu["series"]:
        assert series["total"] == series["used"] + series["free"] + series["blocked"]


def test_capacity_adds_up_and_says_why_gpus_are_blocked(api, join, clock):
    # Only the unhealthy GPU is blocked here: the fleet's health policy would take its whole node
    # out (tests/fleetd/services/nodes/test_health_policy.py).
    api.patch("/api/v1/fleets/gpu-a", {"health_policy": {"cordon_on_gpu_fault": False}})
    n1, s1 = _node(api, join, "n1", 4)
    n2, _ = _node(api, join, "n2", 2)
    n3, s3 = _node(api, join, "n3", 2, model="NVIDIA L4")
    api.post(f"/api/v1/nodes/{n2}/cordon")
    changed = gpus(2, model="NVIDIA L4")
    for g in changed:
        g["uuid"] = f"n3-{g['uuid']}"
    changed[1].update(healthy=False, health_reason="XID 79")
    api.heartbeat(s3, gpus=changed)
    api.submit(resources={"gpus": 1})
    api.submit(name="half", resources={"gpus": 0.5})
    api.submit(name="big", resources={"gpus": 8})
    status = _status(api)
    _assert_sums(status)
    gpu = status["gpu"]
    assert (gpu["total"], gpu["used"], gpu["blocked"], gpu["free"]) == (8, 2, 3, 3)
    assert gpu["queued"] == 8
    codes = {(n["code"], n["series"]): n["count"] for n in gpu["blocked_notes"]}
    assert codes == {("cordoned", "nvidia-h100-80gb-hbm3"): 2, ("unhealthy", "nvidia-l4"): 1}
    # The queued job that takes any model is a row of its own (no GPUs: its counts are 0).
    assert {s["id"]: s["total"] for s in gpu["series"]} == {
        "nvidia-h100-80gb-hbm3": 6,
        "nvidia-l4": 2,
        "any": 0,
    }
    assert {(p["series"], p["gpus_per_node"]): p["num_nodes"] for p in status["profiles"]} == {
        ("nvidia-h100-80gb-hbm3", 4): 1,
        ("nvidia-h100-80gb-hbm3", 2): 1,
        ("nvidia-l4", 2): 1,
    }
    assert status["nodes"] == {"ready": 2, "cordoned": 1}
    allocation = api.get("/api/v1/cluster/allocation").get_json()
    shared = [uuid for uuid, tasks in allocation["gpu_to_tasks"].items() if len(tasks) >= 1]
    assert len(shared) == 2 and len(allocation["allocations"]) == 2
    assert n1 in allocation["nodes"] and allocation["nodes"][n2]["schedulable"] is False
    assert s1


def test_submitter_and_metrics_read_status_without_storage_details(api, join):
    _node(api, join, "n1")
    for role in ("submitter", "metrics"):
        status = ApiClient(api.app, api.create_token(role)).get("/api/v1/cluster/status").get_json()
        assert status["gpu"]["total"] == 2 and status["storage"] == {}


def test_simulate_schedule_explains_per_node_and_reserves_nothing(api, join):
    n1, _ = _node(api, join, "n1", 2)
    n2, _ = _node(api, join, "n2", 2, model="NVIDIA L4")
    api.post(f"/api/v1/nodes/{n2}/cordon")
    spec = {"name": "sim", "command": ["true"], "resources": {"gpus": 2}}
    placed = api.post("/api/v1/cluster/simulate-schedule", spec).get_json()
    assert placed["schedulable"] and placed["placement"][0]["node_id"] == n1
    assert _status(api)["gpu"]["used"] == 0
    no = api.post("/api/v1/cluster/simulate-schedule", dict(spec, resources={"gpus": 4})).get_json()
    assert not no["schedulable"]
    stages = {d["node_id"]: d["stage"] for d in no["filter_detail"]}
    assert stages == {n1: "gpu_count", n2: "status"}


def test_spot_bids_under_the_minimum_are_refused_and_spot_goes_only_where_it_can_pay(api, join):
    _node(api, join, "h100", 1)
    _node(api, join, "l4", 1, model="NVIDIA L4")
    resp = api.call(
        "PUT",
        "/api/v1/gpu-types/NVIDIA H100 80GB HBM3",
        json={"price_per_hour": 4.0, "spot_min_bid": 2.0},
    )
    assert resp.status_code == 200 and resp.get_json()["spot_min_bid"] == 2.0
    api.call(
        "PUT", "/api/v1/gpu-types/NVIDIA L4", json={"price_per_hour": 0.8, "spot_min_bid": 0.3}
    )
    types = {t["model"]: t for t in api.get("/api/v1/gpu-types").get_json()["items"]}
    assert (
        types["NVIDIA L4"]["total"] == 1 and types["NVIDIA H100 80GB HBM3"]["price_per_hour"] == 4.0
    )
    low = api.post(
        "/api/v1/jobs",
        {
            "name": "cheap",
            "command": ["true"],
            "priority_class": "spot",
            "bid": 0.1,
            "resources": {"gpus": 1},
        },
    )
    assert (
        low.status_code == 400 and "under the minimum of 0.3" in low.get_json()["error"]["message"]
    )
    job = api.submit(priority_class="spot", bid=0.5, resources={"gpus": 1})
    node = api.get(f"/api/v1/nodes/{job['tasks'][0]['node_id']}").get_json()
    assert node["hostname"] == "l4"
    second = api.submit(name="second", priority_class="spot", bid=0.5, resources={"gpus": 1})
    assert second["state"] == "queued"


def test_team_quota_holds_jobs_until_raised(api, join):
    _node(api, join, "n1", 4)
    alice = ApiClient(
        api.app,
        api.post(
            "/api/v1/tokens", {"name": "alice", "role": "submitter", "team": "vision"}
        ).get_json()["token"],
    )
    assert api.call("PUT", "/api/v1/quotas/vision", json={"max_gpus": 2}).status_code == 200
    first = alice.submit(resources={"gpus": 2})
    assert first["state"] == "running"
    second = alice.submit(name="second", resources={"gpus": 1})
    assert second["state"] == "queued"
    assert (
        second["pending_reason"]
        == "team vision at its quota for all classes: holds 2 of 2 GPUs, job needs 1"
    )
    assert api.submit(name="other team", resources={"gpus": 1})["state"] == "running"
    api.call("PUT", "/api/v1/quotas/vision", json={"max_gpus": 3})
    assert alice.get(f"/api/v1/jobs/{second['id']}").get_json()["state"] == "running"
    assert [q["max_gpus"] for q in api.get("/api/v1/quotas").get_json()["items"]] == [3]


def test_fleet_outside_its_window_takes_no_work_and_says_when_it_opens(api, join, clock):
    # The clock reads 2026-01-01 12:00 UTC; the fleet opens at 20:00 UTC.
    resp = api.patch(
        "/api/v1/fleets/gpu-a",
        {"availability": {"timezone": "UTC", "windows": [{"start": "20:00", "end": "08:00"}]}},
    )
    assert resp.status_code == 200
    _, session = _node(api, join, "n1", 2)
    job = api.submit(resources={"gpus": 1})
    assert job["state"] == "queued"
    status = _status(api)
    _assert_sums(status)
    note = status["gpu"]["blocked_notes"][0]
    assert note["code"] == "outside_window" and note["next_open_at"] == "2026-01-01T20:00:00.000Z"
    clock.advance(8 * 3600)
    api.heartbeat(session)
    api.run_task("scheduling")
    assert api.get(f"/api/v1/jobs/{job['id']}").get_json()["state"] == "running"
    bad = api.patch(
        "/api/v1/fleets/gpu-a", {"availability": {"timezone": "Nowhere/Land", "windows": []}}
    )
    assert bad.status_code == 400


def test_on_demand_preempts_the_lowest_bid_spot_job_once_it_has_stopped(api, join, clock):
    _, session = _node(api, join, "n1", 2)
    cheap = api.submit(name="cheap", priority_class="spot", bid=1.0, resources={"gpus": 1})
    dear = api.submit(name="dear", priority_class="spot", bid=5.0, resources={"gpus": 1})
    a, b = api.start_task(session), api.start_task(session)
    running = [{"id": t["task_id"], "epoch": t["epoch"], "state": "running"} for t in (a, b)]
    api.heartbeat(session, tasks=running)
    urgent = api.submit(name="urgent", resources={"gpus": 1})
    assert urgent["state"] == "queued"
    assert urgent["pending_reason"] == "preempted 1 spot job(s); placed once their 1 task(s) stop"
    preempted = api.get(f"/api/v1/jobs/{cheap['id']}").get_json()
    assert preempted["state"] == "queued" and preempted["attempt"] == 2
    assert api.get(f"/api/v1/jobs/{dear['id']}").get_json()["state"] == "running"
    events = api.get(f"/api/v1/jobs/{cheap['id']}/events").get_json()["items"]
    assert any(
        e["to_status"] == "preempted" and f"on-demand job urgent (id {urgent['id']})" in e["reason"]
        for e in events
    )
    # The cheap task still runs on the node: its GPU is not free yet.
    reply = api.heartbeat(session, tasks=running)
    victim = a if a["job_id"] == cheap["id"] else b
    assert reply["cancel"] == [victim["task_id"]]
    clock.advance(31)  # the periodic pass asks the parked group again after a while
    api.run_task("scheduling")
    assert (
        api.get(f"/api/v1/jobs/{urgent['id']}").get_json()["pending_reason"]
        == "waiting for 1 preempted spot task(s) to stop"
    )
    api.heartbeat(session, tasks=[t for t in running if t["id"] != victim["task_id"]])
    api.run_task("scheduling")
    assert api.get(f"/api/v1/jobs/{urgent['id']}").get_json()["state"] == "running"
    assert api.get(f"/api/v1/jobs/{cheap['id']}").get_json()["state"] == "queued"


def test_spot_never_preempts_on_demand(api, join):
    _, session = _node(api, join, "n1", 1)
    api.submit(name="od", resources={"gpus": 1})
    api.start_task(session)
    spot = api.submit(name="spot", priority_class="spot", bid=100.0, resources={"gpus": 1})
    assert spot["state"] == "queued" and "no node can take the task now" in spot["pending_reason"]


def test_a_fleet_can_have_its_own_placement_policy(make_app, clock):
    from tests.conftest import admin_client

    api = admin_client(make_app(fleet_policies="gpu-b=packing"), clock)
    api.create_fleet("gpu-a")
    api.create_fleet("gpu-b")
    _node(api, api.create_join_token("gpu-a"), "a1", 2)
    _node(api, api.create_join_token("gpu-b"), "b1", 2)
    placed = {}
    for fleet in ("gpu-a", "gpu-b"):
        job = api.submit(name=fleet, resources={"gpus": 1}, node_selector={"fleet": fleet})
        events = api.get(f"/api/v1/jobs/{job['id']}/events").get_json()["items"]
        placed[fleet] = next(e["reason"] for e in events if e["to_status"] == "running")
    assert placed == {"gpu-a": "placed by policy fragbal", "gpu-b": "placed by policy packing"}


def test_unknown_policy_names_are_refused_at_start_up():
    from fleetd.settings import Settings

    with pytest.raises(ValueError, match="unknown scheduler policy 'tetris'"):
        Settings.load(environ={}, fleet_policies="gpu-a=tetris")
    with pytest.raises(ValueError, match="fleet=policy"):
        Settings.load(environ={}, fleet_policies="gpu-a")


def test_gpus_of_many_cancelled_tasks_stay_held_while_their_node_reports_them(api, join):
    # More ended-but-reported tasks than one statement reads by id (inventory._ENDED_CHUNK).
    _, session = _node(api, join, "n1", 1)
    jobs = [api.submit(name=f"small-{i}", resources={"gpus": 0.02}) for i in range(40)]
    started = [api.start_task(session) for _ in jobs]
    reported = [{"id": t["task_id"], "epoch": t["epoch"], "state": "running"} for t in started]
    api.heartbeat(session, tasks=reported)
    for job, task in zip(jobs, started):
        assert api.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
        api.task_call(session, task, "finish", outcome="cancelled")
    api.heartbeat(session, tasks=reported)  # ended, and still reported by the node
    big = api.submit(name="big", resources={"gpus": 0.3})
    assert (
        big["state"] == "queued"
    )  # 40 x 0.02 of the GPU is in use until the node stops the tasks (32: room)
    api.heartbeat(session, tasks=reported[:1])
    api.run_task("scheduling")
    assert api.get(f"/api/v1/jobs/{big['id']}").get_json()["state"] == "running"
