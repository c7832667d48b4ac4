"""A pass reads of the queue only the jobs that do not know why they wait, and counts the rest of
each parked group (issue 46): both compare a job's (group_key, pending_reason) with its group's
reason, and with the reason outside the index every queued job's row was read for it (about
250 ms a pass at 78,665 queued jobs). An index of (state, group_key, pending_reason, id) answers
the count and each group's first job from the index alone (about 50 ms), and still gives the
queue's groups with their counts; it replaces the one of (state, group_key, id). Going down
puts that one back."""
from peewee import *


def up(migrator, db):
    db.execute_sql(
        'CREATE INDEX IF NOT EXISTS job_state_group_key_pending_reason_id '
        'ON job (state, group_key, pending_reason, id)'
    )
    db.execute_sql('DROP INDEX IF EXISTS job_state_group_key_id')


def down(migrator, db):
    db.execute_sql('CREATE INDEX IF NOT EXISTS job_state_group_key_id ON job (state, group_key, id)')
    db.execute_sql('DROP INDEX IF EXISTS job_state_group_key_pending_reason_id')
