"""Initial schema: tokens, fleets, join tokens, nodes, GPUs, events, settings."""
from peewee import *

def up(migrator, db):
    class ApiToken(Model):
        id = CharField(primary_key=True, max_length=32)
        name = CharField(max_length=200)
        role = CharField(max_length=20)
        team = CharField(null=True, max_length=200)
        token_hash = CharField(max_length=64)
        created_at = DateTimeField()
        expires_at = DateTimeField(index=True, null=True)
        revoked_at = DateTimeField(null=True)
        last_used_at = DateTimeField(null=True)
        class Meta:
            database = db
            table_name = 'api_token'
    db.create_tables([ApiToken])

    class Event(Model):
        at = DateTimeField()
        kind = CharField(max_length=64)
        subject_type = CharField(max_length=16)
        subject_id = CharField(max_length=64)
        from_status = CharField(null=True, max_length=16)
        to_status = CharField(null=True, max_length=16)
        reason = TextField(default='')
        class Meta:
            database = db
            table_name = 'event'
            indexes = ((('subject_type', 'subject_id', 'id'), False),)
    db.create_tables([Event])

    class Fleet(Model):
        name = CharField(primary_key=True, max_length=63)
        description = TextField(default='')
        labels = TextField(default="{}")
        created_at = DateTimeField()
        class Meta:
            database = db
            table_name = 'fleet'
    db.create_tables([Fleet])

    class Node(Model):
        id = CharField(primary_key=True, max_length=32)
        fleet = ForeignKeyField(Fleet, column_name='fleet', on_delete='RESTRICT')
        machine_id = CharField(unique=True, max_length=128)
        hostname = CharField()
        address = CharField(default='')
        labels = TextField(default="{}")
        agent_version = CharField(max_length=64, default='')
        status = CharField(index=True, max_length=16)
        status_reason = TextField(default='')
        status_before_lost = CharField(null=True, max_length=16)
        registered_at = DateTimeField()
        last_heartbeat_at = DateTimeField(null=True)
        drain_reason = TextField(null=True)
        drain_deadline = DateTimeField(null=True)
        drain_started_at = DateTimeField(null=True)
        cpu_count = IntegerField(default=0)
        memory_bytes = BigIntegerField(default=0)
        session_id = CharField(unique=True, null=True, max_length=32)
        session_hash = CharField(null=True, max_length=64)
        join_token_id = CharField(null=True, max_length=32)
        class Meta:
            database = db
            table_name = 'node'
    db.create_tables([Node])

    class Gpu(Model):
        node = ForeignKeyField(Node, column_name='node', on_delete='CASCADE')
        uuid = CharField(max_length=128)
        index = IntegerField()
        vendor = CharField(max_length=32, default='nvidia')
        model = CharField(max_length=128)
        memory_total_bytes = BigIntegerField()
        numa_node = IntegerField(null=True)
        max_tflops = FloatField(null=True)
        healthy = BooleanField(default=True)
        health_reason = TextField(default='')
        mig_mode = CharField(null=True, max_length=16)
        class Meta:
            database = db
            table_name = 'gpu'
            indexes = ((('node', 'uuid'), True),)
    db.create_tables([Gpu])

    class JoinToken(Model):
        id = CharField(primary_key=True, max_length=32)
        fleet = ForeignKeyField(Fleet, column_name='fleet', on_delete='CASCADE')
        token_hash = CharField(max_length=64)
        description = TextField(default='')
        created_at = DateTimeField()
        expires_at = DateTimeField(index=True)
        max_uses = IntegerField(null=True)
        uses = IntegerField(default=0)
        revoked = BooleanField(default=False)
        created_by = CharField(max_length=200, default='')
        class Meta:
            database = db
            table_name = 'join_token'
    db.create_tables([JoinToken])

    class Setting(Model):
        key = CharField(primary_key=True, max_length=64)
        value = TextField()
        class Meta:
            database = db
            table_name = 'setting'
    db.create_tables([Setting])


def down(migrator, db):
    migrator.migrate(migrator.drop_table('setting'))
    migrator.migrate(migrator.drop_table('join_token'))
    migrator.migrate(migrator.drop_table('gpu'))
    migrator.migrate(migrator.drop_table('node'))
    migrator.migrate(migrator.drop_table('fleet'))
    migrator.migrate(migrator.drop_table('event'))
    migrator.migrate(migrator.drop_table('api_token'))
