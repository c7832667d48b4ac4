"""A task's output kept in files (issue 47): `task_output` (one per task run on a node: its size,
how much of it the output store holds, its cap), `output_segment` (lines in their order of arrival:
each line's seq is computed from its segment, so no row per line is needed) and `output_chunk`
(the stored chunks); `log_line.line` numbers the lines fleetd still keeps as text; fleets get
`output_cap_bytes` and `output_retention_days`. Lines written before keep their rows and their
seqs (below 2**32, where the new ones start; on PostgreSQL `log_line.id` becomes a BIGINT for
them, which rewrites that table once). Plain ADD/DROP COLUMN: the SQLite migrator's table
rebuild would drop the fleet table's inventory triggers (see 0016)."""
from peewee import *


def up(migrator, db):
    class Job(Model):
        id = CharField(primary_key=True, max_length=32)

        class Meta:
            database = db
            table_name = 'job'

    class TaskOutput(Model):
        id = AutoField()
        job = ForeignKeyField(Job, on_delete='CASCADE', column_name='job')
        rank = IntegerField()
        attempt = IntegerField()
        task_id = CharField(max_length=32)
        epoch = IntegerField()
        node_id = CharField(max_length=32)
        lines = BigIntegerField(default=0)
        bytes = BigIntegerField(default=0)
        stored_lines = BigIntegerField(default=0)
        stored_bytes = BigIntegerField(default=0)
        truncated = BooleanField(default=False)
        cap_bytes = BigIntegerField()
        ended = BooleanField(default=False)
        first_at = DateTimeField(null=True)
        last_at = DateTimeField(null=True)

        class Meta:
            database = db
            table_name = 'task_output'
            indexes = ((('task_id', 'epoch'), True), (('job', 'rank', 'attempt'), False))

    class OutputSegment(Model):
        id = AutoField()
        job = ForeignKeyField(Job, on_delete='CASCADE', column_name='job')
        output = ForeignKeyField(TaskOutput, on_delete='CASCADE', column_name='output')
        first_line = BigIntegerField()
        count = IntegerField()
        first_at = DateTimeField()
        last_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'output_segment'
            indexes = ((('job', 'id'), False), (('output', 'first_line'), False))

    class OutputChunk(Model):
        id = AutoField()
        output = ForeignKeyField(TaskOutput, on_delete='CASCADE', column_name='output')
        first_line = BigIntegerField()
        lines = IntegerField()
        bytes = BigIntegerField()
        stored_bytes = BigIntegerField()
        first_at = DateTimeField()
        last_at = DateTimeField()
        key = CharField(max_length=200)

        class Meta:
            database = db
            table_name = 'output_chunk'
            indexes = ((('output', 'first_line'), True),)

    db.create_tables([TaskOutput, OutputSegment, OutputChunk])
    db.execute_sql('ALTER TABLE log_line ADD COLUMN line BIGINT')
    if isinstance(db, PostgresqlDatabase):  # seqs start at 2**32 (SQLite's INTEGER is 64-bit)
        db.execute_sql('ALTER TABLE log_line ALTER COLUMN id TYPE BIGINT')
        db.execute_sql('ALTER SEQUENCE log_line_id_seq AS BIGINT')
    db.execute_sql(f'ALTER TABLE fleet ADD COLUMN output_cap_bytes BIGINT NOT NULL DEFAULT {1 << 30}')
    db.execute_sql('ALTER TABLE fleet ADD COLUMN output_retention_days INTEGER NOT NULL DEFAULT 30')


def down(migrator, db):
    db.execute_sql('ALTER TABLE fleet DROP COLUMN output_retention_days')
    db.execute_sql('ALTER TABLE fleet DROP COLUMN output_cap_bytes')
    db.execute_sql('ALTER TABLE log_line DROP COLUMN line')
    if isinstance(db, PostgresqlDatabase):  # the lines numbered past 2**31 go first
        db.execute_sql('DELETE FROM log_line WHERE id > 2147483647')
        db.execute_sql('ALTER TABLE log_line ALTER COLUMN id TYPE INTEGER')
    for table in ('output_chunk', 'output_segment', 'task_output'):
        db.execute_sql(f'DROP TABLE {table}')
