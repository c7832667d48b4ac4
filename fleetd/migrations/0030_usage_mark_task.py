"""An index on `usage_mark.task_id`: a job's cost is read from the ledger and the marks of its runs
that ended since the ledger's last pass, by task id (services.accounting.ledger.runs_to_date). Without
it every view of a job's cost read every pending mark: at hundreds of jobs a second, thousands of them
between two passes. Going down drops it."""


def up(migrator, db):
    db.execute_sql('CREATE INDEX IF NOT EXISTS usage_mark_task_id ON usage_mark (task_id)')


def down(migrator, db):
    db.execute_sql('DROP INDEX IF EXISTS usage_mark_task_id')
