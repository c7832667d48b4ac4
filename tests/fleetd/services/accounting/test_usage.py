"""The usage ledger over the real API, the agent side spoken by the test: exact GPU-seconds, used
GPU-seconds from the GPUs' samples, cost with a price changed mid-run; a restart and a fenced
(failed-over) pass lose and double nothing; storage cost; job cost; reports in JSON and CSV; the
idle-held list; the metrics."""

import csv
import io
import threading

import pytest

from fleetd.auth import Principal
from fleetd.db import database, fenced_by, write_transaction
from fleetd.models import Event, Instance, StorageRecord, UsageDay, UsageRecord
from fleetd.replicas import Fenced
from fleetd.services.accounting import ledger, periods, usage, usage_metrics, volumes
from tests.conftest import T0, ApiClient, gpus

H100 = "NVIDIA H100 80GB HBM3"


def readings(util, count=2):
    """A heartbeat's metrics: every GPU of the node at `util` % (the uuids of
    tests.conftest.gpus)."""
    return {"gpus": {g["uuid"]: {"utilization_percent": u} for g, u in zip(gpus(count), util)}}


def sample(api, session, util):
    """The node reports its GPUs' utilisation and fleetd stores a sample of it."""
    api.heartbeat(session, metrics=readings(util))
    api.run_task("metrics_sampler")


def records(app):
    with app.app_context(), database.connection_context():
        return list(UsageRecord.select().order_by(UsageRecord.started_at))


@pytest.fixture
def node(api):
    api.create_fleet("gpu-a")
    token = api.create_join_token("gpu-a")
    return api.ready_node(token, "host-1", gpu_count=2)


def test_a_run_is_accounted_to_the_second_with_its_samples_and_a_price_changed_mid_run(
    app, api, node, clock
):
    node_id, session = node
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    job = api.submit(resources={"gpus": 2}, team="ml")
    assignment = api.start_task(session)
    clock.advance(60)
    shown = api.job(job["id"])  # before the ledger's first pass: carried on from its start
    assert shown["price_per_hour"] == 4.0 and shown["cost_so_far"] == round(4.0 * 60 / 3600, 6)
    sample(api, session, (80, 40))
    clock.advance(540)
    api.run_task("usage")  # 600 s in: the row progresses while the run goes on
    (row,) = records(app)
    assert (
        row.kind,
        row.workload_id,
        row.team,
        row.fleet,
        row.node_id,
        row.gpu_model,
        row.gpus,
    ) == ("job", job["id"], "ml", "gpu-a", node_id, H100, 2.0)
    assert row.ended_at is None and row.accounted_until == T0.replace(minute=10)
    assert row.gpu_seconds == 1200 and row.cost == pytest.approx(2 * 600 / 3600 * 2.0)
    assert (
        row.used_gpu_seconds == pytest.approx(600 * 0.8 + 600 * 0.4)
        and row.sampled_gpu_seconds == 1200
    )
    clock.advance(1200)  # 30 min in: the price changes
    sample(api, session, (80, 40))
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 3.0})
    clock.advance(1800)
    sample(api, session, (80, 40))
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    clock.advance(
        3600
    )  # the pass comes later: the run is accounted to its end, at the prices of then
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 100.0})
    api.run_task("usage")
    (row,) = records(app)
    assert row.ended_at == T0.replace(hour=13) and row.accounted_until == row.ended_at
    assert row.gpu_seconds == 2 * 3600
    assert row.cost == pytest.approx(2 * (0.5 * 2.0 + 0.5 * 3.0))
    assert (
        row.used_gpu_seconds == pytest.approx(3600 * 0.8 + 3600 * 0.4)
        and row.sampled_gpu_seconds == 7200
    )
    api.run_task("usage")  # nothing more, and the later price rewrote nothing
    assert records(app)[0].cost == pytest.approx(5.0)
    shown = api.job(job["id"])
    assert (
        shown["cost_so_far"] == pytest.approx(5.0) and shown["price_per_hour"] == 6.0
    )  # what it last ran at


def test_a_restart_and_a_fenced_pass_in_the_middle_of_a_run_lose_and_double_nothing(
    app, make_app, api, node, clock
):
    node_id, session = node
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 1.0})
    api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    clock.advance(300)
    api.run_task("usage")
    clock.advance(300)

    def lost_the_lead():
        raise Fenced("another replica leads")

    with (
        app.app_context(),
        database.connection_context(),
        fenced_by(lost_the_lead),
        pytest.raises(Fenced),
    ):
        ledger.flush(app.extensions["fleetd"])
    assert records(app)[0].gpu_seconds == 300  # the fenced pass committed nothing
    restarted = make_app()  # fleetd restarts on the same database
    again = ApiClient(restarted, api.token)
    clock.advance(300)
    again.run_task("usage")
    again.heartbeat(session)
    again.task_call(session, assignment, "finish", outcome="failed", exit_code=1)
    clock.advance(100)
    again.run_task("usage")
    again.run_task("usage")
    (row,) = records(restarted)
    assert row.gpu_seconds == 900 and row.cost == pytest.approx(900 / 3600)
    assert row.sampled_gpu_seconds == 0 and row.used_gpu_seconds == 0  # no samples came: unknown
    with restarted.app_context(), database.connection_context():
        days = list(UsageDay.select())
    assert [(d.gpu_seconds, d.runs) for d in days] == [(900, 1)]


def test_a_sample_written_while_a_pass_runs_counts_in_the_next_pass(app, api, node, clock):
    """`fleetd serve` (the quick start): the GPU sampler and the ledger's pass both run every 60 s,
    at the same moments; while the sampler waits on the thread pool for its GPU summary, the pass
    runs. The sample it then writes is the next pass's, and counts there (it used to be stamped
    before that pass began and never count)."""
    _, session = node
    api.submit(resources={"gpus": 2})
    api.start_task(session)
    rt = app.extensions["fleetd"]
    api.heartbeat(session, metrics=readings((40, 40)))
    clock.advance(60)
    passes = []

    def offload(
        fn, *args
    ):  # as gevent: another task runs while this one waits on the pool, a moment later
        if not passes:
            clock.advance(0.5)
            other = threading.Thread(
                target=lambda: passes.append(rt.tasks.run("usage").last_status)
            )
            other.start()
            other.join(60)
        return fn(*args)

    own, rt.offload = rt.offload, offload
    try:
        api.run_task("metrics_sampler")
    finally:
        rt.offload = own
    assert passes == ["ok"]
    clock.advance(59.5)
    api.run_task("usage")
    (row,) = records(app)
    assert (
        row.gpu_seconds == 2 * 120 and row.sampled_gpu_seconds == 2 * 59.5
    )  # the sample's stretch
    assert row.used_gpu_seconds == pytest.approx(0.4 * 2 * 59.5)
    totals = api.get("/api/v1/usage").get_json()["totals"]
    assert totals["efficiency"] == pytest.approx(0.4) and totals["gpu_hours_used"] == pytest.approx(
        0.4 * 119 / 3600, abs=1e-6
    )


def test_a_run_that_ended_since_the_last_pass_shows_its_cost_end_and_price_at_once(
    app, api, node, clock
):
    """Between the ledger's passes (every 60 s) a finished job shows what the next pass will write:
    its cost to its end (not 0), its run ended (not running), the price it ran at (not null, after
    the pass too)."""
    _, session = node
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    job = api.submit(resources={"gpus": 2})
    assignment = api.start_task(session)
    clock.advance(600)
    sample(api, session, (40, 60))
    clock.advance(300)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    clock.advance(30)  # no pass since it started
    rt = app.extensions["fleetd"]
    as_admin = Principal(kind="api", id="x", role="admin", name="x")

    def shown():
        with app.app_context(), database.connection_context():
            own = usage.workload_usage(rt, as_admin, job["id"])
        return api.job(job["id"]), own

    before, own = shown()
    assert (
        before["cost_so_far"] == pytest.approx(2 * 900 / 3600 * 2.0)
        and before["price_per_hour"] == 4.0
    )
    (run,) = own["runs"]
    assert run["ended_at"] == "2026-01-01T12:15:00.000Z" and run["gpu_hours_allocated"] == 0.5
    assert run["efficiency"] == 0.5 and run["cost"] == pytest.approx(
        1.0
    )  # its sample weighs the stretch
    api.run_task("usage")
    assert shown() == (before, own)  # what the pass wrote


def test_a_volume_that_never_fitted_is_not_billed(app, api, node, clock):
    """An instance whose first run never started (its volume did not fit on the node) has no volume:
    no storage cost, however long it stays; a row an older fleetd billed from its placement is taken
    back, sums too."""
    _, session = node
    api.call("PUT", "/api/v1/prices/storage", json={"per_gb_month": 0.1})
    inst = api.post(
        "/api/v1/instances",
        {
            "name": "big",
            "command": ["sleep", "1d"],
            "resources": {"gpus": 1},
            "volume_bytes": 100 * 10**9,
        },
    ).get_json()
    assignment = api.acquire(session)  # placed, then refused by its node
    api.task_call(
        session,
        assignment,
        "finish",
        outcome="failed",
        reason="the volume of 100000000000 bytes does not fit on this host",
    )
    assert api.get(f"/api/v1/instances/{inst['id']}").get_json()["state"] == "failed"
    for _ in range(3):
        clock.advance(86400)
        api.run_task("usage")
    assert api.get(f"/api/v1/instances/{inst['id']}").get_json()["storage_cost_so_far"] == 0.0
    assert api.get("/api/v1/usage?group_by=workload").get_json()["rows"] == []
    with app.app_context(), database.connection_context():
        assert not StorageRecord.select().exists()
        with (
            write_transaction()
        ):  # what an older fleetd accounted: from the placement to now, sums too
            older = ledger._Pass(clock.now())
            owner = Instance.get_by_id(inst["id"])
            record = StorageRecord.create(
                id=owner.id,
                owner=owner.owner,
                owner_token_id=owner.owner_token_id,
                team="",
                fleet="gpu-a",
                volume_bytes=100 * 10**9,
                started_at=T0,
                accounted_until=clock.now(),
            )
            for a, b in periods.split_days(T0, clock.now()):
                piece = volumes.storage_cost(record.volume_bytes, older.book, a, b)
                record.cost += piece
                older.add(a, periods.STORAGE, record, cost=piece)
            record.save()
            older.write_days()
    assert api.get(f"/api/v1/instances/{inst['id']}").get_json()[
        "storage_cost_so_far"
    ] == pytest.approx(100 * 0.1 * 3 / 31)
    api.run_task("usage")
    assert api.get(f"/api/v1/instances/{inst['id']}").get_json()["storage_cost_so_far"] == 0.0
    assert api.get("/api/v1/usage?group_by=team").get_json()["totals"]["cost"] == pytest.approx(
        0.0, abs=1e-9
    )
    with app.app_context(), database.connection_context():
        assert not StorageRecord.select().exists()


def test_a_requeued_attempt_keeps_its_own_row(app, api, node, clock):
    _, session = node
    job = api.submit(resources={"gpus": 1}, retry={"max_attempts": 2, "on": ["failed"]})
    first = api.start_task(session)
    clock.advance(100)
    api.heartbeat(session)
    api.task_call(session, first, "finish", outcome="failed", exit_code=1)  # requeued at once
    second = api.start_task(session)
    clock.advance(50)
    api.task_call(session, second, "finish", outcome="succeeded", exit_code=0)
    api.run_task("usage")
    rows = records(app)
    assert [(r.attempt, r.gpu_seconds, r.ended_at is not None) for r in rows] == [
        (1, 100, True),
        (2, 50, True),
    ]
    assert {r.workload_id for r in rows} == {job["id"]}


def member(api, name, team):
    """A submitter token of `team`, as an ApiClient."""
    resp = api.post("/api/v1/tokens", {"name": name, "role": "submitter", "team": team})
    assert resp.status_code == 201, resp.get_json()
    return ApiClient(api.app, resp.get_json()["token"])


def run_for(api, client, session, gpus_, seconds, clock):
    """A job of `client` on `gpus_` GPUs that runs `seconds` and succeeds; returns the job."""
    job = client.submit(resources={"gpus": gpus_})
    assignment = api.start_task(session)
    clock.advance(seconds)
    api.heartbeat(session)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    return job


def test_reports_group_filter_and_show_a_submitter_only_its_own_and_csv_matches_json(
    app, api, node, clock
):
    _, session = node
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    alice, bob = member(api, "alice", "ml"), member(api, "bob", "cv")
    sample(api, session, (50, 50))
    run_for(api, alice, session, 1, 3600, clock)
    bob_job = run_for(api, bob, session, 2, 1800, clock)
    api.run_task("usage")
    report = api.get("/api/v1/usage?group_by=team&from=2026-01-01&to=2026-01-01").get_json()
    assert (report["from"], report["to"], report["group_by"]) == (
        "2026-01-01",
        "2026-01-01",
        "team",
    )
    assert report["rows"] == [
        {
            "group": "cv",
            "gpu_hours_allocated": 1.0,
            "gpu_hours_used": None,
            "efficiency": None,
            "cost": 2.0,
            "runs": 1,
        },
        {
            "group": "ml",
            "gpu_hours_allocated": 1.0,
            "gpu_hours_used": 0.5,
            "efficiency": 0.5,
            "cost": 2.0,
            "runs": 1,
        },
    ]
    assert report["totals"] == {
        "gpu_hours_allocated": 2.0,
        "gpu_hours_used": 0.5,
        "efficiency": 0.5,
        "cost": 4.0,
        "runs": 2,
    }
    assert (
        api.get("/api/v1/usage?group_by=team&from=2026-01-02&to=2026-01-03").get_json()["rows"]
        == []
    )
    assert [
        r["group"] for r in api.get("/api/v1/usage?group_by=owner&team=cv").get_json()["rows"]
    ] == ["bob"]
    assert [r["group"] for r in api.get("/api/v1/usage?group_by=day").get_json()["rows"]] == [
        "2026-01-01"
    ]
    assert [r["group"] for r in api.get("/api/v1/usage?group_by=gpu_model").get_json()["rows"]] == [
        H100
    ]
    assert [
        (r["group"], r["runs"])
        for r in api.get("/api/v1/usage?group_by=workload&team=cv").get_json()["rows"]
    ] == [(f"job/{bob_job['id']}", 1)]
    rt = app.extensions["fleetd"]
    as_admin = Principal(kind="api", id="x", role="admin", name="x")
    with app.app_context(), database.connection_context():
        chart = usage.usage_by_day_and_team(rt, as_admin)
        assert [(r["day"], r["team"], r["gpu_hours_allocated"]) for r in chart] == [
            ("2026-01-01", "cv", 1.0),
            ("2026-01-01", "ml", 1.0),
        ]
        own = usage.workload_usage(rt, as_admin, bob_job["id"])
        assert [(r["gpus"], r["gpu_hours_allocated"], r["cost"]) for r in own["runs"]] == [
            (2.0, 1.0, 2.0)
        ]
        assert own["totals"]["runs"] == 1
        assert (
            usage.workload_usage(
                rt, Principal(kind="api", id="y", role="submitter"), bob_job["id"]
            )["runs"]
            == []
        )
    own = alice.get("/api/v1/usage?group_by=team").get_json()
    assert [r["group"] for r in own["rows"]] == ["ml"] and own["totals"]["cost"] == 2.0
    assert [
        r["group"] for r in alice.get("/api/v1/usage?group_by=team&team=cv").get_json()["rows"]
    ] == []
    resp = api.get("/api/v1/usage?group_by=team", headers={"Accept": "text/csv"})
    assert resp.status_code == 200 and resp.mimetype == "text/csv"
    spec = api.get("/api/openapi.json").get_json()["paths"]["/api/v1/usage"]["get"]["responses"][
        "200"
    ]
    assert set(spec["content"]) == {"application/json", "text/csv"}  # the CSV is declared too
    parsed = list(csv.DictReader(io.StringIO(resp.get_data(as_text=True))))
    as_json = api.get("/api/v1/usage?group_by=team").get_json()["rows"]
    assert [{k: (None if v == "" else v) for k, v in row.items()} for row in parsed] == [
        {k: None if v is None else str(v) for k, v in row.items()} for row in as_json
    ]
    for bad in (
        "group_by=nothing",
        "from=yesterday",
        "from=2026-02-01&to=2026-01-01",
        "from=0001-01-01",
    ):
        resp = api.get(f"/api/v1/usage?{bad}")
        assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "invalid_request", (
            bad
        )


def test_a_stopped_instance_volume_accrues_storage_per_gb_month_across_months(
    app, api, node, clock
):
    _, session = node
    assert api.get("/api/v1/prices/storage").get_json()["per_gb_month"] is None
    assert api.call("PUT", "/api/v1/prices/storage", json={"per_gb_month": 0.1}).status_code == 200
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    inst = api.post(
        "/api/v1/instances",
        {
            "name": "nb",
            "command": ["sleep", "1d"],
            "resources": {"gpus": 1},
            "volume_bytes": 100 * 10**9,
        },
    ).get_json()
    assignment = api.start_task(session)
    clock.advance(3600)
    api.heartbeat(session)
    api.post(f"/api/v1/instances/{inst['id']}/stop")
    api.task_call(session, assignment, "finish", outcome="cancelled", reason="stopped")
    api.run_task("usage")
    clock.advance(30 * 86400 + 11 * 3600)  # to Feb 1, 00:00 (January has 31 days)
    api.run_task("usage")
    clock.advance(14 * 86400)  # half of February (28 days)
    api.call("PUT", "/api/v1/prices/storage", json={"per_gb_month": 0.2})
    clock.advance(7 * 86400)
    api.run_task("usage")
    january = 100 * 0.1 * (31 * 86400 - 12 * 3600) / (31 * 86400)
    february = 100 * 0.1 * 0.5 + 100 * 0.2 * 0.25
    shown = api.get(f"/api/v1/instances/{inst['id']}").get_json()
    assert shown["storage_cost_so_far"] == pytest.approx(january + february)
    assert shown["cost_so_far"] == pytest.approx(2.0)  # the running cost, beside it
    months = api.get("/api/v1/usage?group_by=day&from=2026-01-01&to=2026-02-28").get_json()
    assert months["totals"]["cost"] == pytest.approx(2.0 + january + february)
    assert months["totals"]["gpu_hours_allocated"] == 1.0
    workload = api.get("/api/v1/usage?group_by=workload&from=2026-01-01&to=2026-02-28").get_json()[
        "rows"
    ]
    assert [(r["group"], r["runs"]) for r in workload] == [(f"instance/{inst['id']}", 1)]
    assert workload[0]["cost"] == pytest.approx(2.0 + january + february)


def test_idle_held_gpus_are_listed_with_their_owner_and_cost(app, api, node, clock):
    _, session = node
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    idle_job = api.submit(name="idle", resources={"gpus": 1}, team="ml")
    api.start_task(session)
    busy_job = api.submit(name="busy", resources={"gpus": 1})
    api.start_task(session)
    first, second = (
        t["gpus"][0]
        for t in (api.job(idle_job["id"])["tasks"][0], api.job(busy_job["id"])["tasks"][0])
    )
    for _ in range(4):
        clock.advance(600)
        api.heartbeat(
            session,
            metrics={
                "gpus": {first: {"utilization_percent": 3}, second: {"utilization_percent": 95}}
            },
        )
        api.run_task("metrics_sampler")
    api.run_task("usage")
    (listed,) = api.get("/api/v1/usage/idle?min_minutes=30").get_json()["items"]
    assert {
        k: listed[k] for k in ("kind", "id", "name", "owner", "team", "gpus", "idle_minutes")
    } == {
        "kind": "job",
        "id": idle_job["id"],
        "name": "idle",
        "owner": "admin",
        "team": "ml",
        "gpus": 1.0,
        "idle_minutes": 40.0,
    }
    assert listed["cost_so_far"] == pytest.approx(2.0 * 40 / 60)
    assert api.get("/api/v1/usage/idle?min_minutes=50").get_json()["items"] == []
    assert api.get("/api/v1/usage/idle?below_percent=2").get_json()["items"] == []
    assert api.get("/api/v1/usage/idle?min_minutes=0").status_code == 400


def test_metrics_count_the_ledger_by_team_and_fleet(app, api, node, clock):
    from prometheus_client.parser import text_string_to_metric_families

    _, session = node
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    run_for(api, member(api, "alice", "ml"), session, 2, 900, clock)
    api.run_task("usage")
    text = api.get("/metrics").get_data(as_text=True)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    allocated = {
        (s.labels["team"], s.labels["fleet"]): s.value
        for s in families["fleetd_usage_allocated_gpu_seconds"].samples
        if s.name.endswith("_total")
    }
    cost = {
        (s.labels["team"], s.labels["fleet"]): s.value
        for s in families["fleetd_usage_cost"].samples
        if s.name.endswith("_total")
    }
    assert allocated == {("ml", "gpu-a"): 1800.0} and cost == {("ml", "gpu-a"): pytest.approx(1.0)}


def test_a_fractional_gpu_run_is_accounted_at_its_fraction_with_its_gpus_samples(
    app, api, node, clock
):
    _, session = node
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 4.0})
    job = api.submit(resources={"gpus": 0.25})
    assignment = api.start_task(session)
    held = api.job(job["id"])["tasks"][0]["gpus"]
    assert len(held) == 1
    clock.advance(600)
    api.heartbeat(session, metrics={"gpus": {held[0]: {"utilization_percent": 60}}})
    api.run_task("metrics_sampler")
    clock.advance(600)
    api.heartbeat(session)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    api.run_task("usage")
    (row,) = records(app)
    assert (row.gpus, row.gpu_seconds, row.sampled_gpu_seconds) == (0.25, 0.25 * 1200, 0.25 * 1200)
    assert row.used_gpu_seconds == pytest.approx(0.25 * 1200 * 0.6) and row.cost == pytest.approx(
        0.25 * 4.0 / 3
    )
    (listed,) = api.get("/api/v1/usage?group_by=workload").get_json()["rows"]
    assert (listed["gpu_hours_allocated"], listed["efficiency"]) == (
        round(0.25 * 1200 / 3600, 6),
        0.6,
    )


def test_reports_by_workload_fleet_and_owner_match_the_ledger_across_midnight(app, api, clock):
    """Reports by workload read the workload sums (a whole month from the month's, other ranges
    from the days'): both match the ledger's rows, whatever the range cuts."""
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    clock.advance(11 * 3600)  # to 23:00 on Jan 1: the runs cross midnight
    sessions = {}
    for i, fleet in enumerate(("gpu-a", "gpu-b")):
        api.create_fleet(fleet)
        own_gpu = [dict(gpus(1)[0], uuid=f"GPU-{fleet}")]
        reg = api.register(
            api.create_join_token(fleet), machine_id=fleet, hostname=fleet, gpus=own_gpu
        )
        api.heartbeat(reg["session_token"])
        sessions[fleet] = reg["session_token"]
    alice, bob = member(api, "alice", "ml"), member(api, "bob", "cv")
    first = alice.submit(resources={"gpus": 1}, node_selector={"fleet": "gpu-a"})
    on_a = api.start_task(sessions["gpu-a"])
    second = bob.submit(resources={"gpus": 1}, node_selector={"fleet": "gpu-b"})
    on_b = api.start_task(sessions["gpu-b"])
    clock.advance(1800)
    api.heartbeat(sessions["gpu-a"], metrics={"gpus": {"GPU-gpu-a": {"utilization_percent": 20}}})
    api.run_task("metrics_sampler")
    api.run_task("usage")  # a pass in the middle: the rows progress
    clock.advance(3600)  # 00:30 on Jan 2
    for fleet, assignment in (("gpu-a", on_a), ("gpu-b", on_b)):
        api.heartbeat(sessions[fleet])
        api.task_call(sessions[fleet], assignment, "finish", outcome="succeeded", exit_code=0)
    api.run_task("usage")
    ledger_rows = {f"job/{r.workload_id}": r for r in records(app)}
    assert set(ledger_rows) == {f"job/{first['id']}", f"job/{second['id']}"}

    def report(query):
        got = api.get(f"/api/v1/usage?{query}").get_json()
        return {r["group"]: r for r in got["rows"]}, got["totals"]

    month, totals = report("group_by=workload&from=2026-01-01&to=2026-01-31")  # the month's sums
    days, _ = report("group_by=workload&from=2026-01-01&to=2026-01-02")  # the days' sums
    assert month == days and set(month) == set(ledger_rows)
    for group, row in month.items():
        record = ledger_rows[group]
        assert row["gpu_hours_allocated"] == round(record.gpu_seconds / 3600, 6) == 1.5
        assert row["cost"] == pytest.approx(record.cost) and row["runs"] == 1
    assert (
        month[f"job/{first['id']}"]["efficiency"] == 0.2
        and month[f"job/{second['id']}"]["efficiency"] is None
    )
    assert totals["gpu_hours_allocated"] == 3.0 and totals["runs"] == 2
    jan1, _ = report("group_by=workload&from=2026-01-01&to=2026-01-01")
    jan2, jan2_totals = report("group_by=workload&from=2026-01-02&to=2026-01-02")
    assert {g: r["gpu_hours_allocated"] for g, r in jan1.items()} == {g: 1.0 for g in ledger_rows}
    assert {g: r["gpu_hours_allocated"] for g, r in jan2.items()} == {g: 0.5 for g in ledger_rows}
    assert {g: r["runs"] for g, r in jan2.items()} == {g: 0 for g in ledger_rows} and jan2_totals[
        "runs"
    ] == 0
    by_fleet, _ = report("group_by=fleet")
    assert {g: (r["gpu_hours_allocated"], r["cost"]) for g, r in by_fleet.items()} == {
        "gpu-a": (1.5, 3.0),
        "gpu-b": (1.5, 3.0),
    }
    only_a, only_a_totals = report("group_by=workload&fleet=gpu-a")
    assert list(only_a) == [f"job/{first['id']}"] and only_a_totals["gpu_hours_allocated"] == 1.5
    assert list(report("group_by=team&fleet=gpu-b")[0]) == ["cv"]
    assert list(report("group_by=workload&owner=bob")[0]) == [f"job/{second['id']}"]
    assert list(report("group_by=fleet&owner=alice")[0]) == ["gpu-a"]
    assert list(report("group_by=workload&owner=nobody")[0]) == []


def test_usage_counters_never_go_down_as_the_teams_ranking_changes(
    app, api, node, clock, monkeypatch
):
    monkeypatch.setattr(usage_metrics, "MAX_TEAM_LABELS", 2)
    _, session = node
    collector = usage_metrics.UsageCollector(app.extensions["fleetd"], cache_seconds=0)

    def counters():
        with app.app_context(), database.connection_context():
            families = list(collector.collect())
        return {(s.name, tuple(s.labels.values())): s.value for f in families for s in f.samples}

    seen = {}
    for team, seconds in (
        ("ml", 100),
        ("cv", 50),
        ("nlp", 1000),
        ("cv", 10),
        ("rl", 5000),
        ("ml", 1),
    ):
        run_for(api, member(api, f"user-{team}-{seconds}", team), session, 1, seconds, clock)
        api.run_task("usage")
        now = counters()
        for key, value in seen.items():
            assert now.get(key, -1) >= value, (key, value, now.get(key))
        seen = now
    teams = {labels[0] for _, labels in seen}
    assert teams == {"ml", "cv", "other"}  # nlp and rl came after the cap: "other" for good
    assert seen[("fleetd_usage_allocated_gpu_seconds_total", ("other", "gpu-a"))] == 6000


def test_a_report_by_user_puts_every_token_of_a_user_in_one_row(app, api, node, clock):
    _, session = node
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})

    def token(name, user=None):
        body = {"name": name, "role": "submitter", **({"user": user} if user else {})}
        resp = api.post("/api/v1/tokens", body)
        assert resp.status_code == 201, resp.get_json()
        return ApiClient(api.app, resp.get_json()["token"])

    laptop, ci, bot = token("alice laptop", "alice"), token("alice ci", "alice"), token("bot")
    for client in (laptop, ci, bot):
        run_for(api, client, session, 1, 1800, clock)
    api.run_task("usage")
    rows = api.get("/api/v1/usage?group_by=user").get_json()["rows"]
    assert [(r["group"], r["gpu_hours_allocated"], r["runs"]) for r in rows] == [
        ("alice", 1.0, 2),
        ("token:bot", 0.5, 1),
    ]
    owners = api.get("/api/v1/usage?group_by=owner").get_json()["rows"]
    assert sorted(r["group"] for r in owners) == ["alice ci", "alice laptop", "bot"]
    mine = laptop.get("/api/v1/usage?group_by=user").get_json()["rows"]
    assert [(r["group"], r["runs"]) for r in mine] == [("alice", 2)]  # its user's, both tokens


def test_a_report_by_project_counts_each_job_in_its_own_project(app, api, node, clock):
    _, session = node
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    assert api.post("/api/v1/projects", {"key": "vision", "team": "ml"}).status_code == 201
    resp = api.post("/api/v1/tokens", {"name": "alice laptop", "role": "member", "user": "alice"})
    alice = ApiClient(api.app, resp.get_json()["token"])
    member_of = api.put("/api/v1/projects/vision/members/alice", {"role": "member"})
    assert member_of.status_code == 200, member_of.get_json()
    job = alice.submit(resources={"gpus": 1}, project="vision")
    assignment = api.start_task(session)
    clock.advance(3600)
    api.heartbeat(session)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    run_for(api, alice, session, 1, 1800, clock)  # its default project's
    api.run_task("usage")
    rows = api.get("/api/v1/usage?group_by=project").get_json()["rows"]
    assert [(r["group"], r["gpu_hours_allocated"], r["cost"]) for r in rows] == [
        ("default", 0.5, 1.0),
        ("vision", 1.0, 2.0),
    ]
    assert api.get(f"/api/v1/jobs/{job['id']}").get_json()["project"] == "vision"


def test_a_project_budget_tells_its_members_once_per_threshold_and_holds_nothing_back(
    app, api, node, clock
):
    _, session = node
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    assert api.post("/api/v1/projects", {"key": "vision", "team": "ml"}).status_code == 201
    resp = api.post("/api/v1/tokens", {"name": "alice laptop", "role": "member", "user": "alice"})
    alice = ApiClient(api.app, resp.get_json()["token"])
    api.put("/api/v1/projects/vision/members/alice", {"role": "member"})
    refused = api.put("/api/v1/budgets/project/vision", {"limit_cost": 3.0, "on_exceed": "block"})
    assert refused.status_code == 400
    assert api.put("/api/v1/budgets/project/nowhere", {"limit_cost": 3.0}).status_code == 404
    made = api.put("/api/v1/budgets/project/vision", {"limit_cost": 3.0})
    assert made.status_code == 200 and made.get_json()["used_percent"] == 0
    for _ in range(3):  # 1 of 3 (none), 2 of 3 (past 50 %), 3 of 3 (past 80 and 100 %)
        job = alice.submit(resources={"gpus": 1}, project="vision")
        assignment = api.start_task(session)
        clock.advance(1800)
        api.heartbeat(session)
        api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
        api.run_task("usage")
        api.run_task("usage")  # nothing new: told once
    assert alice.get(f"/api/v1/jobs/{job['id']}").get_json()["state"] == "succeeded"
    view = alice.get("/api/v1/budgets/project/vision").get_json()
    assert (view["used_cost"], view["exceeded"], view["on_exceed"]) == (3.0, True, "notify")
    feed = alice.get("/api/v1/me/notifications").get_json()["items"]
    told = [n["text"] for n in feed if n["kind"] == "budget.threshold"]
    assert told == [
        "project vision used 66.7 % of its budget for 2026-01 (past 50 %)",
        "project vision used 100.0 % of its budget for 2026-01 (past 100 %)",
    ]
    with database.connection_context():
        events = Event.select().where(Event.kind == "budget.threshold")
        assert [(e.subject_type, e.subject_id) for e in events] == [("project", "vision")] * 3
    assert api.delete("/api/v1/budgets/project/vision").status_code == 204
