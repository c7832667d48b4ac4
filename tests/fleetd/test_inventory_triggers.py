"""The inventory triggers watch exactly the columns fleetd.inventory_columns names, and every node
and fleet column is either watched or said not to matter to placement."""

import datetime as dt
import re

import pytest

from fleetd.db import bind, database, open_database
from fleetd.inventory_columns import NOT_WATCHED, WATCHED, watched
from fleetd.models import Fleet, Node

NOW = dt.datetime(2026, 1, 1)


@pytest.mark.parametrize("model", [Node, Fleet])
def test_every_column_is_watched_or_said_not_to_matter(model):
    table = model._meta.table_name
    columns = {field.column_name for field in model._meta.sorted_fields}
    current = set(watched(table).split(", "))
    assert not current & set(NOT_WATCHED[table]), "a column is both watched and not"
    assert columns == current | set(NOT_WATCHED[table]), (
        f"decide for {sorted(columns - current - set(NOT_WATCHED[table]))} (watched, with a "
        f"migration, or not and why); drop {sorted((current | set(NOT_WATCHED[table])) - columns)}"
    )


def test_the_migrated_database_watches_the_current_columns(migrated_sqlite):
    db = open_database(f"sqlite:///{migrated_sqlite}")
    try:
        sql = dict(
            db.execute_sql("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall()
        )
    finally:
        db.close_all()
    for table in WATCHED:
        found = re.search(r"AFTER UPDATE OF (.*?) ON " + table, sql[f"{table}_inventory_update"])
        assert found and found.group(1) == watched(table)
        assert {f"{table}_inventory_insert", f"{table}_inventory_delete"} <= set(sql)


def test_a_watched_column_bumps_the_inventory_and_another_does_not(migrated_sqlite, tmp_path):
    path = tmp_path / "fleetd.db"
    path.write_bytes(migrated_sqlite.read_bytes())
    db = open_database(f"sqlite:///{path}")
    try:

        def version():
            return db.execute_sql("SELECT version FROM inventory_version WHERE id = 1").fetchone()[
                0
            ]

        bind(db)  # what create_app does
        with database.connection_context():
            Fleet.create(name="f", created_at=NOW)
            Node.create(
                id="n1",
                fleet="f",
                machine_id="m",
                hostname="h",
                status="ready",
                registered_at=NOW,
                agent_version="1",
                cpu_count=4,
                memory_bytes=1,
            )
        start = version()
        db.execute_sql(
            "UPDATE node SET last_heartbeat_at = '2026-01-02', drain_reason = 'x' WHERE id = 'n1'"
        )
        db.execute_sql("UPDATE fleet SET description = 'd' WHERE name = 'f'")
        assert version() == start
        db.execute_sql("UPDATE node SET status = 'cordoned' WHERE id = 'n1'")
        assert version() == start + 1
        assert (
            db.execute_sql("SELECT version FROM inventory_change WHERE node_id = 'n1'").fetchone()[
                0
            ]
            == start + 1
        )
        db.execute_sql("UPDATE fleet SET require_isolation = 1 WHERE name = 'f'")
        assert version() == start + 2
    finally:
        db.close_all()


def test_a_migration_before_the_first_trigger_has_no_columns():
    with pytest.raises(ValueError):
        watched("node", 5)
    assert watched("node", 15) == watched("node", 7) != watched("node", 16)
