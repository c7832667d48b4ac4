"""Whom a fleet's tasks run as (issue 45): `fleet.task_identity`, "dynamic" (a uid fleetd allocates
per owner, as before), "nss" (the owner's own account, as each node resolves its login) or "claims"
(the uid, gid and groups of the identity provider's claims). Placement reads it (a node of an nss
fleet takes only the work of owners whose account resolves there), so the fleet trigger watches it
too. The column is added with its default in the database itself: on SQLite the migrator would
otherwise rebuild the fleet table, which drops its triggers."""
from peewee import *

from fleetd.inventory_columns import watched

BUMP = "UPDATE inventory_version SET version = version + 1 WHERE id = 1"


def _trigger(db, columns):
    if isinstance(db, PostgresqlDatabase):  # as migration 0027 made it: deferred to commit
        db.execute_sql("DROP TRIGGER fleet_inventory ON fleet")
        db.execute_sql(f"CREATE CONSTRAINT TRIGGER fleet_inventory AFTER INSERT OR DELETE OR UPDATE OF {columns} "
                       f"ON fleet DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION bump_inventory_version()")
        return
    db.execute_sql("DROP TRIGGER IF EXISTS fleet_inventory_update")
    db.execute_sql(f"CREATE TRIGGER fleet_inventory_update AFTER UPDATE OF {columns} ON fleet BEGIN {BUMP}; END")


def up(migrator, db):
    db.execute_sql("ALTER TABLE fleet ADD COLUMN task_identity VARCHAR(8) NOT NULL DEFAULT 'dynamic'")
    _trigger(db, watched("fleet", 34))


def down(migrator, db):
    _trigger(db, watched("fleet", 33))
    migrator.migrate(migrator.drop_column('fleet', 'task_identity'))
