"""Job listings read a page in key order without sorting the table (issue 46): with 100,000 queued
jobs, `GET /api/v1/jobs?state=queued` took the state index and sorted every queued job by id for a
page of 100, and the listing of every job sorted all of them. An index that ends in the key after
the listing's equality filters (its state, and instance_id IS NULL: jobs, not runs of instances)
gives the page in order. The queue's groups, each with its count and first job (placement, cluster
status, /metrics), come from an index of (state, group_key, id) alone, which replaces the one of
(state, group_key). Going down puts that one back."""
from peewee import *


def up(migrator, db):
    db.execute_sql('CREATE INDEX IF NOT EXISTS job_state_group_key_id ON job (state, group_key, id)')
    db.execute_sql('DROP INDEX IF EXISTS job_state_group_key')
    db.execute_sql('CREATE INDEX IF NOT EXISTS job_state_instance_id_id ON job (state, instance_id, id)')
    db.execute_sql('CREATE INDEX IF NOT EXISTS job_instance_id_id ON job (instance_id, id)')


def down(migrator, db):
    db.execute_sql('CREATE INDEX IF NOT EXISTS job_state_group_key ON job (state, group_key)')
    db.execute_sql('DROP INDEX IF EXISTS job_state_group_key_id')
    db.execute_sql('DROP INDEX IF EXISTS job_instance_id_id')
    db.execute_sql('DROP INDEX IF EXISTS job_state_instance_id_id')
