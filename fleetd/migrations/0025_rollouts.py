"""Rollouts: an agent rollout over a fleet (`fleetd rollout start`) and each of its nodes, in the
order the driving CLI takes them (batch 0 holds the canaries), with how far each got. And the
node a deleted host had, by machine id (retired_node), so that the host enrolling again gets it
back (services.nodes.hosts)."""
from peewee import *


def up(migrator, db):
    class Rollout(Model):
        id = CharField(primary_key=True, max_length=32)
        fleet = CharField(max_length=64, index=True)
        bundle_version = CharField(max_length=64)
        bundle_sha256 = CharField(max_length=64)
        state = CharField(max_length=16, index=True)
        state_reason = TextField(default="")
        options = TextField(default="{}")
        created_at = DateTimeField()
        created_by = CharField(max_length=200, default="")
        updated_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'rollout'

    class RolloutNode(Model):
        id = AutoField()
        rollout = ForeignKeyField(Rollout, on_delete='CASCADE', column_name='rollout')
        node_id = CharField(max_length=32)
        hostname = CharField(max_length=255, default="")
        address = CharField(max_length=255, default="")
        position = IntegerField()
        batch = IntegerField()
        canary = BooleanField(default=False)
        state = CharField(max_length=16)
        detail = TextField(default="")
        updated_at = DateTimeField(null=True)

        class Meta:
            database = db
            table_name = 'rollout_node'
            indexes = ((('rollout', 'node_id'), True), (('rollout', 'position'), False))

    class RetiredNode(Model):
        machine_id = CharField(primary_key=True, max_length=128)
        node_id = CharField(max_length=32)
        fleet = CharField(max_length=64)
        retired_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'retired_node'

    db.create_tables([Rollout, RolloutNode, RetiredNode])


def down(migrator, db):
    migrator.migrate(migrator.drop_table('retired_node'), migrator.drop_table('rollout_node'),
                     migrator.drop_table('rollout'))
