"""Replicas: the leader lease (one row: who leads, until when, at which fencing epoch) and the
last lease renewal of each task as any replica saw it."""
from peewee import *


def up(migrator, db):
    class LeaderLease(Model):
        id = IntegerField(primary_key=True)
        holder = CharField(max_length=64, default="")
        epoch = BigIntegerField(default=0)
        expires_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'leader_lease'

    db.create_tables([LeaderLease])
    db.execute_sql("INSERT INTO leader_lease (id, holder, epoch, expires_at) VALUES (1, '', 0, '1970-01-01 00:00:00')")
    migrator.migrate(migrator.add_column('task', 'renewed_at', DateTimeField(null=True)))


def down(migrator, db):
    migrator.migrate(migrator.drop_column('task', 'renewed_at'), migrator.drop_table('leader_lease'))
