"""On SQLite, adding a NOT NULL column with a default (migrations 0010 and 0011) makes the
migrator rebuild the node table, which drops its triggers: the node triggers of migrations 0006
and 0007 (what bumps the inventory version when placement's view of a node changes) are made
again. PostgreSQL adds such columns in place and keeps its triggers."""
from peewee import *

from fleetd.inventory_columns import watched

NODE_COLUMNS = watched("node", 12)
BUMP = "UPDATE inventory_version SET version = version + 1 WHERE id = 1"


def up(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        return
    for event in ("INSERT", "DELETE", f"UPDATE OF {NODE_COLUMNS}"):
        name = f"node_inventory_{event.split()[0].lower()}"
        db.execute_sql(f"DROP TRIGGER IF EXISTS {name}")
        db.execute_sql(f"CREATE TRIGGER {name} AFTER {event} ON node BEGIN {BUMP}; END")
    db.execute_sql(BUMP)  # whatever was read while they were missing is read again


def down(migrator, db):
    pass  # the triggers belong to migrations 0006 and 0007
