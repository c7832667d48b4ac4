"""Usage by project (issue 45): the ledger's rows and its day sums name the project of the work
they count, so a report groups by project. Rows written before name the project their work is in
(the job's, the instance's: migration 0031 put every job and instance in one); the day sums before
name the project migration 0031 made of their team (`default` without a team). The columns are
added with their default in the database itself (SQLite would otherwise rebuild the tables); the
day sums' unique key is made again with the project in it. Going down drops what was added."""
from peewee import *

OLD_KEY = ('day', 'kind', 'team', 'owner_token_id', 'owner', 'fleet', 'gpu_model')
NEW_KEY = ('day', 'kind', 'team', 'project', 'owner_token_id', 'owner', 'fleet', 'gpu_model')


def _name(columns):
    return 'usageday_' + '_'.join(columns)  # peewee's name: the model's, lower case


def up(migrator, db):
    for table in ('usage_record', 'usage_day', 'storage_record'):
        db.execute_sql(f"ALTER TABLE {table} ADD COLUMN project VARCHAR(32) NOT NULL DEFAULT ''")
    db.execute_sql("UPDATE usage_record SET project = COALESCE((SELECT job.project FROM job "
                   "WHERE job.id = usage_record.job_id), '')")
    db.execute_sql("UPDATE storage_record SET project = COALESCE((SELECT instance.project FROM instance "
                   "WHERE instance.id = storage_record.id), '')")
    db.execute_sql("UPDATE usage_day SET project = COALESCE((SELECT MIN(project.key) FROM project "
                   "WHERE project.team = usage_day.team), 'default') WHERE team != ''")
    db.execute_sql("UPDATE usage_day SET project = 'default' WHERE team = ''")
    db.execute_sql(f"DROP INDEX IF EXISTS {_name(OLD_KEY)}")
    db.execute_sql(f"CREATE UNIQUE INDEX {_name(NEW_KEY)} ON usage_day ({', '.join(NEW_KEY)})")
    db.execute_sql("CREATE INDEX usageday_project_day ON usage_day (project, day)")


def down(migrator, db):
    db.execute_sql("DROP INDEX IF EXISTS usageday_project_day")
    db.execute_sql(f"DROP INDEX IF EXISTS {_name(NEW_KEY)}")
    # Rows that differed by project alone are one again: the first keeps their sums.
    key = ' AND '.join(f'o.{c} = usage_day.{c}' for c in OLD_KEY)
    sums = ', '.join(f'{c} = (SELECT SUM(o.{c}) FROM usage_day o WHERE {key})'  # nosec B608  # the migration's own names
                     for c in ('gpu_seconds', 'used_gpu_seconds', 'sampled_gpu_seconds', 'cost', 'runs'))
    keep = f"SELECT MIN(id) FROM usage_day GROUP BY {', '.join(OLD_KEY)}"  # nosec B608  # the migration's own names
    db.execute_sql(f"UPDATE usage_day SET {sums} WHERE id IN ({keep})")  # nosec B608  # the migration's own names
    db.execute_sql(f"DELETE FROM usage_day WHERE id NOT IN ({keep})")  # nosec B608  # the migration's own names
    db.execute_sql(f"CREATE UNIQUE INDEX {_name(OLD_KEY)} ON usage_day ({', '.join(OLD_KEY)})")
    for table in ('usage_record', 'usage_day', 'storage_record'):
        migrator.migrate(migrator.drop_column(table, 'project'))
