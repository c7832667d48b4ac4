"""Agent upgrades that keep the operator's state, and labels from two sources.

`node.upgrade` remembers, while an upgrade of the node is under way (or failed), the state it
returns to ({before: {status, reason, drain_reason, drain_deadline, drain_started_at}, drained,
reason, started_at, failed}); null otherwise. `node.agent_labels` are the labels of the agent's
config file as it last reported them, `node.label_overrides` those set through the API; `labels`
stays what placement reads, their merge. Existing labels all came from agents."""
from peewee import *


def up(migrator, db):
    migrator.migrate(
        migrator.add_column('node', 'upgrade', TextField(null=True)),
        migrator.add_column('node', 'agent_labels', TextField(null=True)),
        migrator.add_column('node', 'label_overrides', TextField(null=True)),
    )
    db.execute_sql("UPDATE node SET agent_labels = labels")


def down(migrator, db):
    migrator.migrate(
        migrator.drop_column('node', 'label_overrides'),
        migrator.drop_column('node', 'agent_labels'),
        migrator.drop_column('node', 'upgrade'),
    )
