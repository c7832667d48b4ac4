"""Tenant isolation: the host user a token's tasks run as (`api_token.unix_user`), the uid fleetd
allocates per owner otherwise (`owner_uid`), what each task was delivered to run as (`task.run_as`),
a fleet's rules (`allow_root_tasks`, `require_isolation`, `allowed_images`) and what a node's agent
reported it can do (`node.capabilities`).

Placement reads a node's capabilities and a fleet's rules, so the inventory triggers (migrations
0006, 0013) watch those columns too. The fleet's NOT NULL columns are added with a default in the
database itself: on SQLite the migrator would otherwise rebuild the fleet table, which drops its
triggers and, with foreign keys on, empties what refers to it."""
from peewee import *

from fleetd.inventory_columns import watched

OLD_NODE_COLUMNS = watched("node", 15)
NODE_COLUMNS = watched("node", 16)
OLD_FLEET_COLUMNS = watched("fleet", 15)
FLEET_COLUMNS = watched("fleet", 16)
BUMP = "UPDATE inventory_version SET version = version + 1 WHERE id = 1"
NOTE = ("INSERT INTO inventory_change (node_id, version) SELECT NEW.id, version FROM inventory_version "
        "WHERE id = 1 ON CONFLICT (node_id) DO UPDATE SET version = excluded.version")


def _triggers(db, node_columns, fleet_columns):
    """Re-create the node and fleet update triggers of the inventory version over these columns."""
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql("DROP TRIGGER node_inventory ON node")
        db.execute_sql(f"CREATE TRIGGER node_inventory AFTER INSERT OR DELETE OR UPDATE OF {node_columns} ON node "
                       f"FOR EACH ROW EXECUTE FUNCTION note_inventory_change()")
        db.execute_sql("DROP TRIGGER fleet_inventory ON fleet")
        db.execute_sql(f"CREATE TRIGGER fleet_inventory AFTER INSERT OR DELETE OR UPDATE OF {fleet_columns} ON fleet "
                       f"FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()")
        return
    db.execute_sql("DROP TRIGGER IF EXISTS node_inventory_update")
    db.execute_sql(f"CREATE TRIGGER node_inventory_update AFTER UPDATE OF {node_columns} ON node "
                   f"BEGIN {BUMP}; {NOTE}; END")
    db.execute_sql("DROP TRIGGER IF EXISTS fleet_inventory_update")
    db.execute_sql(f"CREATE TRIGGER fleet_inventory_update AFTER UPDATE OF {fleet_columns} ON fleet BEGIN {BUMP}; END")


def up(migrator, db):
    class OwnerUid(Model):
        token_id = CharField(primary_key=True, max_length=32)
        uid = IntegerField(unique=True)
        allocated_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'owner_uid'

    db.create_tables([OwnerUid])
    false = "false" if isinstance(db, PostgresqlDatabase) else "0"
    boolean = "BOOLEAN" if isinstance(db, PostgresqlDatabase) else "INTEGER"
    for column in ("allow_root_tasks", "require_isolation"):
        db.execute_sql(f"ALTER TABLE fleet ADD COLUMN {column} {boolean} NOT NULL DEFAULT {false}")
    db.execute_sql("""ALTER TABLE fleet ADD COLUMN allowed_images TEXT NOT NULL DEFAULT '["*"]'""")
    migrator.migrate(
        migrator.add_column('api_token', 'unix_user', CharField(max_length=32, null=True)),
        migrator.add_column('node', 'capabilities', TextField(null=True)),
        migrator.add_column('task', 'run_as', TextField(null=True)),
    )
    _triggers(db, NODE_COLUMNS, FLEET_COLUMNS)


def down(migrator, db):
    _triggers(db, OLD_NODE_COLUMNS, OLD_FLEET_COLUMNS)
    migrator.migrate(
        migrator.drop_column('task', 'run_as'),
        migrator.drop_column('node', 'capabilities'),
        migrator.drop_column('api_token', 'unix_user'),
        migrator.drop_column('fleet', 'allowed_images'),
        migrator.drop_column('fleet', 'require_isolation'),
        migrator.drop_column('fleet', 'allow_root_tasks'),
    )
    migrator.migrate(migrator.drop_table('owner_uid'))
