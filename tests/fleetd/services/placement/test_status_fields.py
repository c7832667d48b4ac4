"""Cluster status says why GPUs are blocked in a sentence and per series, counts queued demand in
rows that add up, and shows each running job's times and retries; an agent's heartbeat can cordon
its own node while it drains."""

from tests.conftest import ApiClient

H100 = "NVIDIA H100 80GB HBM3"
SERIES = "nvidia-h100-80gb-hbm3"


def _status(api):
    resp = api.get("/api/v1/cluster/status")
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def test_blocked_gpus_have_a_sentence_and_their_series_a_note(api):
    api.create_fleet()
    join = api.create_join_token()
    api.ready_node(join, "a", gpu_count=2)
    cordoned, _ = api.ready_node(join, "b", gpu_count=2)
    assert _status(api)["gpu"]["blocked_reason"] == ""
    assert api.post(f"/api/v1/nodes/{cordoned}/cordon").status_code == 200

    gpu = _status(api)["gpu"]
    assert gpu["blocked"] == 2
    assert gpu["blocked_reason"] == f"2 {H100} GPUs: node cordoned by an admin."
    [row] = gpu["series"]
    assert row["note"] == {"code": "cordoned", "series": SERIES}


def test_queued_demand_of_any_model_is_a_row_of_its_own_so_the_rows_add_up(api):
    api.create_fleet()
    api.ready_node(api.create_join_token(), "a", gpu_count=2)
    api.submit(name="any-model", resources={"gpus": 4})  # more than the node has: queued
    api.submit(name="named", resources={"gpus": 8, "gpu_types": [H100]})
    api.submit(
        name="nowhere", resources={"gpus": 1, "gpu_types": ["NVIDIA B200"]}
    )  # no node has that model

    gpu = _status(api)["gpu"]
    rows = {row["id"]: row for row in gpu["series"]}
    assert gpu["queued"] == 13
    assert rows[SERIES]["queued"] == 8
    assert {k: rows["any"][k] for k in ("total", "used", "free", "blocked", "queued", "note")} == {
        "total": 0,
        "used": 0,
        "free": 0,
        "blocked": 0,
        "queued": 5,
        "note": None,
    }
    assert sum(row["queued"] for row in gpu["series"]) == gpu["queued"]
    assert all(row["total"] == row["used"] + row["free"] + row["blocked"] for row in gpu["series"])


def test_running_job_rows_show_times_duration_and_retries_and_active_count_counts_everyone(
    api, clock
):
    api.create_fleet()
    api.ready_node(api.create_join_token(), "a", gpu_count=2)
    retried = api.submit(
        name="retried", resources={"gpus": 1}, retry={"max_attempts": 3, "on": ["failed"]}
    )
    plain = ApiClient(api.app, api.create_token("submitter", "bob")).submit(
        name="plain", resources={"gpus": 1}
    )
    assert retried["state"] == plain["state"] == "running"
    clock.advance(90)

    status = _status(api)
    assert status["active_count"] == 2
    rows = {row["name"]: row for row in status["active_jobs"]}
    row = rows["retried"]
    assert (row["submitted_at"], row["started_at"], row["ended_at"]) == (
        retried["submitted_at"],
        retried["started_at"],
        None,
    )
    assert row["duration_seconds"] == 90
    assert (row["retry_count"], row["can_retry"], row["retry_blocker"], row["retry_on"]) == (
        0,
        True,
        "",
        ["failed"],
    )
    assert (rows["plain"]["can_retry"], rows["plain"]["retry_blocker"]) == (
        False,
        "its spec has no retry policy",
    )

    as_bob = (
        ApiClient(api.app, api.create_token("submitter", "carol"))
        .get("/api/v1/cluster/status")
        .get_json()
    )
    assert as_bob["active_jobs"] == [] and as_bob["active_count"] == 2  # a count, no names


def test_an_agent_that_says_it_is_draining_cordons_its_node_until_it_says_it_is_not(api):
    api.create_fleet()
    node_id, session = api.ready_node(api.create_join_token(), "a")
    assert api.heartbeat(session, draining=True)["status"] == "cordoned"
    node = api.node(node_id)
    assert (node["status"], node["status_reason"]) == ("cordoned", "agent draining")
    assert api.submit(name="waits", resources={"gpus": 1})["state"] == "queued"
    assert api.heartbeat(session)["status"] == "cordoned"  # no field: no change

    assert api.heartbeat(session, draining=False)["status"] == "ready"
    assert api.job(api.get("/api/v1/jobs").get_json()["items"][0]["id"])["state"] == "running"
    events = api.get(f"/api/v1/nodes/{node_id}/events").get_json()["items"]
    assert [(e["to_status"], e["reason"]) for e in events][-2:] == [
        ("cordoned", "agent draining"),
        ("ready", "agent no longer draining"),
    ]


def test_an_admins_cordon_outlasts_the_agent_saying_it_is_not_draining(api):
    api.create_fleet()
    node_id, session = api.ready_node(api.create_join_token(), "a")
    assert api.post(f"/api/v1/nodes/{node_id}/cordon").status_code == 200
    assert api.heartbeat(session, draining=True)["status"] == "cordoned"
    assert api.heartbeat(session, draining=False)["status"] == "cordoned"
    assert api.node(node_id)["status_reason"] == "cordoned by admin"
    assert api.heartbeat(session, expect=400, draining="yes")["error"]["code"] == "invalid_request"


def test_storage_is_measured_as_soon_as_the_background_tasks_start(make_app):
    import datetime as dt

    from apscheduler.schedulers.background import BackgroundScheduler

    from tests.support.polling import wait_until

    app = make_app(storage_measure_seconds=3600)  # an interval later would be an hour later
    rt = app.extensions["fleetd"]
    assert rt.storage is None or not rt.storage
    rt.tasks.start(BackgroundScheduler(timezone=dt.timezone.utc))
    try:
        wait_until(lambda: rt.storage, timeout=30, message="the storage task's first run")
    finally:
        rt.tasks.shutdown()
    assert rt.storage["measured_at"] is not None and rt.storage["disk_total_bytes"] > 0
    assert (
        rt.tasks.records["metrics_sampler"].last_started_at is None
    )  # the others wait for their interval


def test_queued_demand_counts_every_job_of_a_group_and_jobs_stored_without_a_group(api):
    from fleetd.db import database
    from fleetd.models import Job

    api.create_fleet()
    api.ready_node(api.create_join_token(), "a", gpu_count=2)
    alike = [api.submit(name=f"alike{i}", resources={"gpus": 4}) for i in range(3)]
    old = api.submit(name="old", resources={"gpus": 4, "gpu_types": [H100]})  # queued too
    with api.app.app_context(), database.connection_context():
        # One group for the three (read through one of them); a job from before group keys.
        assert (
            len({j.group_key for j in Job.select().where(Job.id.in_([a["id"] for a in alike]))})
            == 1
        )
        Job.update(group_key=None).where(Job.id == old["id"]).execute()
    gpu = _status(api)["gpu"]
    rows = {row["id"]: row for row in gpu["series"]}
    assert gpu["queued"] == 16 and rows["any"]["queued"] == 12 and rows[SERIES]["queued"] == 4
