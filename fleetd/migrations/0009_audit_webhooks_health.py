"""Who caused each event (`event.actor`: token:<name>, node:<id> or fleetd); webhooks and their
delivery outbox; the fleet's node health policy and what it did to a node (`node.health_hold`)."""
from peewee import *


def up(migrator, db):
    migrator.migrate(migrator.add_column('event', 'actor', CharField(max_length=200, default='fleetd')))

    class Webhook(Model):
        id = CharField(primary_key=True, max_length=32)
        url = TextField()
        secret = CharField(max_length=256)
        events = TextField(default='[]')
        created_at = DateTimeField()
        created_by = CharField(max_length=200, default='')

        class Meta:
            database = db
            table_name = 'webhook'

    class WebhookDelivery(Model):
        id = CharField(primary_key=True, max_length=32)
        webhook = ForeignKeyField(Webhook, on_delete='CASCADE', column_name='webhook')
        kind = CharField(max_length=64)
        at = DateTimeField()
        body = TextField()
        state = CharField(max_length=16)
        attempts = IntegerField(default=0)
        next_attempt_at = DateTimeField(null=True)
        status_code = IntegerField(null=True)
        error = TextField(default='')
        finished_at = DateTimeField(null=True)

        class Meta:
            database = db
            table_name = 'webhook_delivery'
            indexes = ((('state', 'next_attempt_at'), False), (('webhook', 'id'), False))

    db.create_tables([Webhook, WebhookDelivery])
    migrator.migrate(migrator.add_column('fleet', 'health_policy', TextField(null=True)),
                     migrator.add_column('node', 'health_hold', TextField(null=True)))


def down(migrator, db):
    migrator.migrate(migrator.drop_column('node', 'health_hold'), migrator.drop_column('fleet', 'health_policy'),
                     migrator.drop_table('webhook_delivery'), migrator.drop_table('webhook'),
                     migrator.drop_column('event', 'actor'))
