"""Jobs, tasks, log lines and artifacts."""
from peewee import *

def up(migrator, db):
    class Node(Model):
        id = CharField(primary_key=True, max_length=32)
        class Meta:
            database = db
            table_name = 'node'

    class Artifact(Model):
        sha256 = CharField(primary_key=True, max_length=64)
        name = CharField()
        kind = CharField(max_length=64, default='')
        size = BigIntegerField()
        created_at = DateTimeField()
        created_by = CharField(max_length=200, default='')
        class Meta:
            database = db
            table_name = 'artifact'
    db.create_tables([Artifact])

    class Job(Model):
        id = CharField(primary_key=True, max_length=32)
        name = CharField(max_length=200)
        owner = CharField(index=True, max_length=200)
        owner_token_id = CharField(max_length=32)
        team = CharField(null=True, max_length=200)
        state = CharField(index=True, max_length=16)
        pending_reason = TextField(default='')
        attempt = IntegerField(default=1)
        max_attempts = IntegerField(default=1)
        num_nodes = IntegerField(default=1)
        priority_class = CharField(max_length=16, default='on-demand')
        spec = TextField()
        outcome = CharField(null=True, max_length=16)
        outcome_reason = TextField(default='')
        submitted_at = DateTimeField()
        started_at = DateTimeField(null=True)
        ended_at = DateTimeField(null=True)
        class Meta:
            database = db
            table_name = 'job'
    db.create_tables([Job])

    class LogLine(Model):
        job = ForeignKeyField(Job, column_name='job', on_delete='CASCADE')
        rank = IntegerField()
        attempt = IntegerField()
        at = DateTimeField()
        stream = CharField(max_length=16)
        text = TextField()
        class Meta:
            database = db
            table_name = 'log_line'
            indexes = ((('job', 'id'), False),)
    db.create_tables([LogLine])

    class Task(Model):
        id = CharField(primary_key=True, max_length=32)
        job = ForeignKeyField(Job, column_name='job', on_delete='CASCADE')
        rank = IntegerField()
        state = CharField(index=True, max_length=16)
        node = ForeignKeyField(Node, null=True, column_name='node', on_delete='SET NULL')
        epoch = IntegerField(default=0)
        gpus = TextField(default="[]")
        delivered_at = DateTimeField(null=True)
        assigned_at = DateTimeField(null=True)
        started_at = DateTimeField(null=True)
        ended_at = DateTimeField(null=True)
        pid = IntegerField(null=True)
        exit_code = IntegerField(null=True)
        reason = TextField(default='')
        rendezvous_addr = CharField(null=True)
        rendezvous_port = IntegerField(null=True)
        class Meta:
            database = db
            table_name = 'task'
            indexes = ((('job', 'rank'), True),)
    db.create_tables([Task])


def down(migrator, db):
    migrator.migrate(migrator.drop_table('task'))
    migrator.migrate(migrator.drop_table('log_line'))
    migrator.migrate(migrator.drop_table('job'))
    migrator.migrate(migrator.drop_table('artifact'))
