"""Honest instance states: what its node reported of the last exit of its process (`last_exit`, JSON)
and when a restarting process starts again (`next_start_at`), when the current process started
(`process_started_at`: its uptime, not the run's) and the workload that preempted it
(`preempted_by`, JSON {kind, id, name}). The new states `restarting` and `deleting` fit the state
column as it is. Going down drops the columns; an instance left restarting or deleting reads as
running or deleted again."""
from peewee import *

COLUMNS = ('last_exit', 'next_start_at', 'process_started_at', 'preempted_by')


def up(migrator, db):
    migrator.migrate(
        migrator.add_column('instance', 'last_exit', TextField(null=True)),
        migrator.add_column('instance', 'next_start_at', DateTimeField(null=True)),
        migrator.add_column('instance', 'process_started_at', DateTimeField(null=True)),
        migrator.add_column('instance', 'preempted_by', TextField(null=True)),
    )
    db.execute_sql("UPDATE instance SET process_started_at = started_at WHERE state = 'running'")


def down(migrator, db):
    db.execute_sql("UPDATE instance SET state = 'running' WHERE state = 'restarting'")
    db.execute_sql("UPDATE instance SET state = 'deleted' WHERE state = 'deleting'")
    migrator.migrate(*[migrator.drop_column('instance', column) for column in reversed(COLUMNS)])
