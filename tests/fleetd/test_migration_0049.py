"""Migration 0049: the month sums by workload get their first and last day, and sums per fleet,
from the day rows; going down keeps them as they were."""

from playhouse.migrations import Runner

from fleetd.db import MIGRATIONS_DIR, open_database, upgrade


def test_0049_spans_the_month_sums_and_sums_them_per_fleet_from_the_day_rows(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/spans.db")
    sums = "gpu_seconds, used_gpu_seconds, sampled_gpu_seconds, cost, runs"
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0048_job_queue_told")
        for day, kind, workload, fleet, cost in (
            ("2026-01-31", "job", "j", "gpu-a", 1.0),
            ("2026-02-01", "job", "j", "gpu-a", 2.0),
            ("2026-02-03", "job", "j", "gpu-b", 4.0),
            ("2026-02-10", "instance", "i", "gpu-a", 8.0),
        ):
            db.execute_sql(
                "INSERT INTO usage_workload_day (day, kind, workload_id, fleet, team, "
                f"owner_token_id, owner, {sums}) VALUES (?, ?, ?, ?, 'ml', 'tok', 'alice', "
                "60, 30, 60, ?, 1)",
                (day, kind, workload, fleet, cost),
            )
        for month, kind, workload, cost in (
            ("2026-01-01", "job", "j", 1.0),
            ("2026-02-01", "job", "j", 6.0),
            ("2026-02-01", "instance", "i", 8.0),
            ("2026-03-01", "job", "x", 16.0),  # no day rows (the ledger writes none such)
        ):
            db.execute_sql(
                "INSERT INTO usage_workload_month (month, kind, workload_id, team, "
                f"owner_token_id, owner, {sums}) VALUES (?, ?, ?, 'ml', 'tok', 'alice', "
                "60, 30, 60, ?, 1)",
                (month, kind, workload, cost),
            )
    assert upgrade(db)[0] == "0049_usage_workload_spans"
    with db.connection_context():
        assert db.execute_sql(
            "SELECT month, fleet, kind, workload_id, team, owner, first_day, last_day, "
            "gpu_seconds, cost, runs FROM usage_workload_fleet_month "
            "ORDER BY month, workload_id, fleet"
        ).fetchall() == [
            (
                "2026-01-01",
                "gpu-a",
                "job",
                "j",
                "ml",
                "alice",
                "2026-01-31",
                "2026-01-31",
                60.0,
                1.0,
                1,
            ),
            (
                "2026-02-01",
                "gpu-a",
                "instance",
                "i",
                "ml",
                "alice",
                "2026-02-10",
                "2026-02-10",
                60.0,
                8.0,
                1,
            ),
            (
                "2026-02-01",
                "gpu-a",
                "job",
                "j",
                "ml",
                "alice",
                "2026-02-01",
                "2026-02-01",
                60.0,
                2.0,
                1,
            ),
            (
                "2026-02-01",
                "gpu-b",
                "job",
                "j",
                "ml",
                "alice",
                "2026-02-03",
                "2026-02-03",
                60.0,
                4.0,
                1,
            ),
        ]
        assert db.execute_sql(
            "SELECT month, workload_id, first_day, last_day, cost FROM usage_workload_month "
            "ORDER BY month, workload_id"
        ).fetchall() == [
            ("2026-01-01", "j", "2026-01-31", "2026-01-31", 1.0),
            ("2026-02-01", "i", "2026-02-10", "2026-02-10", 8.0),
            ("2026-02-01", "j", "2026-02-01", "2026-02-03", 6.0),
            ("2026-03-01", "x", "2026-03-01", "2026-03-31", 16.0),
        ]
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").down("0049_usage_workload_spans")
        assert "usage_workload_fleet_month" not in db.get_tables()
        assert not {"first_day", "last_day"} & {
            c.name for c in db.get_columns("usage_workload_month")
        }
        assert {
            tuple(i.columns) for i in db.get_indexes("usage_workload_month") if "cost" in i.columns
        } == {
            ("month", "cost"),
            ("month", "team", "cost"),
            ("month", "owner_token_id", "cost"),
            ("month", "owner", "cost"),
        }
        assert db.execute_sql("SELECT COUNT(*) FROM usage_workload_month").fetchone() == (4,)
    assert upgrade(db)[0] == "0049_usage_workload_spans"
    db.close()
