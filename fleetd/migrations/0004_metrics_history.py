"""Metrics history: cluster samples and per-GPU samples."""
from peewee import *


def up(migrator, db):
    class ClusterSample(Model):
        at = DateTimeField(index=True)
        jobs_running = IntegerField()
        jobs_waiting = IntegerField()
        gpus_total = IntegerField()
        gpus_used = IntegerField()
        gpus_blocked = IntegerField()
        gpu_util_percent = FloatField(null=True)

        class Meta:
            database = db
            table_name = 'cluster_sample'

    class GpuSample(Model):
        at = DateTimeField(index=True)
        node_id = CharField(max_length=32)
        uuid = CharField(max_length=128)
        utilization_percent = FloatField(null=True)
        memory_used_bytes = BigIntegerField(null=True)
        temperature_c = FloatField(null=True)
        power_w = FloatField(null=True)

        class Meta:
            database = db
            table_name = 'gpu_sample'

    db.create_tables([ClusterSample, GpuSample])


def down(migrator, db):
    migrator.migrate(migrator.drop_table('gpu_sample'))
    migrator.migrate(migrator.drop_table('cluster_sample'))
