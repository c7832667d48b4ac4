"""Where a fleet's nodes sit in the network (issue 50): `fleet.network_topology`, a topology file in
Slurm's tree or block form as an admin gave it (fleetd.scheduler.network_file); null, labels alone
place its nodes. Placement reads it (a gang's blocks), so the fleet trigger watches it too. Plain
ADD/DROP COLUMN, as 0043 (the SQLite migrator's table rebuild would drop the fleet table's
triggers); going down, the trigger is put back first: SQLite refuses to drop a column a trigger
names."""
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
    db.execute_sql("ALTER TABLE fleet ADD COLUMN network_topology TEXT")
    _trigger(db, watched("fleet", 45))


def down(migrator, db):
    _trigger(db, watched("fleet", 44))
    db.execute_sql("ALTER TABLE fleet DROP COLUMN network_topology")
