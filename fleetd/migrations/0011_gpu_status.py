"""What a node's GPUs are: ok, cpu_only (no NVIDIA driver or no GPU) or driver_error, and why."""
from peewee import *


def up(migrator, db):
    migrator.migrate(
        migrator.add_column('node', 'gpu_status', CharField(max_length=16, null=True)),
        migrator.add_column('node', 'gpu_status_reason', TextField(default="")),
    )


def down(migrator, db):
    migrator.migrate(migrator.drop_column('node', 'gpu_status_reason'), migrator.drop_column('node', 'gpu_status'))
