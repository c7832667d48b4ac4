"""Agent upgrades that keep the operator's state: `node.upgrade` remembers, while an upgrade of
the node is under way (or failed), the state it returns to ({before: {status, reason, drain_reason,
drain_deadline, drain_started_at}, drained, reason, started_at, failed}); null otherwise."""
from peewee import *


def up(migrator, db):
    migrator.migrate(
        migrator.add_column('node', 'upgrade', TextField(null=True)),
    )


def down(migrator, db):
    migrator.migrate(
        migrator.drop_column('node', 'upgrade'),
    )
