"""The validation gate: a fleet's `validation` setting (null: no gate), one row per run of a node's
validation suite (`validation`, with its checks' results), and `node.drain_repair` (a drain for
repair: the undrain validates the node first). Existing fleets keep no gate, existing nodes keep
their status."""
from peewee import *

INDEX = 'validation_node_id_id'


def up(migrator, db):
    class Validation(Model):
        id = CharField(primary_key=True, max_length=32)
        node_id = CharField(max_length=32)
        state = CharField(max_length=16)
        reason = TextField(default="")
        suite = TextField()
        then_status = CharField(max_length=16, default="ready")
        started_at = DateTimeField()
        deadline = DateTimeField()
        finished_at = DateTimeField(null=True)
        checks = TextField(null=True)
        system = TextField(null=True)
        actor = CharField(max_length=200, default="fleetd")

        class Meta:
            database = db
            table_name = 'validation'

    db.create_tables([Validation])
    migrator.migrate(
        migrator.add_index('validation', ('node_id', 'id'), False, name=INDEX),
        migrator.add_column('fleet', 'validation', TextField(null=True)),
    )
    # NOT NULL with its default in the database itself: on SQLite the migrator would otherwise rebuild
    # the node table, which drops its inventory triggers (see 0016).
    postgres = isinstance(db, PostgresqlDatabase)
    db.execute_sql(f"ALTER TABLE node ADD COLUMN drain_repair {'BOOLEAN' if postgres else 'INTEGER'} NOT NULL "
                   f"DEFAULT {'false' if postgres else '0'}")


def down(migrator, db):
    migrator.migrate(
        migrator.drop_column('node', 'drain_repair'),
        migrator.drop_column('fleet', 'validation'),
    )
    db.execute_sql('DROP TABLE validation')
