"""Every scheduling pass and cluster status read the active tasks; at 21,335 running tasks that
read of nine columns was about 80 ms, though a task's row does not change while its (id, epoch,
state) does not (issue 46). An index of (state, id, epoch) answers which tasks are active, and in
which epoch and state, from the index alone; only the rows not seen before are read whole. It
replaces the index of state alone, which it covers. Going down puts that one back."""
from peewee import *


def up(migrator, db):
    db.execute_sql('CREATE INDEX IF NOT EXISTS task_state_id_epoch ON task (state, id, epoch)')
    db.execute_sql('DROP INDEX IF EXISTS task_state')


def down(migrator, db):
    db.execute_sql('CREATE INDEX IF NOT EXISTS task_state ON task (state)')
    db.execute_sql('DROP INDEX IF EXISTS task_state_id_epoch')
