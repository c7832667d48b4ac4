"""A node's GPU topology (issue 50): `node.topology`, {gpus, links, nvlink_count, nics} as its agent
reported it at registration (fleetwire.topology); null for an agent that reported none. Placement
reads it (the link class of each GPU pair), so the node trigger watches it too. Plain ADD/DROP
COLUMN, as 0038 (the SQLite migrator's table rebuild would drop the node table's triggers); going
down, the trigger is put back first: SQLite refuses to drop a column a trigger names."""
from peewee import *

from fleetd.inventory_columns import watched

BUMP = "UPDATE inventory_version SET version = version + 1 WHERE id = 1"
NOTE = ("INSERT INTO inventory_change (node_id, version) SELECT NEW.id, version FROM inventory_version "
        "WHERE id = 1 ON CONFLICT (node_id) DO UPDATE SET version = excluded.version")


def _trigger(db, columns):
    """Re-create the node update trigger of the inventory version over these columns."""
    if isinstance(db, PostgresqlDatabase):  # as migration 0027 made it: deferred to commit
        db.execute_sql("DROP TRIGGER node_inventory ON node")
        db.execute_sql(f"CREATE CONSTRAINT TRIGGER node_inventory AFTER INSERT OR DELETE OR UPDATE OF {columns} "
                       f"ON node DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION note_inventory_change()")
        return
    db.execute_sql("DROP TRIGGER IF EXISTS node_inventory_update")
    db.execute_sql(f"CREATE TRIGGER node_inventory_update AFTER UPDATE OF {columns} ON node "
                   f"BEGIN {BUMP}; {NOTE}; END")


def up(migrator, db):
    db.execute_sql('ALTER TABLE node ADD COLUMN topology TEXT')
    _trigger(db, watched("node", 43))


def down(migrator, db):
    _trigger(db, watched("node", 42))
    db.execute_sql('ALTER TABLE node DROP COLUMN topology')
