"""Reports by workload over part of a month, or over one fleet, read month rows as a whole month's
report does, instead of grouping hundreds of thousands of day rows: each month row keeps the first
and last day of its month that its workload has day rows on (`first_day`, `last_day`; the (month,
cost) index takes them in, so a scan in cost order tells a row inside a range without reading it,
and a partial index holds the rows that span more than one day), and `usage_workload_fleet_month`
holds a workload's sums per month and fleet. Both are filled here from `usage_workload_day` (what
the ledger's passes add to them from now on); a month row with no day rows (the ledger writes
none) spans its whole month."""
import datetime

from peewee import *

SUMS = ('gpu_seconds', 'used_gpu_seconds', 'sampled_gpu_seconds', 'cost', 'runs')


def up(migrator, db):
    class UsageWorkloadFleetMonth(Model):
        kind = CharField(max_length=16)
        workload_id = CharField(max_length=32)
        team = CharField(max_length=200, default='')
        owner_token_id = CharField(max_length=32)
        owner = CharField(max_length=200)
        gpu_seconds = FloatField(default=0.0)
        used_gpu_seconds = FloatField(default=0.0)
        sampled_gpu_seconds = FloatField(default=0.0)
        cost = FloatField(default=0.0)
        runs = IntegerField(default=0)
        month = DateField()
        first_day = DateField(null=True)
        last_day = DateField(null=True)
        id = AutoField()
        fleet = CharField(max_length=63, default='')

        class Meta:
            database = db
            table_name = 'usage_workload_fleet_month'

    UsageWorkloadFleetMonth._schema.create_table()
    db.execute_sql('ALTER TABLE usage_workload_month ADD COLUMN first_day DATE')
    db.execute_sql('ALTER TABLE usage_workload_month ADD COLUMN last_day DATE')
    pg = isinstance(db, PostgresqlDatabase)
    p = db.param

    def day(value):  # a date parameter: psycopg2 types it, SQLite stores dates as ISO text
        return value if pg else value.isoformat()

    low, high = db.execute_sql('SELECT MIN(day), MAX(day) FROM usage_workload_day').fetchone()
    months = []
    if low is not None:
        month = _date(low).replace(day=1)
        while month <= _date(high):
            months.append(month)
            month = _next(month)
    columns = ', '.join(SUMS)
    for month in months:
        db.execute_sql(
            'INSERT INTO usage_workload_fleet_month (month, fleet, kind, workload_id, team, '  # nosec B608  # the migration's own columns and the parameter marker
            f'owner_token_id, owner, first_day, last_day, {columns}) '
            f'SELECT {p}, fleet, kind, workload_id, MIN(team), MIN(owner_token_id), MIN(owner), '
            f'MIN(day), MAX(day), {", ".join(f"SUM({c})" for c in SUMS)} '
            f'FROM usage_workload_day WHERE day >= {p} AND day < {p} '
            'GROUP BY fleet, kind, workload_id',
            (day(month), day(month), day(_next(month))))
    db.execute_sql(
        'UPDATE usage_workload_month SET first_day = s.first_day, last_day = s.last_day '
        'FROM (SELECT month, kind, workload_id, MIN(first_day) AS first_day, '
        'MAX(last_day) AS last_day FROM usage_workload_fleet_month '
        'GROUP BY month, kind, workload_id) AS s '
        'WHERE usage_workload_month.month = s.month AND usage_workload_month.kind = s.kind '
        'AND usage_workload_month.workload_id = s.workload_id')
    for (month,) in db.execute_sql(
            'SELECT DISTINCT month FROM usage_workload_month WHERE first_day IS NULL').fetchall():
        month = _date(month)
        db.execute_sql(
            f'UPDATE usage_workload_month SET first_day = {p}, last_day = {p} '  # nosec B608  # {p} is the parameter marker
            f'WHERE month = {p} AND first_day IS NULL',
            (day(month), day(_next(month) - datetime.timedelta(days=1)), day(month)))
    for sql in (
        'CREATE UNIQUE INDEX usage_workload_fleet_month_month_fleet_kind_workload_id '
        'ON usage_workload_fleet_month (month, fleet, kind, workload_id)',
        'DROP INDEX IF EXISTS usageworkloadmonth_month_cost',
        'DROP INDEX IF EXISTS usage_workload_month_month_cost',
        'CREATE INDEX usage_workload_month_month_cost_first_day_last_day '
        'ON usage_workload_month (month, cost, first_day, last_day)',
        'CREATE INDEX usage_workload_month_spans ON usage_workload_month '
        '(month, first_day, last_day) WHERE first_day < last_day',
        'CREATE INDEX usage_workload_fleet_month_month_fleet_cost_first_day_last_day '
        'ON usage_workload_fleet_month (month, fleet, cost, first_day, last_day)',
        'CREATE INDEX usage_workload_fleet_month_spans ON usage_workload_fleet_month '
        '(month, fleet, first_day, last_day) WHERE first_day < last_day',
    ):
        db.execute_sql(sql)
    if pg:
        db.execute_sql('ANALYZE usage_workload_month')
        db.execute_sql('ANALYZE usage_workload_fleet_month')


def _date(value):
    """A stored date as a date (SQLite hands back text)."""
    if isinstance(value, datetime.datetime):
        return value.date()
    if isinstance(value, datetime.date):
        return value
    return datetime.date.fromisoformat(str(value)[:10])


def _next(month):
    return (month.replace(day=28) + datetime.timedelta(days=4)).replace(day=1)


def down(migrator, db):
    for sql in (
        'DROP INDEX IF EXISTS usage_workload_month_spans',
        'DROP INDEX IF EXISTS usage_workload_month_month_cost_first_day_last_day',
        'CREATE INDEX usageworkloadmonth_month_cost ON usage_workload_month (month, cost)',
        'DROP TABLE IF EXISTS usage_workload_fleet_month',
        'ALTER TABLE usage_workload_month DROP COLUMN last_day',
        'ALTER TABLE usage_workload_month DROP COLUMN first_day',
    ):
        db.execute_sql(sql)
