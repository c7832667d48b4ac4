"""Numbered migrations: a fresh database ends up exactly like the models, and upgrades keep data."""

import subprocess
import sys

from playhouse.migrations import Runner

from fleetd.db import MIGRATIONS_DIR, open_database, pending_migrations, upgrade


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
