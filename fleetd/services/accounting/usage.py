"""Usage reports from the ledger (fleetd.services.accounting.ledger): GPU-hours allocated and used,
efficiency and cost by team, owner, fleet, GPU model, day or workload; a workload's running cost; an
instance volume's storage cost; the workloads holding GPUs that stay idle; the storage price.

These are plain functions (principal and runtime in, dicts out) for the API, the CLI's API
calls and the console alike."""

import csv
import datetime as dt
import io

from peewee import fn

from fleetd.clock import isoformat
from fleetd.db import write_transaction
from fleetd.errors import InvalidRequest
from fleetd.models import (
    GpuSample,
    Instance,
    Job,
    StorageRecord,
    Task,
    TaskState,
    UsageDay,
    User,
)
from fleetd.services.accounting.ledger import PriceBook, record_price, runs_to_date, storage_price
from fleetd.services.accounting.periods import GB, STORAGE
from fleetd.services.accounting.usage_workloads import narrowed, workload_rows
from fleetd.services.accounting.volumes import storage_cost

GROUP_BY = ("team", "project", "owner", "user", "fleet", "gpu_model", "day", "workload")
COLUMNS = ("group", "gpu_hours_allocated", "gpu_hours_used", "efficiency", "cost", "runs")
MAX_DAYS = 3660  # a report spans at most about ten years


def _figures(allocated, used, sampled, cost, runs):
    """A report row's figures from seconds: used and efficiency are None where no samples came."""
    return {
        "gpu_hours_allocated": round(allocated / 3600, 6),
        "gpu_hours_used": round(used / 3600, 6) if sampled else None,
        "efficiency": round(used / sampled, 6) if sampled else None,
        "cost": round(cost, 6),
        "runs": int(runs),
    }


def report_days(now, start=None, end=None):
    """(first day, last day) of a report: `start` and `end` (dates or datetimes, UTC) at day
    granularity, both days included; by default from the first of this month to today."""
    first = start or dt.datetime(now.year, now.month, 1)
    last = end or now
    first = first.date() if isinstance(first, dt.datetime) else first
    last = last.date() if isinstance(last, dt.datetime) else last
    if last < first:
        raise InvalidRequest("`to` is before `from`", {"fields": {"to": ["on or after from"]}})
    if (last - first).days > MAX_DAYS:
        raise InvalidRequest(
            f"a report spans at most {MAX_DAYS} days", {"fields": {"from": ["too far back"]}}
        )
    return first, last


def usage_report(
    rt, principal, group_by="team", start=None, end=None, team=None, owner=None, fleet=None
):
    """GPU-hours allocated and used, efficiency, cost and runs per group over whole UTC days, with
    totals: admins see everyone's, a submitter its own. `runs` counts the runs that started in the
    range; cost includes instance volumes' storage. By workload, only the MAX_WORKLOAD_ROWS
    costliest workloads are listed (the totals count them all)."""
    if group_by not in GROUP_BY:
        raise InvalidRequest(
            f"group_by must be one of {', '.join(GROUP_BY)}",
            {"fields": {"group_by": [f"one of {', '.join(GROUP_BY)}"]}},
        )
    first, last = report_days(rt.clock.now(), start, end)
    own = None if principal.role == "admin" else principal.owner_id
    # by workload, the totals count every workload, not only the rows listed
    by = "kind" if group_by == "workload" else group_by
    rows = _by_dimension(by, first, last, own, team, owner, fleet)
    totals = [0.0, 0.0, 0.0, 0.0, 0]
    for _, sums in rows:
        for i, value in enumerate(sums):
            totals[i] += value or 0
    if group_by == "workload":
        today = rt.clock.now().date()
        rows = workload_rows(first, last, today, totals[4], own, team, owner, fleet)
    return {
        "from": first.isoformat(),
        "to": last.isoformat(),
        "group_by": group_by,
        "rows": [{"group": group, **_figures(*sums)} for group, sums in rows],
        "totals": _figures(*totals),
    }


def _by_dimension(group_by, first, last, own, team, owner, fleet):
    # By user: by owner id (a user's, or a token's of its own), named by the user's login.
    column = UsageDay.owner_token_id if group_by == "user" else getattr(UsageDay, group_by)
    query = UsageDay.select(
        column,
        fn.MAX(UsageDay.owner),
        fn.SUM(UsageDay.gpu_seconds),
        fn.SUM(UsageDay.used_gpu_seconds),
        fn.SUM(UsageDay.sampled_gpu_seconds),
        fn.SUM(UsageDay.cost),
        fn.SUM(UsageDay.runs),
    ).where((UsageDay.day >= first) & (UsageDay.day <= last))
    where = narrowed(UsageDay, True, own, team, owner, fleet)
    if where is not True:
        query = query.where(where)
    rows = list(query.group_by(column).order_by(column).tuples().execute())
    logins: dict[str, str] = {}
    if group_by == "user" and rows:
        ids = [r[0] for r in rows]
        logins = {u.id: u.login for u in User.select(User.id, User.login).where(User.id.in_(ids))}
    out = []
    for group, owner_name, *sums in rows:
        if group_by == "user":
            group = logins.get(group) or f"token:{owner_name}"
        out.append(
            (
                group.isoformat()
                if isinstance(group, dt.date)
                else (str(group) if group else None),
                sums,
            )
        )
    if group_by == "user":
        out.sort(key=lambda row: row[0] or "")
    return out


def usage_by_day_and_team(rt, principal, start=None, end=None, team=None):
    """GPU-hours allocated and used and cost per UTC day and team (for a stacked chart of
    GPU-hours by team over time): [{day, team, gpu_hours_allocated, gpu_hours_used, efficiency,
    cost, runs}], by day then team, one query. A submitter gets its own usage only; `team` keeps
    that team's."""
    first, last = report_days(rt.clock.now(), start, end)
    query = UsageDay.select(
        UsageDay.day,
        UsageDay.team,
        fn.SUM(UsageDay.gpu_seconds),
        fn.SUM(UsageDay.used_gpu_seconds),
        fn.SUM(UsageDay.sampled_gpu_seconds),
        fn.SUM(UsageDay.cost),
        fn.SUM(UsageDay.runs),
    ).where((UsageDay.day >= first) & (UsageDay.day <= last))
    where = narrowed(
        UsageDay, True, None if principal.role == "admin" else principal.owner_id, team, None, None
    )
    if where is not True:
        query = query.where(where)
    rows = (
        query.group_by(UsageDay.day, UsageDay.team)
        .order_by(UsageDay.day, UsageDay.team)
        .tuples()
        .execute()
    )
    return [
        {
            "day": day.isoformat() if isinstance(day, dt.date) else str(day),
            "team": team or None,
            **_figures(*sums),
        }
        for day, team, *sums in rows
    ]


def workload_usage(rt, principal, workload_id):
    """A job's or instance's own usage from the ledger (for its page): its runs, each
    {id, attempt, node_id, fleet, gpu_model, gpus, started_at, ended_at, gpu_hours_allocated,
    gpu_hours_used, efficiency, cost}, oldest first, and their totals with the storage cost of an
    instance's volume. Admins see any workload's, a submitter its own (others read as empty)."""
    records = runs_to_date(
        workload_id, rt.clock.now(), samples=True
    )  # ended runs to their ends, at once
    runs, totals = [], [0.0, 0.0, 0.0, 0.0, 0]
    for record in records:
        if principal.role != "admin" and record.owner_token_id != principal.owner_id:
            continue
        sums = (
            record.gpu_seconds,
            record.used_gpu_seconds,
            record.sampled_gpu_seconds,
            record.cost,
            1,
        )
        for i, value in enumerate(sums):
            totals[i] += value
        runs.append(
            {
                "id": record.id,
                "attempt": record.attempt,
                "node_id": record.node_id or None,
                "fleet": record.fleet or None,
                "gpu_model": record.gpu_model or None,
                "gpus": record.gpus,
                "started_at": isoformat(record.started_at),
                "ended_at": isoformat(record.ended_at),
                **{k: v for k, v in _figures(*sums).items() if k != "runs"},
            }
        )
    storage = StorageRecord.get_or_none_by_id(workload_id)
    if storage is not None and (
        principal.role == "admin" or storage.owner_token_id == principal.owner_id
    ):
        totals[3] += storage_costs(rt, [workload_id]).get(workload_id, 0.0)
    return {"workload_id": workload_id, "runs": runs, "totals": _figures(*totals)}


def report_csv(report):
    """A report's rows as CSV text (the columns of COLUMNS; empty where a figure is unknown)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in report["rows"]:
        writer.writerow(["" if row[c] is None else row[c] for c in COLUMNS])
    return out.getvalue()


def workload_cost(rt, workload_id, book=None):
    """(price per hour, cost so far) of a job or instance from the ledger as its next pass will
    leave it (runs_to_date: ended runs to their ends, running ones to now, at the prices in force).
    The price is its running runs'; once none runs, its last attempt's (None: unpriced, or it never
    ran)."""
    runs = runs_to_date(workload_id, rt.clock.now(), book or PriceBook.load())
    return _price_per_hour(runs), round(sum((r.cost for r in runs), 0.0), 6)


def _price_per_hour(runs):
    """Per hour, the runs that run now; once none does, the last run of each rank in the last
    attempt."""
    current = [r for r in runs if r.ended_at is None]
    if not current and runs:
        last = max(r.attempt for r in runs)
        by_rank = {}
        for (
            record
        ) in runs:  # oldest first: a requeue's later run of a rank replaces the earlier one
            if record.attempt == last:
                by_rank[record.rank] = record
        current = list(by_rank.values())
    prices = [r.gpus * r.price_per_hour for r in current if r.price_per_hour is not None]
    return round(sum(prices), 6) if prices else None


def with_costs(rt, jobs):
    """The jobs, each with its `price_per_hour` and `cost_so_far` (workload_cost; the prices read
    once for all of them): what a view of a job shows."""
    book = None
    for job in jobs:
        if job.started_at is None:  # never placed (started_at stays once set): no run to price
            job.price_per_hour, job.cost_so_far = None, 0.0
            continue
        book = book or PriceBook.load()
        job.price_per_hour, job.cost_so_far = workload_cost(rt, job.id, book)
    return jobs


def storage_costs(rt, instance_ids):
    """{instance id: its volume's storage cost so far}: the ledger's, carried on to now at the
    storage price (an instance the ledger has not seen yet is absent)."""
    if not instance_ids:
        return {}
    now = rt.clock.now()
    book = None
    out = {}
    for record in StorageRecord.select().where(StorageRecord.id.in_(list(instance_ids))):
        cost = record.cost
        if record.ended_at is None and now > record.accounted_until:
            book = book or PriceBook.load()
            cost += storage_cost(record.volume_bytes, book, record.accounted_until, now)
        out[record.id] = round(cost, 6)
    return out


def get_storage_price():
    """The storage price per GB-month in force (None: storage is free)."""
    return {"per_gb_month": storage_price(), "unit_bytes": GB}


def set_storage_price(rt, per_gb_month):
    """Set the storage price per GB-month (admin), in force from now: the ledger prices volumes
    piecewise, so what was accounted before keeps its price."""
    with write_transaction():
        record_price(rt.clock.now(), STORAGE, "", per_gb_month)
    return get_storage_price()


def idle_workloads(rt, principal, min_minutes=30, below_percent=10.0):
    """Workloads holding GPUs whose GPUs all stayed under `below_percent` utilisation for at least
    `min_minutes`, by the GPU samples stored (the last day's), longest idle first: [{kind, id, name,
    owner, team, gpus, idle_minutes, idle_since, cost_so_far}]. A run idles since its start or its
    GPUs' last sample at or over the threshold; a run with no sample in the last `min_minutes` is
    not listed (nothing says it idles). Admins see all, a submitter its own."""
    now = rt.clock.now()
    window = now - dt.timedelta(minutes=min_minutes)
    query = Task.select(Task.id, Task.job, Task.gpus, Task.started_at).where(
        (Task.state == TaskState.RUNNING.value)
        & Task.started_at.is_null(False)
        & (Task.started_at <= window)
    )
    if principal.role != "admin":
        query = query.join(Job).where(Job.owner_token_id == principal.owner_id)
    tasks = list(query)
    uuids = {
        g["uuid"] for t in tasks for g in t.gpus or [] if isinstance(g, dict) and g.get("uuid")
    }
    samples: dict[str, list[tuple]] = {}  # uuid -> [(at, utilisation)]
    if uuids:
        oldest = max(
            min(t.started_at for t in tasks if t.started_at is not None),  # all: the query says so
            now - dt.timedelta(days=1),
        )
        for uuid, at, util in (
            GpuSample.select(GpuSample.uuid, GpuSample.at, GpuSample.utilization_percent)
            .where(
                GpuSample.uuid.in_(sorted(uuids))
                & (GpuSample.at >= oldest)
                & (GpuSample.at <= now)
                & GpuSample.utilization_percent.is_null(False)
            )
            .tuples()
            .execute()
        ):
            samples.setdefault(uuid, []).append((at, util))
    jobs = (
        {j.id: j for j in Job.select().where(Job.id.in_([t.job_id for t in tasks]))}
        if tasks
        else {}
    )
    by_workload: dict[str, dict] = {}  # instance or job id -> its row
    book = PriceBook.load()
    for task in tasks:
        job = jobs.get(task.job_id)
        held = [g["uuid"] for g in task.gpus or [] if isinstance(g, dict) and g.get("uuid")]
        readings = [
            (at, util)
            for uuid in held
            for at, util in samples.get(uuid, ())
            if at >= task.started_at
        ]
        if job is None or not readings or max(at for at, _ in readings) < window:
            continue
        busy = [at for at, util in readings if util >= below_percent]
        since = max(busy) if busy else task.started_at
        if since > window:
            continue
        key = job.instance_id or job.id
        entry = by_workload.get(key)
        if entry is None:
            name = job.name
            if job.instance_id:
                inst = Instance.select(Instance.name).where(Instance.id == job.instance_id).first()
                name = inst.name if inst is not None else name
            entry = by_workload[key] = {
                "kind": "instance" if job.instance_id else "job",
                "id": key,
                "name": name,
                "owner": job.owner,
                "team": job.team,
                "gpus": 0.0,
                "idle_minutes": 0.0,
                "idle_since": None,
                "cost_so_far": workload_cost(rt, key, book)[1],
            }
        entry["gpus"] += float((job.spec.get("resources") or {}).get("gpus") or len(held))
        minutes = round((now - since).total_seconds() / 60, 3)
        if minutes > entry["idle_minutes"]:
            entry["idle_minutes"], entry["idle_since"] = minutes, isoformat(since)
    return sorted(by_workload.values(), key=lambda e: (-e["idle_minutes"], e["id"]))
