"""The usage ledger (issue 34): `usage_record`, one row per run of a workload (a job's task in one
attempt, keyed by task id and epoch; an instance's run), with its allocated, used and sampled
GPU-seconds and cost as far as `accounted_until`; `usage_day`, the same sums per UTC day and
(kind, team, owner, fleet, GPU model), which reports read; `usage_mark`, the runs that ended and are
not yet in the ledger (written as they end: a requeued task's row forgets its times);
`storage_record`, an instance volume's storage cost; `price_change`, every price as it was set
(GPU types per GPU-hour, storage per GB-month), so that the ledger integrates the prices in force
piecewise whenever it catches up. The GPU types' current prices are its first rows."""
import datetime

from peewee import *

EPOCH = datetime.datetime(1970, 1, 1)


def up(migrator, db):
    class UsageRecord(Model):
        id = CharField(primary_key=True, max_length=48)
        kind = CharField(max_length=16)
        workload_id = CharField(max_length=32)
        workload_name = CharField(max_length=200)
        task_id = CharField(max_length=32)
        job_id = CharField(max_length=32)
        rank = IntegerField(default=0)
        attempt = IntegerField(default=1)
        owner = CharField(max_length=200)
        owner_token_id = CharField(max_length=32)
        team = CharField(max_length=200, default='')
        fleet = CharField(max_length=63, default='')
        node_id = CharField(max_length=32, default='')
        gpu_model = CharField(max_length=128, default='')
        priority_class = CharField(max_length=16, default='on-demand')
        gpus = FloatField(default=0.0)
        gpu_uuids = TextField(default='[]')
        bid = FloatField(null=True)
        started_at = DateTimeField()
        ended_at = DateTimeField(null=True)
        accounted_until = DateTimeField()
        gpu_seconds = FloatField(default=0.0)
        used_gpu_seconds = FloatField(default=0.0)
        sampled_gpu_seconds = FloatField(default=0.0)
        cost = FloatField(default=0.0)
        price_per_hour = FloatField(null=True)

        class Meta:
            database = db
            table_name = 'usage_record'
            indexes = ((('started_at',), False), (('workload_id',), False), (('ended_at',), False),
                       (('team', 'started_at'), False), (('owner_token_id', 'started_at'), False))

    class UsageDay(Model):
        id = AutoField()
        day = DateField()
        kind = CharField(max_length=16)
        team = CharField(max_length=200, default='')
        owner_token_id = CharField(max_length=32)
        owner = CharField(max_length=200)
        fleet = CharField(max_length=63, default='')
        gpu_model = CharField(max_length=128, default='')
        gpu_seconds = FloatField(default=0.0)
        used_gpu_seconds = FloatField(default=0.0)
        sampled_gpu_seconds = FloatField(default=0.0)
        cost = FloatField(default=0.0)
        runs = IntegerField(default=0)

        class Meta:
            database = db
            table_name = 'usage_day'
            indexes = ((('day', 'kind', 'team', 'owner_token_id', 'owner', 'fleet', 'gpu_model'), True),)

    class UsageMark(Model):
        id = AutoField()
        task_id = CharField(max_length=32)
        epoch = IntegerField()
        node_id = CharField(max_length=32, default='')
        gpus = TextField(default='[]')
        attempt = IntegerField(default=1)
        started_at = DateTimeField()
        ended_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'usage_mark'

    class StorageRecord(Model):
        id = CharField(primary_key=True, max_length=32)
        owner = CharField(max_length=200)
        owner_token_id = CharField(max_length=32)
        team = CharField(max_length=200, default='')
        fleet = CharField(max_length=63, default='')
        volume_bytes = BigIntegerField(default=0)
        started_at = DateTimeField()
        ended_at = DateTimeField(null=True)
        accounted_until = DateTimeField()
        cost = FloatField(default=0.0)

        class Meta:
            database = db
            table_name = 'storage_record'

    class PriceChange(Model):
        id = AutoField()
        at = DateTimeField()
        kind = CharField(max_length=16)
        model = CharField(max_length=128, default='')
        price = FloatField(null=True)

        class Meta:
            database = db
            table_name = 'price_change'
            indexes = ((('kind', 'model', 'at'), False),)

    db.create_tables([UsageRecord, UsageDay, UsageMark, StorageRecord, PriceChange])
    for model, price in db.execute_sql('SELECT model, price_per_hour FROM gpu_type').fetchall():
        PriceChange.create(at=EPOCH, kind='gpu', model=model, price=price)


def down(migrator, db):
    for table in ('price_change', 'storage_record', 'usage_mark', 'usage_day', 'usage_record'):
        migrator.migrate(migrator.drop_table(table))
