"""Reports by workload read rollups, as the other reports read `usage_day` (issue 34): a
workload's sums per UTC day and fleet (`usage_workload_day`) and per UTC month
(`usage_workload_month`, with (month, ..., cost) indexes so that a month's costliest workloads
are read in cost order, not grouped from the ledger's million rows). The ledger's passes add to
them in the transactions that move its rows. Rows accounted before this migration are filled in
here: a run's figures spread over the days it covered in proportion to time (the ledger kept no
per-day split of them), its run counted on the day it started; a volume's storage cost likewise."""
import datetime

from peewee import *

SUMS = ('gpu_seconds', 'used_gpu_seconds', 'sampled_gpu_seconds', 'cost', 'runs')


def up(migrator, db):
    class Sums(Model):
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

        class Meta:
            database = db

    class UsageWorkloadDay(Sums):
        id = AutoField()
        day = DateField()
        fleet = CharField(max_length=63, default='')

        class Meta:
            table_name = 'usage_workload_day'
            indexes = ((('day', 'kind', 'workload_id', 'fleet'), True), (('fleet', 'day'), False),
                       (('team', 'day'), False), (('owner_token_id', 'day'), False), (('owner', 'day'), False))

    class UsageWorkloadMonth(Sums):
        id = AutoField()
        month = DateField()

        class Meta:
            table_name = 'usage_workload_month'
            indexes = ((('month', 'kind', 'workload_id'), True), (('month', 'cost'), False),
                       (('month', 'team', 'cost'), False), (('month', 'owner_token_id', 'cost'), False),
                       (('month', 'owner', 'cost'), False))

    db.create_tables([UsageWorkloadDay, UsageWorkloadMonth])
    days, months = {}, {}

    def add(at, kind, workload, attributes, fleet, figures):
        for sums, key in ((days, (at.date(), kind, workload, fleet)),
                          (months, (at.date().replace(day=1), kind, workload))):
            entry = sums.setdefault(key, [0.0, 0.0, 0.0, 0.0, 0, attributes])
            for i, value in enumerate(figures):
                entry[i] += value

    def spread(kind, workload, attributes, fleet, start, until, figures):
        """The figures over [start, until) in proportion to time, cut at UTC midnights."""
        length = (until - start).total_seconds()
        at = start
        while at < until:
            cut = min(until, datetime.datetime.combine(at.date(), datetime.time()) + datetime.timedelta(days=1))
            share = (cut - at).total_seconds() / length
            add(at, kind, workload, attributes, fleet, [value * share for value in figures] + [0])
            at = cut

    records = db.execute_sql(
        'SELECT kind, workload_id, team, owner_token_id, owner, fleet, started_at, accounted_until, gpu_seconds, '
        'used_gpu_seconds, sampled_gpu_seconds, cost FROM usage_record')
    for kind, workload, team, token, owner, fleet, start, until, *figures in records.fetchall():
        start, until = _time(start), _time(until)
        attributes = {'team': team or '', 'owner_token_id': token, 'owner': owner}
        add(start, kind, workload, attributes, fleet or '', [0.0, 0.0, 0.0, 0.0, 1])
        if until > start:
            spread(kind, workload, attributes, fleet or '', start, until, figures)
    volumes = db.execute_sql(
        'SELECT id, team, owner_token_id, owner, fleet, started_at, accounted_until, cost FROM storage_record')
    for instance, team, token, owner, fleet, start, until, cost in volumes.fetchall():
        start, until = _time(start), _time(until)
        if until > start:
            spread('instance', instance, {'team': team or '', 'owner_token_id': token, 'owner': owner},
                   fleet or '', start, until, [0.0, 0.0, 0.0, cost])
    for model, sums, columns in ((UsageWorkloadDay, days, ('day', 'kind', 'workload_id', 'fleet')),
                                 (UsageWorkloadMonth, months, ('month', 'kind', 'workload_id'))):
        rows = [{**dict(zip(columns, key)), **s[5], **dict(zip(SUMS, s[:5]))} for key, s in sums.items()]
        for i in range(0, len(rows), 500):
            model.insert_many(rows[i:i + 500]).execute()


def _time(value):
    """A stored time as a datetime (SQLite hands back text)."""
    if isinstance(value, datetime.datetime):
        return value.replace(tzinfo=None)
    return datetime.datetime.fromisoformat(str(value))


def down(migrator, db):
    for table in ('usage_workload_month', 'usage_workload_day'):
        migrator.migrate(migrator.drop_table(table))
