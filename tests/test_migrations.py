"""Numbered migrations: a fresh database ends up exactly like the models, and upgrades keep data."""

import datetime
import subprocess
import sys

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
    out = subprocess.run([sys.executable, "-m", "playhouse.migrations", url, "diff", "-d", MIGRATIONS_DIR,
                          "-t", "schema_migration", "fleetd.models:MODELS"], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "schema matches models.", out.stdout + out.stderr


def test_upgrading_an_old_database_keeps_its_rows(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/old.db")
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0001_initial")
        db.execute_sql("INSERT INTO fleet (name, description, labels, created_at) "
                       "VALUES ('gpu-a', 'kept', '{}', '2026-01-01 00:00:00')")
    assert "0001_initial" not in upgrade(db) and pending_migrations(db) == []
    with db.connection_context():
        assert db.execute_sql("SELECT description, availability FROM fleet").fetchall() == [("kept", None)]
    db.close()


def test_the_inventory_triggers_survive_every_migration_on_sqlite(tmp_path):
    """A migration that rebuilds a table on SQLite drops its triggers; the inventory version must
    still move when placement's view of a node changes, and only then."""
    db = open_database(f"sqlite:///{tmp_path}/triggers.db")
    upgrade(db)
    bind(db)
    with database.connection_context():
        names = {row[0] for row in db.execute_sql("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert {f"{table}_inventory_{event}" for table in ("node", "gpu", "fleet")
                for event in ("insert", "delete", "update")} <= names

        def version():
            return db.execute_sql("SELECT version FROM inventory_version").fetchone()[0]

        Fleet.create(name="f", created_at=T0)
        Node.create(id="n", fleet="f", machine_id="m", hostname="h", status="pending", registered_at=T0)
        before = version()
        db.execute_sql("UPDATE node SET status = 'ready' WHERE id = 'n'")
        assert version() == before + 1
        db.execute_sql("UPDATE node SET last_heartbeat_at = '2026-01-01 00:00:01' WHERE id = 'n'")
        assert version() == before + 1  # what placement does not read moves nothing
    db.close()
