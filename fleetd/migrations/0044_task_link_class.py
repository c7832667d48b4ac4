"""The weakest link among a task's GPUs (issue 50): `task.link_class`, one of nvlink, nvswitch,
pcie_switch, host_bridge, numa, system, or self for one GPU; null where its node's links are unknown
or it holds no GPU. Tasks placed before keep null. Plain ADD/DROP COLUMN, as 0038."""

from peewee import *


def up(migrator, db):
    db.execute_sql("ALTER TABLE task ADD COLUMN link_class VARCHAR(16)")


def down(migrator, db):
    db.execute_sql("ALTER TABLE task DROP COLUMN link_class")
