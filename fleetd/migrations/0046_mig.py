"""MIG as a resource (issue 50): `gpu.mig_devices`, a MIG-enabled GPU's slices as its agent reports
them ([{uuid, memory_total_bytes, profile, start, size}], null without MIG), and `fleet.mig`, the
fleet's MIG setting ({mode: off | fixed | dynamic, layout?: {model: [profile...]}}; null: fixed,
the slices as found). Placement reads both: every GPU column is watched already, and the fleet
trigger now watches `mig` too. Plain ADD/DROP COLUMN, as 0038 (the SQLite migrator's table rebuild
would drop the tables' triggers); going down, the trigger is put back first: SQLite refuses to drop
a column a trigger names."""
from peewee import *

from fleetd.inventory_columns import watched

BUMP = "UPDATE inventory_version SET version = version + 1 WHERE id = 1"


def _trigger(db, columns):
    """Re-create the fleet update trigger of the inventory version over these columns."""
    if isinstance(db, PostgresqlDatabase):  # as migration 0027 made it: deferred to commit
        db.execute_sql("DROP TRIGGER fleet_inventory ON fleet")
        db.execute_sql(f"CREATE CONSTRAINT TRIGGER fleet_inventory AFTER INSERT OR DELETE OR UPDATE OF {columns} "
                       f"ON fleet DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION bump_inventory_version()")
        return
    db.execute_sql("DROP TRIGGER IF EXISTS fleet_inventory_update")
    db.execute_sql(f"CREATE TRIGGER fleet_inventory_update AFTER UPDATE OF {columns} ON fleet BEGIN {BUMP}; END")


def up(migrator, db):
    db.execute_sql('ALTER TABLE gpu ADD COLUMN mig_devices TEXT')
    db.execute_sql('ALTER TABLE fleet ADD COLUMN mig TEXT')
    _trigger(db, watched("fleet", 46))


def down(migrator, db):
    _trigger(db, watched("fleet", 45))
    db.execute_sql('ALTER TABLE fleet DROP COLUMN mig')
    db.execute_sql('ALTER TABLE gpu DROP COLUMN mig_devices')
