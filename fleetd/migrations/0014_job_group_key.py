"""Queued jobs carry the key of their group of equivalent jobs (a digest of what the scheduling
rules and the engine read of them), so that a pass kicked by an event reads only the groups it
will look at, not a parked backlog of thousands. Jobs from before have none: they are always read."""
from peewee import *


def up(migrator, db):
    migrator.migrate(
        migrator.add_column('job', 'group_key', CharField(max_length=20, null=True)),
        migrator.add_index('job', ('state', 'group_key'), False),
    )


def down(migrator, db):
    migrator.migrate(
        migrator.drop_index('job', 'job_state_group_key'),
        migrator.drop_column('job', 'group_key'),
    )
