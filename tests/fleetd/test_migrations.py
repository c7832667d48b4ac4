"""Numbered migrations: a fresh database ends up exactly like the models, and upgrades keep data."""

import datetime
import subprocess
import sys

import peewee
import pytest
from playhouse.migrations import Runner

from fleetd.db import MIGRATIONS_DIR, bind, database, open_database, pending_migrations, upgrade
from fleetd.models import Fleet, Node

T0 = datetime.datetime(2026, 1, 1)


def test_migrated_schema_matches_the_models(tmp_path):
    url = f"sqlite:///{tmp_path}/fresh.db"
    db = open_database(url)
    assert upgrade(db)[0] == "0001_initial"
    assert upgrade(db) == [] and pending_migrations(db) == []
    db.close()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "playhouse.migrations",
            url,
            "diff",
            "-d",
            MIGRATIONS_DIR,
            "-t",
            "schema_migration",
            "fleetd.models:MODELS",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "schema matches models.", out.stdout + out.stderr


def test_upgrading_an_old_database_keeps_its_rows(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/old.db")
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0001_initial")
        db.execute_sql(
            "INSERT INTO fleet (name, description, labels, created_at) "
            "VALUES ('gpu-a', 'kept', '{}', '2026-01-01 00:00:00')"
        )
    assert "0001_initial" not in upgrade(db) and pending_migrations(db) == []
    with db.connection_context():
        assert db.execute_sql("SELECT description, availability FROM fleet").fetchall() == [
            ("kept", None)
        ]
    db.close()


def test_the_inventory_triggers_survive_every_migration_on_sqlite(tmp_path):
    """A migration that rebuilds a table on SQLite drops its triggers; the inventory version must
    still move when placement's view of a node changes, and only then."""
    db = open_database(f"sqlite:///{tmp_path}/triggers.db")
    upgrade(db)
    bind(db)
    with database.connection_context():
        names = {
            row[0]
            for row in db.execute_sql("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        }
        assert {
            f"{table}_inventory_{event}"
            for table in ("node", "gpu", "fleet")
            for event in ("insert", "delete", "update")
        } <= names

        def version():
            return db.execute_sql("SELECT version FROM inventory_version").fetchone()[0]

        Fleet.create(name="f", created_at=T0)
        Node.create(
            id="n", fleet="f", machine_id="m", hostname="h", status="pending", registered_at=T0
        )
        before = version()
        db.execute_sql("UPDATE node SET status = 'ready' WHERE id = 'n'")
        assert version() == before + 1
        db.execute_sql("UPDATE node SET last_heartbeat_at = '2026-01-01 00:00:01' WHERE id = 'n'")
        assert version() == before + 1  # what placement does not read moves nothing
    db.close()


def _old_instance(db, instance_id, owner, name, created_minute, state="running"):
    """An instance row as a fleetd before migration 0015 stored it."""
    p = db.param
    db.execute_sql(
        f"INSERT INTO instance (id, name, owner, owner_token_id, state, status_reason, "
        f"desired_state, spec, runs, ports, created_at, cost_accrued) VALUES ({p}, {p}, {p}, {p}, "
        f"{p}, '', 'running', '{{}}', 0, '[]', {p}, 0)",
        (instance_id, name, owner, owner, state, T0 + datetime.timedelta(minutes=created_minute)),
    )


def check_duplicate_names_are_renamed_by_the_upgrade(db):
    """Build a database at 0014 holding duplicate instance names, upgrade it, check what 0015 did.
    Shared with the PostgreSQL test (tests/integration/test_postgres.py)."""
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0014_job_group_key")
        # Token t1's `web`s: the oldest by created_at keeps the name although its id sorts last;
        # `web-2` is taken by a live instance, so the others get -3 and -4. A deleted `web` keeps
        # its name.
        for row in [
            ("i4", "t1", "web", 0),
            ("i1", "t1", "web", 2),
            ("i2", "t1", "web", 3),
            ("i3", "t1", "web-2", 1),
            ("i0", "t1", "web", -1, "deleted"),
            ("j1", "t2", "web", 5),
            ("k1", "t1", "db", 4),
            ("k2", "t1", "db", 4),
        ]:  # the same time: the id decides
            _old_instance(db, *row)
    assert "0015_instance_names" in upgrade(db)
    with db.connection_context():
        names = dict(db.execute_sql("SELECT id, name FROM instance").fetchall())
        assert names == {
            "i4": "web",
            "i1": "web-3",
            "i2": "web-4",
            "i3": "web-2",
            "i0": "web",
            "j1": "web",
            "k1": "db",
            "k2": "db-2",
        }
        events = db.execute_sql(
            "SELECT subject_type, subject_id, reason, actor FROM event "
            "WHERE kind = 'instance.renamed' ORDER BY subject_id"
        ).fetchall()
        assert [(e[0], e[1], e[3]) for e in events] == [
            ("instance", "i1", "fleetd"),
            ("instance", "i2", "fleetd"),
            ("instance", "k2", "fleetd"),
        ]
        assert events[0][2].startswith("renamed from 'web' to 'web-3'")
        # From now on the database itself refuses a second live instance of a name, not a deleted
        # one.
        _old_instance(db, "i5", "t1", "web", 9, state="deleted")
        with pytest.raises(peewee.IntegrityError):
            with db.atomic():
                _old_instance(db, "i6", "t1", "web", 9)


def test_upgrading_renames_duplicate_instance_names_keeping_the_oldest_and_records_each_rename(
    tmp_path,
):
    db = open_database(f"sqlite:///{tmp_path}/names.db")
    check_duplicate_names_are_renamed_by_the_upgrade(db)
    db.close()


def test_a_long_duplicate_name_is_cut_to_fit_its_suffix(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/long.db")
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0014_job_group_key")
        for instance_id, minute in (("a", 0), ("b", 1)):
            _old_instance(db, instance_id, "t1", "x" * 200, minute)
    upgrade(db)
    with db.connection_context():
        assert (
            db.execute_sql("SELECT name FROM instance WHERE id = 'b'").fetchone()[0]
            == "x" * 198 + "-2"
        )
    db.close()


def test_upgrading_to_0016_keeps_fleets_and_gives_them_the_isolation_defaults(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/isolation.db")
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0015_instance_names")
        db.execute_sql(
            "INSERT INTO fleet (name, description, labels, created_at) "
            "VALUES ('gpu-a', 'kept', '{}', '2026-01-01 00:00:00')"
        )
        db.execute_sql(
            "INSERT INTO join_token (id, fleet, token_hash, description, created_at, expires_at, "
            "uses, revoked, created_by) VALUES ('j', 'gpu-a', 'h', '', '2026-01-01', '2027-01-01', "
            "0, 0, '')"
        )
    assert "0016_tenant_isolation" in upgrade(db)
    bind(db)
    with database.connection_context():
        fleet = Fleet.get_by_id("gpu-a")
        assert (
            fleet.description,
            fleet.allow_root_tasks,
            fleet.require_isolation,
            fleet.allowed_images,
        ) == ("kept", False, False, ["*"])
        assert (
            db.execute_sql("SELECT COUNT(*) FROM join_token").fetchone()[0] == 1
        )  # nothing cascaded

        def version():
            return db.execute_sql("SELECT version FROM inventory_version").fetchone()[0]

        Node.create(
            id="n", fleet="gpu-a", machine_id="m", hostname="h", status="ready", registered_at=T0
        )
        before = version()
        db.execute_sql("""UPDATE node SET capabilities = '{"isolation": "uid"}' WHERE id = 'n'""")
        assert version() == before + 1  # placement reads a node's capabilities
        db.execute_sql("UPDATE fleet SET require_isolation = 1 WHERE name = 'gpu-a'")
        assert version() == before + 2  # and a fleet's isolation rule
        db.execute_sql("""UPDATE fleet SET allowed_images = '["a/*"]' WHERE name = 'gpu-a'""")
        assert version() == before + 3  # and the images its nodes may run
        db.execute_sql("UPDATE fleet SET description = 'other' WHERE name = 'gpu-a'")
        assert version() == before + 3  # not what placement does not read
    db.close()


def check_0017_gives_artifact_names_to_their_uploader_and_renames_ambiguous_token_names(db):
    """Build a database at 0016 with an artifact two tokens uploaded and ambiguous token names,
    upgrade it, check what 0017 did. Shared with the PostgreSQL test
    (tests/integration/test_postgres.py)."""
    p = db.param
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0016_tenant_isolation")
        tokens = [
            ("t1", "alice", "00:01", None, None),
            ("t2", "alice", "00:02", None, None),
            ("t3", "alice", "00:03", "00:04", None),  # revoked: keeps its name
            ("t4", "x\nnode:n1", "00:05", None, None),
            ("t5", "alice-2", "00:06", None, None),
            ("t6", "ops", "00:07", None, "00:08"),  # expired: keeps its name
            ("t7", "ops", "00:09", None, None),
        ]
        for token_id, name, created, revoked, expires in tokens:
            db.execute_sql(
                f"INSERT INTO api_token (id, name, role, token_hash, created_at, revoked_at, "
                f"expires_at) VALUES ({p}, {p}, 'submitter', {p}, {p}, {p}, {p})",
                (
                    token_id,
                    name,
                    "h" + token_id,
                    *(f"2026-01-01 00:{t}" if t else None for t in (created, revoked, expires)),
                ),
            )
        db.execute_sql(
            "INSERT INTO artifact (sha256, name, kind, size, created_at, created_by) "
            "VALUES ('s1', 'bob-plan.bin', 'model', 3, '2026-01-01 00:00:00', 'token:bob')"
        )
        for token_id, at in (("bob", "2026-01-01 00:00:00"), ("alice", "2026-01-01 00:00:05")):
            db.execute_sql(
                f"INSERT INTO artifact_upload (sha256, token_id, uploaded_at) VALUES ('s1', {p}, "
                f"{p})",
                (token_id, at),
            )
    assert "0017_owner_records_and_actors" in upgrade(db)
    with db.connection_context():
        names = dict(db.execute_sql("SELECT id, name FROM api_token").fetchall())
        # The oldest live holder keeps a name; alice-2 is taken by a live token, so t2 gets -3.
        assert names == {
            "t1": "alice",
            "t2": "alice-3",
            "t3": "alice",
            "t4": "x node:n1",
            "t5": "alice-2",
            "t6": "ops",
            "t7": "ops",
        }
        renamed = db.execute_sql(
            "SELECT subject_id, reason, actor FROM event WHERE kind = 'token.renamed' "
            "ORDER BY subject_id"
        ).fetchall()
        assert [(r[0], r[2]) for r in renamed] == [("t2", "fleetd"), ("t4", "fleetd")]
        assert "'alice' to 'alice-3'" in renamed[0][1]
        # Bob made the artifact: his name and kind stay his; alice's own name was never kept.
        uploads = db.execute_sql(
            "SELECT token_id, name, kind FROM artifact_upload ORDER BY token_id"
        ).fetchall()
        assert uploads == [("alice", "s1", ""), ("bob", "bob-plan.bin", "model")]
        assert db.execute_sql("SELECT sha256, size FROM artifact").fetchall() == [("s1", 3)]


def test_0017_gives_artifact_names_to_their_uploader_and_renames_ambiguous_token_names(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/old.db")
    check_0017_gives_artifact_names_to_their_uploader_and_renames_ambiguous_token_names(db)
    db.close()


def test_0026_fills_the_workload_sums_from_the_ledger_spread_over_the_days_of_each_run(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/usage.db")
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0025_rollouts")
        db.execute_sql(
            "INSERT INTO usage_record (id, kind, workload_id, workload_name, task_id, job_id, "
            "owner, owner_token_id, team, fleet, node_id, gpu_model, rank, attempt, "
            "priority_class, gpus, gpu_uuids, started_at, ended_at, accounted_until, gpu_seconds, "
            "used_gpu_seconds, sampled_gpu_seconds, cost) VALUES ('t.1', 'job', 'j', 'train', 't', "
            "'j', 'alice', 'tok', 'ml', 'gpu-a', 'n', '', 0, 1, 'on-demand', 1.0, '[]', "
            "'2026-01-01 23:00:00', '2026-01-02 01:00:00', '2026-01-02 01:00:00', 7200, 3600, "
            "7200, 4.0)"
        )
        db.execute_sql(  # an instance's volume, still accruing: to where the ledger got
            "INSERT INTO storage_record (id, owner, owner_token_id, team, fleet, volume_bytes, "
            "started_at, accounted_until, cost) VALUES ('i', 'bob', 'tok2', '', 'gpu-a', 1, "
            "'2026-01-31 12:00:00', '2026-02-01 12:00:00', 2.0)"
        )
    assert "0026_usage_by_workload" in upgrade(db)
    with db.connection_context():
        days = db.execute_sql(
            "SELECT day, kind, workload_id, fleet, team, owner, gpu_seconds, used_gpu_seconds, "
            "cost, runs FROM usage_workload_day ORDER BY workload_id, day"
        ).fetchall()
        assert [(str(d[0]), *d[1:]) for d in days] == [
            ("2026-01-31", "instance", "i", "gpu-a", "", "bob", 0.0, 0.0, 1.0, 0),
            ("2026-02-01", "instance", "i", "gpu-a", "", "bob", 0.0, 0.0, 1.0, 0),
            ("2026-01-01", "job", "j", "gpu-a", "ml", "alice", 3600.0, 1800.0, 2.0, 1),
            ("2026-01-02", "job", "j", "gpu-a", "ml", "alice", 3600.0, 1800.0, 2.0, 0),
        ]
        months = db.execute_sql(
            "SELECT month, workload_id, gpu_seconds, cost, runs FROM usage_workload_month "
            "ORDER BY workload_id, month"
        ).fetchall()
        assert [(str(m[0]), *m[1:]) for m in months] == [
            ("2026-01-01", "i", 0.0, 1.0, 0),
            ("2026-02-01", "i", 0.0, 1.0, 0),
            ("2026-01-01", "j", 7200.0, 4.0, 1),
        ]
    db.close()


def test_0029_counts_the_spec_bytes_each_owner_already_stores(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/specs.db")
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up(
            "0027_inventory_triggers_deferred"
        )
        for job_id, owner, spec in (
            ("j1", "tok", '{"a": "xx"}'),
            ("j2", "tok", '{"b": 1}'),
            ("j3", "tok2", "{}"),
        ):
            db.execute_sql(
                "INSERT INTO job (id, name, owner, owner_token_id, state, pending_reason, attempt, "
                "max_attempts, num_nodes, priority_class, spec, outcome_reason, submitted_at) "
                "VALUES (?, 'j', 'alice', ?, 'cancelled', '', 1, 1, 1, 'on-demand', ?, '', "
                "'2026-01-01 00:00:00')",
                (job_id, owner, spec),
            )
        db.execute_sql(
            "INSERT INTO instance (id, name, owner, owner_token_id, state, status_reason, "
            "desired_state, spec, runs, ports, created_at, cost_accrued) VALUES ('i1', 'nb', "
            "'alice', 'tok', 'deleted', '', 'stopped', '{\"c\": [1, 2]}', 1, '[]', '2026-01-01 "
            "00:00:00', 0)"
        )
    assert "0029_owner_spec_bytes" in upgrade(db)
    with db.connection_context():
        counted = dict(db.execute_sql("SELECT token_id, bytes FROM owner_spec_bytes").fetchall())
    assert counted == {
        "tok": len('{"a": "xx"}') + len('{"b": 1}') + len('{"c": [1, 2]}'),
        "tok2": 2,
    }
    db.close()


def test_0031_makes_a_user_of_each_token_name_and_a_project_of_each_team(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/people.db")
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0030_usage_mark_task")
        for token_id, name, role, team, created, revoked in (
            ("t1", "alice", "submitter", "ML Research", "00:01", "00:02"),  # revoked, older
            ("t2", "alice", "submitter", "ML Research", "00:03", None),
            ("t3", "CI bot", "admin", None, "00:04", None),
        ):
            db.execute_sql(
                "INSERT INTO api_token (id, name, role, team, token_hash, created_at, revoked_at, "
                "limits) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    token_id,
                    name,
                    role,
                    team,
                    "h" + token_id,
                    f"2026-01-01 00:{created}",
                    f"2026-01-01 00:{revoked}" if revoked else None,
                    '{"max_active_jobs": 3}' if token_id == "t2" else None,
                ),
            )
        for job_id, owner, team in (
            ("j1", "t1", "ML Research"),
            ("j2", "t2", "ML Research"),
            ("j3", "t3", None),
        ):
            db.execute_sql(
                "INSERT INTO job (id, name, owner, owner_token_id, team, state, pending_reason, "
                "attempt, max_attempts, num_nodes, priority_class, spec, outcome_reason, "
                "submitted_at) VALUES (?, 'j', 'x', ?, ?, 'queued', '', 1, 1, 1, 'on-demand', "
                "'{}', '', '2026-01-01 00:00:00')",
                (job_id, owner, team),
            )
        for inst_id, owner in (
            ("i1", "t1"),
            ("i2", "t2"),
        ):  # the same live name: the older token's is renamed
            db.execute_sql(
                "INSERT INTO instance (id, name, owner, owner_token_id, team, state, "
                "status_reason, desired_state, spec, runs, ports, created_at, cost_accrued) VALUES "
                "(?, 'nb', 'alice', ?, 'ML Research', 'stopped', '', 'stopped', '{}', 1, '[]', "
                "'2026-01-01 00:00:00', 0)",
                (inst_id, owner),
            )
    assert "0031_people_and_projects" in upgrade(db)
    with db.connection_context():
        users = db.execute_sql(
            "SELECT id, login, display_name, role, team, default_project, limits, source "
            "FROM user ORDER BY id"
        ).fetchall()
        assert users == [
            (
                "t2",
                "alice",
                "alice",
                "submitter",
                "ML Research",
                "ml-research",
                '{"max_active_jobs": 3}',
                "token",
            ),
            ("t3", "ci-bot", "CI bot", "admin", None, "default", None, "token"),
        ]
        assert db.execute_sql("SELECT key, name, team FROM project ORDER BY key").fetchall() == [
            ("default", "default", None),
            ("ml-research", "ML Research", "ML Research"),
        ]
        assert db.execute_sql(
            "SELECT project, user_id, role FROM project_member ORDER BY user_id"
        ).fetchall() == [("ml-research", "t2", "member"), ("default", "t3", "member")]
        assert dict(db.execute_sql("SELECT id, user_id FROM api_token").fetchall()) == {
            "t1": "t2",
            "t2": "t2",
            "t3": "t3",
        }
        assert db.execute_sql(
            "SELECT id, owner_token_id, project, user_login FROM job ORDER BY id"
        ).fetchall() == [
            ("j1", "t2", "ml-research", "alice"),
            ("j2", "t2", "ml-research", "alice"),
            ("j3", "t3", "default", "ci-bot"),
        ]
        assert db.execute_sql(
            "SELECT id, owner_token_id, name, project FROM instance ORDER BY id"
        ).fetchall() == [("i1", "t2", "nb-i1", "ml-research"), ("i2", "t2", "nb", "ml-research")]
    db.close()


def test_0033_adds_share_links_and_feeds_to_a_live_database_and_goes_down_cleanly(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/feeds.db")
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0031_people_and_projects")
        db.execute_sql(
            "INSERT INTO job (id, name, owner, owner_token_id, state, pending_reason, attempt, "
            "max_attempts, num_nodes, priority_class, spec, outcome_reason, submitted_at) "
            "VALUES ('j1', 'train', 'alice', 't1', 'succeeded', '', 1, 1, 1, 'on-demand', '{}', "
            "'', '2026-01-01 00:00:00')"
        )
    assert "0033_shares_and_notifications" in upgrade(db)
    with db.connection_context():
        assert db.execute_sql("SELECT COUNT(*) FROM share").fetchone() == (0,)
        assert db.execute_sql("SELECT COUNT(*) FROM notification").fetchone() == (0,)
        db.execute_sql(
            "INSERT INTO share (id, token_hash, job_id, created_by, created_at) "
            "VALUES ('s1', 'h', 'j1', 'user:alice', '2026-01-01 00:00:00')"
        )
        with pytest.raises(peewee.IntegrityError):  # one row per token
            db.execute_sql(
                "INSERT INTO share (id, token_hash, job_id, created_by, created_at) "
                "VALUES ('s2', 'h', 'j1', 'user:alice', '2026-01-01 00:00:00')"
            )
        db.execute_sql(
            "INSERT INTO notification (owner_id, at, kind, subject_kind, subject_id, subject_name, "
            "text, read) VALUES ('t1', '2026-01-01 00:00:00', 'job.succeeded', 'job', 'j1', "
            "'train', 'job train succeeded', 0)"
        )
        indexes = {row[1] for row in db.execute_sql("PRAGMA index_list(notification)")}
        assert "notification_owner_id_id" in indexes
        assert db.execute_sql("SELECT id, state FROM job").fetchall() == [("j1", "succeeded")]
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").down(
            "0033_shares_and_notifications"
        )
        tables = set(db.get_tables())
        assert not {"share", "notification"} & tables and "job" in tables
    assert "0033_shares_and_notifications" in upgrade(db)  # and up again (with what follows it)
    db.close()


def test_0036_names_the_project_of_past_usage_and_going_down_keeps_the_sums(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/usage.db")
    day = (
        "INSERT INTO usage_day (day, kind, team, owner_token_id, owner, fleet, gpu_model, "
        "gpu_seconds, used_gpu_seconds, sampled_gpu_seconds, cost, runs) VALUES "
    )
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0034_task_identity")
        db.execute_sql(
            "INSERT INTO project (key, name, display_name, team, description, created_at) "
            "VALUES ('ml', 'ml', 'ml', 'ml', '', '2026-01-01 00:00:00')"
        )
        db.execute_sql(
            "INSERT INTO job (id, name, owner, owner_token_id, state, pending_reason, attempt, "
            "max_attempts, num_nodes, priority_class, spec, outcome_reason, submitted_at, project) "
            "VALUES ('j1', 'train', 'alice', 't1', 'succeeded', '', 1, 1, 1, 'on-demand', '{}', "
            "'', '2026-01-01 00:00:00', 'vision')"
        )
        db.execute_sql(
            "INSERT INTO usage_record (id, kind, workload_id, workload_name, task_id, job_id, "
            "rank, attempt, owner, owner_token_id, team, fleet, node_id, gpu_model, "
            "priority_class, gpus, gpu_uuids, started_at, accounted_until, gpu_seconds, "
            "used_gpu_seconds, sampled_gpu_seconds, cost) VALUES ('k1.1', 'job', 'j1', 'train', "
            "'k1', 'j1', 0, 1, 'alice', 't1', 'ml', 'a', 'n1', 'H100', 'on-demand', 1, '[]', "
            "'2026-01-01 00:00:00', '2026-01-01 01:00:00', 3600, 0, 0, 2)"
        )
        db.execute_sql(
            day + "('2026-01-01', 'job', 'ml', 't1', 'alice', 'a', 'H100', 3600, 0, 0, 2, 1)"
        )
        db.execute_sql(day + "('2026-01-01', 'job', '', 't2', 'bot', 'a', 'H100', 60, 0, 0, 1, 1)")
    assert "0036_usage_by_project" in upgrade(db)
    with db.connection_context():
        assert db.execute_sql("SELECT project FROM usage_record").fetchall() == [("vision",)]
        assert db.execute_sql("SELECT team, project FROM usage_day ORDER BY team").fetchall() == [
            ("", "default"),
            ("ml", "ml"),
        ]
        # Two projects of one team on one day: two rows now, one again after going down.
        db.execute_sql(
            day.replace("team,", "team, project,")
            + "('2026-01-01', 'job', 'ml', 'vision', 't1', 'alice', 'a', 'H100', 60, 0, 0, 3, 1)"
        )
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").down("0036_usage_by_project")
        assert db.execute_sql(
            "SELECT team, gpu_seconds, cost, runs FROM usage_day ORDER BY team"
        ).fetchall() == [("", 60.0, 1.0, 1), ("ml", 3660.0, 5.0, 2)]
    db.close()


def test_0043_keeps_a_nodes_topology_watched_by_the_inventory_and_goes_down_cleanly(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/topology.db")
    assert "0043_node_topology" in upgrade(db)
    bind(db)

    def version():
        return db.execute_sql("SELECT version FROM inventory_version").fetchone()[0]

    with database.connection_context():
        Fleet.create(name="f", created_at=T0)
        Node.create(
            id="n", fleet="f", machine_id="m", hostname="h", status="ready", registered_at=T0
        )
        assert Node.get_by_id("n").topology is None
        before = version()
        Node.update(topology={"gpus": []}).where(Node.id == "n").execute()
        assert version() == before + 1  # placement reads it: the scheduler reads the node again
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").down("0043_node_topology")
        columns = {column.name for column in db.get_columns("node")}
        assert "topology" not in columns and "capabilities" in columns
        before = version()
        db.execute_sql("UPDATE node SET status = 'cordoned' WHERE id = 'n'")
        assert version() == before + 1  # the trigger still watches what it watched before
    # going down from 0043 takes the later migrations down too; they come back up after it
    assert upgrade(db)[0] == "0043_node_topology"
    db.close()


def test_0045_keeps_a_fleets_network_topology_watched_and_goes_down_cleanly(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/network.db")
    assert "0045_fleet_network_topology" in upgrade(db)
    bind(db)

    def version():
        return db.execute_sql("SELECT version FROM inventory_version").fetchone()[0]

    with database.connection_context():
        Fleet.create(name="f", created_at=T0)
        assert Fleet.get_by_id("f").network_topology is None
        before = version()
        Fleet.update(network_topology="BlockName=b Nodes=n1").where(Fleet.name == "f").execute()
        assert version() == before + 1  # placement reads it: the scheduler reads the fleets again
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").down(
            "0045_fleet_network_topology"
        )
        assert "network_topology" not in {c.name for c in db.get_columns("fleet")}
        before = version()
        db.execute_sql("UPDATE fleet SET labels = '{}' WHERE name = 'f'")
        assert version() == before + 1  # the trigger still watches what it watched before
    # going down from 0045 takes the later migrations down too; they come back up after it
    assert upgrade(db)[0] == "0045_fleet_network_topology"
    db.close()


def test_0046_adds_mig_columns_the_inventory_watches_and_goes_down_cleanly(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/mig.db")
    assert "0046_mig" in upgrade(db)
    bind(db)

    def version():
        return db.execute_sql("SELECT version FROM inventory_version").fetchone()[0]

    with database.connection_context():
        Fleet.create(name="f", created_at=T0)
        assert Fleet.get_by_id("f").mig is None
        before = version()
        Fleet.update(mig={"mode": "off"}).where(Fleet.name == "f").execute()
        assert version() == before + 1  # placement reads it: the scheduler reads the fleets again
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").down("0046_mig")
        assert "mig" not in {column.name for column in db.get_columns("fleet")}
        assert "mig_devices" not in {column.name for column in db.get_columns("gpu")}
        before = version()
        db.execute_sql("UPDATE fleet SET labels = '{}' WHERE name = 'f'")
        assert version() == before + 1  # the trigger still watches what it watched before
    assert upgrade(db)[0] == "0046_mig"
    db.close()


def test_0047_adds_dynamic_mig_columns_to_gpus_and_goes_down_cleanly(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/dynamic.db")
    assert "0047_dynamic_mig" in upgrade(db)
    columns = {column.name for column in db.get_columns("gpu")}
    assert {"mig_target", "mig_changed_at", "mig_blocked"} <= columns
    Runner(db, MIGRATIONS_DIR, table_name="schema_migration").down("0047_dynamic_mig")
    columns = {column.name for column in db.get_columns("gpu")}
    assert not {"mig_target", "mig_changed_at", "mig_blocked"} & columns
    assert "mig_devices" in columns
    assert upgrade(db)[0] == "0047_dynamic_mig"
    db.close()


def test_0048_counts_a_groups_told_jobs_from_an_index_and_goes_down_cleanly(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/told.db")
    assert "0048_job_queue_told" in upgrade(db)

    def indexes():
        return {index.name: index.columns for index in db.get_indexes("job")}

    assert indexes()["job_state_group_key_pending_reason_id"] == [
        "state",
        "group_key",
        "pending_reason",
        "id",
    ]
    assert "job_state_group_key_id" not in indexes()
    plan = db.execute_sql(
        "EXPLAIN QUERY PLAN SELECT group_key, COUNT(id), MIN(id) FROM job WHERE state = ? "
        "AND group_key IS NOT NULL AND (group_key, pending_reason) IN (VALUES (?, ?)) "
        "GROUP BY group_key",
        ("queued", "k", "why"),
    ).fetchall()
    assert any("COVERING INDEX job_state_group_key_pending_reason_id" in row[-1] for row in plan)
    Runner(db, MIGRATIONS_DIR, table_name="schema_migration").down("0048_job_queue_told")
    assert "job_state_group_key_pending_reason_id" not in indexes()
    assert indexes()["job_state_group_key_id"] == ["state", "group_key", "id"]
    assert upgrade(db)[0] == "0048_job_queue_told"
    db.close()


def test_0050_tells_the_active_tasks_from_an_index_and_goes_down_cleanly(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/holds.db")
    assert "0050_task_state_id_epoch" in upgrade(db)

    def indexes():
        return {index.name: index.columns for index in db.get_indexes("task")}

    assert indexes()["task_state_id_epoch"] == ["state", "id", "epoch"]
    assert "task_state" not in indexes()
    plan = db.execute_sql(
        "EXPLAIN QUERY PLAN SELECT id, epoch, state FROM task WHERE state IN (?, ?)",
        ("assigned", "running"),
    ).fetchall()
    assert any("COVERING INDEX task_state_id_epoch" in row[-1] for row in plan)
    Runner(db, MIGRATIONS_DIR, table_name="schema_migration").down("0050_task_state_id_epoch")
    assert "task_state_id_epoch" not in indexes()
    assert indexes()["task_state"] == ["state"]
    assert upgrade(db)[0] == "0050_task_state_id_epoch"
    db.close()
