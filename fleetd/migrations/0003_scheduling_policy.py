"""GPU types with prices, team quotas, fleet availability windows."""
from peewee import *


def up(migrator, db):
    class GpuType(Model):
        model = CharField(primary_key=True, max_length=128)
        price_per_hour = FloatField(null=True)
        spot_min_bid = FloatField(null=True)

        class Meta:
            database = db
            table_name = 'gpu_type'

    class Quota(Model):
        team = CharField(max_length=200)
        priority_class = CharField(max_length=16)
        max_gpus = FloatField()

        class Meta:
            database = db
            table_name = 'quota'
            primary_key = CompositeKey('team', 'priority_class')

    db.create_tables([GpuType, Quota])
    migrator.migrate(migrator.add_column('fleet', 'availability', TextField(null=True)))


def down(migrator, db):
    migrator.migrate(migrator.drop_column('fleet', 'availability'))
    migrator.migrate(migrator.drop_table('quota'))
    migrator.migrate(migrator.drop_table('gpu_type'))
