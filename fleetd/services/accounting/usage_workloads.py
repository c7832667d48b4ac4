"""The rows of a report by workload (fleetd.services.accounting.usage.usage_report): the
MAX_WORKLOAD_ROWS costliest workloads with day rows in a range of whole UTC days, from the ledger's
rollups (fleetd.services.accounting.rollups), without grouping hundreds of thousands of rows.

Within one month, the month rows answer (UsageWorkloadMonth; over one fleet,
UsageWorkloadFleetMonth), each with the first and last day of the month its workload has day rows
on. A workload whose days all fall in the range has its month row as its sums: these are read in
cost order from the (month, ..., cost, first_day, last_day) index, which tells a row outside the
range without reading it, until MAX_WORKLOAD_ROWS are found (and any others of the last one's cost:
the cut among equal costs goes by name, as the rows do). A workload whose days straddle an edge of
the range (its first and last day differ: few, from a partial index) has its day rows in the range
looked up and added up. A whole month is the case where every workload's days fall in the range. A
range over more than one month, or part of one in which few runs started (FEW_RUNS: the scan in cost
order might pass over all of the month's rows to find its few workloads), groups its day rows
(UsageWorkloadDay)."""

import datetime as dt
import operator
from functools import reduce

from peewee import JOIN, ValuesList, fn

from fleetd.models import UsageWorkloadDay, UsageWorkloadFleetMonth, UsageWorkloadMonth

MAX_WORKLOAD_ROWS = 10_000  # rows of a report by workload: the costliest
# Up to this many runs started in part of a month, it groups its day rows (about as many: at most
# about 0.15 s on SQLite) rather than scan the month's rows in cost order for its workloads (a
# million rows' index entries: 0.14 s; a range holding more finds its costliest sooner).
FEW_RUNS = 50_000
KEYS_PER_QUERY = 2_000  # day rows looked up per query (SQLite binds at most 32,766 values)
SUMS = ("gpu_seconds", "used_gpu_seconds", "sampled_gpu_seconds", "cost", "runs")


def narrowed(model, where, own, team, owner, fleet):
    """`where` and the filters a report was given (`own`: the submitter's token id)."""
    for name, value in (
        ("owner_token_id", own),
        ("team", team),
        ("owner", owner),
        ("fleet", fleet),
    ):
        if value is not None:
            field = getattr(model, name)
            where = field == value if where is True else where & (field == value)
    return where


def workload_rows(first, last, today, runs, own, team, owner, fleet):
    """[("kind/id", [allocated, used, sampled, cost, runs])]: the MAX_WORKLOAD_ROWS costliest
    workloads with day rows in [first, last] (dates), costliest first, then by name. The ledger
    holds nothing after `today`; `runs` started in the range (the report's totals)."""
    month = first.replace(day=1)
    month_end = _next(month) - dt.timedelta(days=1)
    to = min(last, month_end, today)  # the range's last day that can hold rows, in this month
    in_month = last <= month_end or today <= month_end
    whole = first == month and to == min(month_end, today)  # every row inside: no scan to speak of
    if in_month and to >= first and (whole or runs > FEW_RUNS):
        rows = _from_months(month, first, last, to, own, team, owner, fleet)
    else:
        rows = _from_days(first, last, own, team, owner, fleet)
    rows.sort(key=lambda item: (-item[1][3], item[0]))
    return rows[:MAX_WORKLOAD_ROWS]


def _from_days(first, last, own, team, owner, fleet):
    """The costliest workloads from their day rows in the range, grouped."""
    day = UsageWorkloadDay
    query = (
        day.select(day.kind, day.workload_id, *(fn.SUM(getattr(day, name)) for name in SUMS))
        .where(narrowed(day, (day.day >= first) & (day.day <= last), own, team, owner, fleet))
        .group_by(day.kind, day.workload_id)
        .order_by(fn.SUM(day.cost).desc(), day.kind, day.workload_id)  # equal costs by name
        .limit(MAX_WORKLOAD_ROWS)
    )
    return _rows(query)


def _from_months(month, first, last, to, own, team, owner, fleet):
    """The costliest workloads of one month from its month rows (over one fleet, the fleet's):
    those whose days fall in [first, last] as they are, those that straddle its edge from their
    day rows in [first, to] (`to`: `last`, or the month's or today's end before it)."""
    sums = UsageWorkloadMonth if fleet is None else UsageWorkloadFleetMonth
    where = narrowed(sums, sums.month == month, own, team, owner, fleet)
    inside = sums.select(sums.kind, sums.workload_id, *(getattr(sums, name) for name in SUMS))
    inside = inside.where(where & (sums.first_day >= first) & (sums.last_day <= last))
    rows = _rows(inside.order_by(sums.cost.desc()).limit(MAX_WORKLOAD_ROWS))
    if len(rows) == MAX_WORKLOAD_ROWS:  # the cut may fall among equal costs: all of those too
        cut = rows[-1][1][3]
        listed = {group for group, _ in rows}
        rows += [row for row in _rows(inside.where(sums.cost == cut)) if row[0] not in listed]
    # Straddling: days in the range and out of it. `first_day < last_day` first, as the partial
    # index that holds these rows says it.
    edge = (
        (sums.first_day < sums.last_day)
        & (sums.first_day <= last)
        & (sums.last_day >= first)
        & ((sums.first_day < first) | (sums.last_day > last))
    )
    spans = sums.select(sums.kind, sums.workload_id, sums.first_day, sums.last_day)
    keys = [
        (day, kind, workload, *([fleet] if fleet is not None else []))
        for kind, workload, since, until in _cursor(spans.where(edge & where))
        for day in _days(max(first, _date(since)), min(to, _date(until)))
    ]
    if len(keys) > FEW_RUNS:  # a month of long runs, each on many days: group the day rows
        return _from_days(first, last, own, team, owner, fleet)
    added: dict[str, list] = {}
    for i in range(0, len(keys), KEYS_PER_QUERY):
        for group, figures in _rows(_day_rows(keys[i : i + KEYS_PER_QUERY])):
            total = added.setdefault(group, [0.0, 0.0, 0.0, 0.0, 0])
            for n, value in enumerate(figures):
                total[n] += value
    return rows + list(added.items())


def _day_rows(keys):
    """The day rows of these (day, kind, workload id[, fleet]) keys, each found in the unique
    (day, kind, workload_id, fleet) index: the keys' VALUES CROSS JOIN the rows keeps SQLite's join
    in that order (a row-value IN scans the table), and PostgreSQL, told how many keys there are,
    joins them by that index too (from the month rows, it guessed tens of thousands, and hashed a
    scan of every day row)."""
    values = ValuesList(keys).alias("k")
    day = UsageWorkloadDay
    columns = (day.day, day.kind, day.workload_id, day.fleet)[: len(keys[0])]
    joined = [column == getattr(values.c, f"column{n}") for n, column in enumerate(columns, 1)]
    return (
        day.select(day.kind, day.workload_id, *(getattr(day, name) for name in SUMS))
        .from_(values)
        .join(day, JOIN.CROSS)
        .where(reduce(operator.and_, joined))
    )


def _rows(query):
    """A query's (kind, workload id, 5 sums) as rows."""
    return [
        (f"{kind}/{workload}", [value or 0 for value in figures])
        for kind, workload, *figures in _cursor(query)
    ]


def _cursor(query):
    """A query's plain tuples from the cursor: these columns need no conversion, and peewee's
    costs more than the query."""
    return query.model._meta.database.execute(query).fetchall()


def _days(since, until):
    """The days from `since` to `until`, both included."""
    return [since + dt.timedelta(days=n) for n in range((until - since).days + 1)]


def _date(value):
    """A stored date as a date (SQLite hands back text)."""
    return value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value)[:10])


def _next(month):
    """The first day of the month after `month`'s."""
    return (month.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
