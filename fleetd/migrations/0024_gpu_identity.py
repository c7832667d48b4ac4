"""GPU identity and history: a GPU's serial number, board part number and VBIOS beside its uuid,
and `gpu_record`, one row per board serial wherever it sits (its history is the events of subject
gpu/<serial>). GPUs stored before have no serial until their agent reports one."""
from peewee import *


def up(migrator, db):
    class GpuRecord(Model):
        serial = CharField(primary_key=True, max_length=64)
        uuid = CharField(max_length=128)
        model = CharField(max_length=128, default="")
        board_part_number = CharField(max_length=64, null=True)
        vbios = CharField(max_length=64, null=True)
        node_id = CharField(max_length=32, null=True, index=True)
        index = IntegerField(null=True)
        first_seen_at = DateTimeField()
        last_seen_at = DateTimeField()
        xids = TextField(default="[]")
        ecc_uncorrected = BigIntegerField(null=True)
        rma = TextField(null=True)
        flagged = TextField(default="")

        class Meta:
            database = db
            table_name = 'gpu_record'

    db.create_tables([GpuRecord])
    migrator.migrate(
        migrator.add_column('gpu', 'serial', CharField(max_length=64, null=True)),
        migrator.add_column('gpu', 'board_part_number', CharField(max_length=64, null=True)),
        migrator.add_column('gpu', 'vbios', CharField(max_length=64, null=True)),
        migrator.add_index('gpu', ('serial',), False),
    )


def down(migrator, db):
    migrator.migrate(
        migrator.drop_index('gpu', 'gpu_serial'),
        migrator.drop_column('gpu', 'vbios'),
        migrator.drop_column('gpu', 'board_part_number'),
        migrator.drop_column('gpu', 'serial'),
    )
    db.execute_sql('DROP TABLE gpu_record')
