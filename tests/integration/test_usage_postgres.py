"""The usage ledger on a real PostgreSQL database with a leader failover in the middle of a run: the
deposed leader's pass commits nothing, the new leader's carries on from where the ledger stood, and
the run ends up accounted exactly once, to the second."""

import datetime as dt
from types import SimpleNamespace

import pytest

from fleetd.db import database
from fleetd.models import UsageRecord
from fleetd.replicas import Leadership
from fleetd.services.identity.tokens import issue_first_admin_token
from tests.fleetd.services.accounting.test_usage_workloads import check_reports
from tests.integration.test_replicas import replica_db  # noqa: F401 - the fixture
from tests.support import wait_until
from tests.support.http import ApiClient

pytestmark = pytest.mark.integration

H100 = "NVIDIA H100 80GB HBM3"


def test_a_failover_in_the_middle_of_a_run_loses_and_doubles_nothing(replica_db, make_app, clock):  # noqa: F811
    app = make_app(db_url=replica_db, failover_grace_seconds=0)
    rt = app.extensions["fleetd"]
    old = rt.leader = Leadership(lease_seconds=1, shared=True, monotonic=lambda: 0.0)
    assert old.tick()
    with database.connection_context():
        api = ApiClient(app, issue_first_admin_token(clock.now()))
    api.create_fleet("gpu-a")
    _, session = api.ready_node(api.create_join_token("gpu-a"), "n1", gpu_count=2)
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 3.0})
    api.submit(resources={"gpus": 2}, team="ml")
    assignment = api.start_task(session)
    clock.advance(600)
    api.run_task("usage")  # the old leader accounts the first 10 minutes

    def row():
        with database.connection_context():
            (record,) = UsageRecord.select()
            return record.gpu_seconds, record.cost

    assert row() == (1200.0, pytest.approx(1.0))
    new = Leadership(lease_seconds=1, shared=True)
    wait_until(new.tick, 10, message="the lease to lapse and another replica to take it")
    clock.advance(600)
    old._valid_until = old.lease_seconds - old.margin  # paused: by its own clock it still leads
    result = api.post("/api/v1/admin/tasks/usage/run").get_json()
    assert result["last_status"] == "error" and result["last_error"].startswith("Fenced: "), result
    assert row() == (1200.0, pytest.approx(1.0))  # nothing of the deposed leader's pass committed
    rt.leader = new
    api.heartbeat(session)
    api.run_task("usage")
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    clock.advance(60)
    api.run_task("usage")
    api.run_task("usage")
    assert row() == (2400.0, pytest.approx(2.0))
    report = api.get("/api/v1/usage?group_by=team&from=2026-01-01&to=2026-01-01").get_json()
    assert report["rows"] == [
        {
            "group": "ml",
            "gpu_hours_allocated": 0.666667,
            "gpu_hours_used": None,
            "efficiency": None,
            "cost": 2.0,
            "runs": 1,
        }
    ]
    # by workload: the month's sums (read in cost order) and the day's, the same exact figures
    month = api.get("/api/v1/usage?group_by=workload").get_json()["rows"]
    day = api.get("/api/v1/usage?group_by=workload&from=2026-01-01&to=2026-01-01").get_json()[
        "rows"
    ]
    assert month == day and [(r["gpu_hours_allocated"], r["cost"], r["runs"]) for r in month] == [
        (0.666667, 2.0, 1)
    ]


@pytest.mark.parametrize(
    "few", [30, -1, 10**6], ids=["chosen", "month rows", "day rows but whole months"]
)
def test_reports_by_workload_read_from_month_rows_match_the_day_rows(
    replica_db,  # noqa: F811
    make_app,
    monkeypatch,
    few,
):
    """The SQL of a report over part of a month (month rows in cost order, the straddling
    workloads' day rows joined day by day) on PostgreSQL: the same rows as grouping day rows, to
    the precision of its `real` columns."""
    app = make_app(db_url=replica_db)
    with app.app_context(), database.connection_context():
        now = dt.datetime(2026, 3, 24, 18)
        check_reports(
            SimpleNamespace(clock=SimpleNamespace(now=lambda: now)), monkeypatch, few, 1e-6
        )
