"""Instances: the instance table, the run (job) of an instance, and the container runtime a node
reports (placement reads it, so the node's inventory trigger watches it too)."""
from peewee import *

from fleetd.inventory_columns import watched

OLD_NODE_COLUMNS = watched("node", 6)
NODE_COLUMNS = watched("node", 7)


def up(migrator, db):
    class Instance(Model):
        id = CharField(primary_key=True, max_length=32)
        name = CharField(max_length=200)
        owner = CharField(max_length=200, index=True)
        owner_token_id = CharField(max_length=32)
        team = CharField(max_length=200, null=True)
        state = CharField(max_length=16, index=True)
        status_reason = TextField(default="")
        desired_state = CharField(max_length=16, default="running")
        interrupted_by = CharField(max_length=16, null=True)
        spec = TextField()
        run_id = CharField(max_length=32, null=True)
        runs = IntegerField(default=0)
        node_id = CharField(max_length=32, null=True, index=True)
        ports = TextField(default="[]")
        created_at = DateTimeField()
        started_at = DateTimeField(null=True)
        stopped_at = DateTimeField(null=True)
        price_per_hour = FloatField(null=True)
        running_since = DateTimeField(null=True)
        cost_accrued = FloatField(default=0.0)

        class Meta:
            database = db
            table_name = 'instance'

    db.create_tables([Instance])
    migrator.migrate(
        migrator.add_column('job', 'instance_id', CharField(max_length=32, null=True)),
        migrator.add_index('job', ('instance_id',), False),
        migrator.add_column('node', 'container_runtime', CharField(max_length=16, null=True)),
    )
    _node_trigger(db, NODE_COLUMNS)


def _node_trigger(db, columns):
    """Re-create the trigger that bumps the inventory version on node updates (migration 0006)."""
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql("DROP TRIGGER node_inventory ON node")
        db.execute_sql(f"CREATE TRIGGER node_inventory AFTER INSERT OR DELETE OR UPDATE OF {columns} ON node "
                       f"FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()")
        return
    db.execute_sql("DROP TRIGGER node_inventory_update")
    db.execute_sql(f"CREATE TRIGGER node_inventory_update AFTER UPDATE OF {columns} ON node "  # nosec B608  # the migration's own column names
                   f"BEGIN UPDATE inventory_version SET version = version + 1 WHERE id = 1; END")


def down(migrator, db):
    _node_trigger(db, OLD_NODE_COLUMNS)
    migrator.migrate(
        migrator.drop_column('node', 'container_runtime'),
        migrator.drop_index('job', 'job_instance_id'),
        migrator.drop_column('job', 'instance_id'),
        migrator.drop_table('instance'),
    )
