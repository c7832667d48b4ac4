"""Reports by workload read month rows for a whole month, part of one or one fleet
(fleetd.services.accounting.usage_workloads): the same rows, figures, order and cut as grouping the
day rows of the range, for ranges and filters of every kind, whichever way the report reads them."""

import datetime as dt
import random
from types import SimpleNamespace

import pytest

from fleetd.auth import Principal
from fleetd.db import database, write_transaction
from fleetd.models import UsageWorkloadDay, UsageWorkloadFleetMonth, UsageWorkloadMonth
from fleetd.services.accounting import ledger, usage, usage_workloads

TODAY = dt.date(2026, 3, 24)
ADMIN = Principal(kind="api", id="admin", role="admin", name="admin")
RANGES = [
    ("2026-03-01", "2026-03-31"),  # the whole month (to today)
    ("2026-03-01", "2026-03-24"),
    ("2026-03-01", "2026-04-30"),  # on past today and the month's end: still this month's rows
    ("2026-03-01", "2026-03-15"),
    ("2026-03-10", "2026-03-20"),
    ("2026-03-16", "2026-03-31"),
    ("2026-03-05", "2026-03-05"),
    ("2026-03-01", "2026-03-03"),
    ("2026-03-25", "2026-03-31"),  # after today: nothing
    ("2026-02-01", "2026-02-28"),  # a whole month before
    ("2026-02-20", "2026-03-10"),  # over two months: the day rows
    ("2026-02-01", "2026-03-31"),
]
FILTERS = [
    {},
    {"team": "team-1"},
    {"owner": "user-2"},
    {"fleet": "gpu-a"},
    {"fleet": "gpu-b", "team": "team-0"},
    {"fleet": "nowhere"},
]


def fill(seed):
    """Day, month and fleet-month sums of 90 workloads written by the ledger's own code, in five
    batches of shuffled pieces (so that a month row's span widens in later batches, back in time as
    well as forward): one day, two days across midnight, two days weeks apart, every day from late
    February on, in one fleet or two; instance volumes' storage. Figures are multiples of 2^-10,
    added exactly in any order; costs of a few values, so that many are equal."""
    rng = random.Random(seed)
    pieces = []
    march = [dt.date(2026, 3, d) for d in range(1, TODAY.day + 1)]
    for i in range(90):
        kind = "instance" if i % 4 == 0 else "job"
        record = SimpleNamespace(
            id=f"s{i:03d}" if kind == "instance" else f"r{i:03d}",
            kind=kind,
            workload_id=f"w{i:03d}",
            team=f"team-{i % 3}",
            project="",
            owner=f"user-{i % 5}",
            owner_token_id=f"tok{i % 5}",
            gpu_model="H100",
        )
        fleets = ("gpu-a", "gpu-b", "") if i % 7 == 0 else (rng.choice(("gpu-a", "gpu-b", "")),)
        pattern = i % 5
        if pattern == 0:
            days = [rng.choice(march)]
        elif pattern == 1:
            start = rng.choice(march[:-1])
            days = [start, start + dt.timedelta(days=1)]
        elif pattern == 2:
            days = sorted(rng.sample(march, 2))
        elif pattern == 3:
            days = [dt.date(2026, 2, 25) + dt.timedelta(days=d) for d in range(28)]
        else:
            days = [rng.choice(march[:3]), rng.choice(march[-3:])]
        for n, day in enumerate(days):
            fleet = fleets[n % len(fleets)]
            allocated = float(rng.randrange(1, 10**5))
            pieces.append(
                (
                    day,
                    kind,
                    SimpleNamespace(**vars(record), fleet=fleet),
                    (allocated, allocated / 2, allocated, rng.choice((0.5, 1.0, 1.5, 4.0)), n == 0),
                )
            )
            if kind == "instance" and n == 0:  # its volume's storage, counted on the instance
                volume = SimpleNamespace(**vars(record), fleet=fleet)
                volume.id = record.workload_id
                pieces.append(
                    (day, "storage", volume, (0.0, 0.0, 0.0, rng.randrange(1, 999) / 1024, 0))
                )
    rng.shuffle(pieces)
    for batch in range(5):
        run = ledger._Pass(dt.datetime(2026, 3, 25), book=ledger.PriceBook([]))
        for day, kind, record, (allocated, used, sampled, cost, runs) in pieces[batch::5]:
            at = dt.datetime.combine(day, dt.time(rng.randrange(24)))
            run.add(at, kind, record, allocated, used, sampled, cost, int(runs))
        with write_transaction():
            run.write_days()


def expected(first, last, own=None, team=None, owner=None, fleet=None):
    """The report's rows as grouping the range's day rows makes them, its totals' cost, and whether
    the cut falls among equal costs."""
    sums: dict[str, list] = {}
    for row in UsageWorkloadDay.select():
        day = row.day if isinstance(row.day, dt.date) else dt.date.fromisoformat(str(row.day))
        if not first <= day <= last:
            continue
        wanted = {"owner_token_id": own, "team": team, "owner": owner, "fleet": fleet}
        if any(v is not None and getattr(row, k) != v for k, v in wanted.items()):
            continue
        entry = sums.setdefault(f"{row.kind}/{row.workload_id}", [0.0, 0.0, 0.0, 0.0, 0])
        for i, name in enumerate(usage_workloads.SUMS):
            entry[i] += getattr(row, name)
    rows = sorted(sums.items(), key=lambda item: (-item[1][3], item[0]))
    costs = [figures[3] for _, figures in rows]
    cut = usage_workloads.MAX_WORKLOAD_ROWS
    tied = len(costs) > cut and costs[cut - 1] == costs[cut]  # the cut among them goes by name
    return (
        [{"group": group, **usage._figures(*figures)} for group, figures in rows[:cut]],
        round(sum(costs), 6),
        tied,
    )


def _near(value, rel):
    return pytest.approx(value, rel=rel) if isinstance(value, float) else value


@pytest.fixture
def rt(app, clock):
    with app.app_context(), database.connection_context():
        yield SimpleNamespace(clock=SimpleNamespace(now=lambda: dt.datetime(2026, 3, 24, 18)))


def check_reports(rt, monkeypatch, few, rel=0.0):
    """Every range of RANGES with every filter of FILTERS, and as a submitter, against expected(),
    `few` the FEW_RUNS in force: the month rows where the report chooses them (30, of about 100
    runs in all: either way), always (-1) or never (a million).
    `rel`: how far apart figures may be (PostgreSQL stores them as `real`, 24-bit mantissas: a
    month row and the sum of its day rows agree to about 1e-7 of their size)."""
    fill(seed=7)
    monkeypatch.setattr(usage_workloads, "MAX_WORKLOAD_ROWS", 12)  # the cut falls inside
    monkeypatch.setattr(usage_workloads, "FEW_RUNS", few)
    submitter = Principal(kind="api", id="tok1", role="submitter", name="user-1")
    checked = tied = 0
    for start, end in RANGES:
        first, last = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
        cases = [(ADMIN, f, None) for f in FILTERS] + [(submitter, {}, "tok1")]
        for who, filters, own in cases:
            report = usage.usage_report(rt, who, "workload", first, last, **filters)
            rows, cost, at_cut = expected(first, last, own=own, **filters)
            if rel:
                rows = [{k: _near(v, rel) for k, v in row.items()} for row in rows]
            assert report["rows"] == rows, (start, end, filters, who.role)
            assert report["totals"]["cost"] == pytest.approx(cost, rel=rel, abs=1e-6)
            checked += bool(rows)
            tied += at_cut
    assert checked > 50 and tied > 5


@pytest.mark.parametrize(
    "few", [30, -1, 10**6], ids=["chosen", "month rows", "day rows but whole months"]
)
def test_reports_by_workload_match_the_day_rows_of_their_range(rt, monkeypatch, few):
    check_reports(rt, monkeypatch, few)


def test_month_rows_keep_the_first_and_last_day_of_their_workloads_day_rows(rt):
    fill(seed=11)
    days: dict[tuple, list] = {}
    for row in UsageWorkloadDay.select():
        day = dt.date.fromisoformat(str(row.day))
        month = day.replace(day=1)
        for key in (
            (month, row.kind, row.workload_id),
            (month, row.fleet, row.kind, row.workload_id),
        ):
            days.setdefault(key, []).append(day)
    spans = {
        (dt.date.fromisoformat(str(m.month)), m.kind, m.workload_id): (m.first_day, m.last_day)
        for m in UsageWorkloadMonth.select()
    }
    spans.update(
        {
            (dt.date.fromisoformat(str(m.month)), m.fleet, m.kind, m.workload_id): (
                m.first_day,
                m.last_day,
            )
            for m in UsageWorkloadFleetMonth.select()
        }
    )
    assert {k: (str(a), str(b)) for k, (a, b) in spans.items()} == {
        k: (str(min(v)), str(max(v))) for k, v in days.items()
    }
