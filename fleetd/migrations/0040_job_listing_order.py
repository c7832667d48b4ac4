"""Job listings read a page in key order without sorting the table (issue 46): with 100,000 queued
jobs, `GET /api/v1/jobs?state=queued` took the state index and sorted every queued job by id for a
page of 100, and the listing of every job sorted all of them. An index that ends in the key after
the listing's equality filters (its state, and instance_id IS NULL: jobs, not runs of instances)
gives the page in order. Going down drops them."""
from peewee import *


def up(migrator, db):
    db.execute_sql('CREATE INDEX IF NOT EXISTS job_state_instance_id_id ON job (state, instance_id, id)')
    db.execute_sql('CREATE INDEX IF NOT EXISTS job_instance_id_id ON job (instance_id, id)')


def down(migrator, db):
    db.execute_sql('DROP INDEX IF EXISTS job_instance_id_id')
    db.execute_sql('DROP INDEX IF EXISTS job_state_instance_id_id')
