"""Which nodes changed at which inventory version: the node and GPU triggers that bump the
inventory version (migrations 0006, 0007, 0012) also note the node in `inventory_change`, so the
scheduler reads again only the nodes that changed since the inventory it holds, not all of them.
Fleet changes still only bump the version (fleets are few and read again in full)."""
from peewee import *

from fleetd.inventory_columns import watched

NODE_COLUMNS = watched("node", 13)
BUMP = "UPDATE inventory_version SET version = version + 1 WHERE id = 1"


def _note(node):
    """SQLite: record `node` (NEW.id, OLD.node, ...) as changed at the version just bumped to."""
    return (f"INSERT INTO inventory_change (node_id, version) SELECT {node}, version FROM inventory_version "  # nosec B608  # `node` is the migration's own NEW.id or OLD.node
            f"WHERE id = 1 ON CONFLICT (node_id) DO UPDATE SET version = excluded.version")


# SQLite: (trigger name, event, the node ids it notes)
SQLITE_TRIGGERS = (
    ("node_inventory_insert", "INSERT ON node", ("NEW.id",)),
    ("node_inventory_delete", "DELETE ON node", ("OLD.id",)),
    ("node_inventory_update", f"UPDATE OF {NODE_COLUMNS} ON node", ("NEW.id",)),
    ("gpu_inventory_insert", "INSERT ON gpu", ("NEW.node",)),
    ("gpu_inventory_delete", "DELETE ON gpu", ("OLD.node",)),
    ("gpu_inventory_update", "UPDATE ON gpu", ("OLD.node", "NEW.node")),
)

PG_FUNCTION = """CREATE FUNCTION note_inventory_change() RETURNS trigger AS $$
DECLARE
    v BIGINT;
    changed TEXT;
BEGIN
    UPDATE inventory_version SET version = version + 1 WHERE id = 1 RETURNING version INTO v;
    IF TG_TABLE_NAME = 'node' THEN
        changed := CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END;
    ELSE
        changed := CASE WHEN TG_OP = 'DELETE' THEN OLD.node ELSE NEW.node END;
        IF TG_OP = 'UPDATE' AND OLD.node IS DISTINCT FROM NEW.node THEN
            INSERT INTO inventory_change (node_id, version) VALUES (OLD.node, v)
                ON CONFLICT (node_id) DO UPDATE SET version = excluded.version;
        END IF;
    END IF;
    INSERT INTO inventory_change (node_id, version) VALUES (changed, v)
        ON CONFLICT (node_id) DO UPDATE SET version = excluded.version;
    RETURN NULL;
END $$ LANGUAGE plpgsql"""


def up(migrator, db):
    class InventoryChange(Model):
        node_id = CharField(primary_key=True, max_length=32)
        version = BigIntegerField(index=True)

        class Meta:
            database = db
            table_name = 'inventory_change'

    db.create_tables([InventoryChange])
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql(PG_FUNCTION)
        for table, update in (("node", f"UPDATE OF {NODE_COLUMNS}"), ("gpu", "UPDATE")):
            db.execute_sql(f"DROP TRIGGER {table}_inventory ON {table}")
            db.execute_sql(f"CREATE TRIGGER {table}_inventory AFTER INSERT OR DELETE OR {update} ON {table} "
                           f"FOR EACH ROW EXECUTE FUNCTION note_inventory_change()")
    else:
        for name, event, nodes in SQLITE_TRIGGERS:
            db.execute_sql(f"DROP TRIGGER IF EXISTS {name}")
            body = "; ".join([BUMP] + [_note(node) for node in nodes])
            db.execute_sql(f"CREATE TRIGGER {name} AFTER {event} BEGIN {body}; END")
    db.execute_sql(BUMP)  # an inventory read before this has no changes to follow: read in full


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        for table, update in (("node", f"UPDATE OF {NODE_COLUMNS}"), ("gpu", "UPDATE")):
            db.execute_sql(f"DROP TRIGGER {table}_inventory ON {table}")
            db.execute_sql(f"CREATE TRIGGER {table}_inventory AFTER INSERT OR DELETE OR {update} ON {table} "
                           f"FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()")
        db.execute_sql("DROP FUNCTION note_inventory_change()")
    else:
        for name, event, _ in SQLITE_TRIGGERS:
            db.execute_sql(f"DROP TRIGGER IF EXISTS {name}")
            db.execute_sql(f"CREATE TRIGGER {name} AFTER {event} BEGIN {BUMP}; END")
    migrator.migrate(migrator.drop_table('inventory_change'))
