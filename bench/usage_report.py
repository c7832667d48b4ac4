#!/usr/bin/env python3
"""Usage reports over a month of a 1,000-GPU fleet's runs: about a million ledger rows in a fresh
SQLite database, with the day sums written by the ledger's own code
(fleetd.services.accounting.ledger), then each report of GET /api/v1/usage timed through
fleetd.services.accounting.usage (no HTTP), best of `--repeat`.

    .venv/bin/python bench/usage_report.py --runs 1000000
    .venv/bin/python bench/usage_report.py --runs 1000000 --database-url postgresql://USER@HOST:PORT/DB

Prints one JSON line per step. A PostgreSQL database is migrated and filled when empty, and timed
as it is when an earlier run filled it.
"""

import argparse
import datetime as dt
import json
import pathlib
import random
import sys
import tempfile
import time
from types import SimpleNamespace

import peewee

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from fleetd.auth import Principal  # noqa: E402
from fleetd.db import bind, database, open_database, upgrade  # noqa: E402
from fleetd.services.accounting import ledger, periods, usage

MONTH = dt.datetime(2026, 3, 1)
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S")
FLEETS = ("gpu-a", "gpu-b", "gpu-c", "gpu-d")


class _Clock:
    def __init__(self, now):
        self._now = now

    def now(self):
        return self._now

    def monotonic(self):
        return time.monotonic()


class _Runtime:
    def __init__(self, now):
        self.clock = _Clock(now)


def generate(runs, teams, owners, seed):
    """`runs` ended runs spread over the month as ledger rows (dicts): 1 to 8 GPUs for a minute to
    half an hour (about 1,000 GPUs busy on average for a million runs); each owner in one team and
    one fleet, each fleet of one GPU model."""
    rng = random.Random(seed)
    seconds = 31 * 86400
    for i in range(runs):
        start = MONTH + dt.timedelta(seconds=rng.randrange(seconds - 1800))
        length = rng.randrange(60, 1800)
        gpus = float(rng.choice((1, 1, 1, 2, 4, 8)))
        owner = rng.randrange(owners)
        fleet = owner % len(FLEETS)
        price = (4.0, 2.5, 1.2, 4.0)[fleet]
        end = start + dt.timedelta(seconds=length)
        yield {
            "id": f"t{i:08d}.1",
            "kind": "instance" if i % 10 == 0 else "job",
            "workload_id": f"w{i:08d}",
            "workload_name": f"run-{i}",
            "task_id": f"t{i:08d}",
            "job_id": f"j{i:08d}",
            "rank": 0,
            "attempt": 1,
            "owner": f"user-{owner}",
            "owner_token_id": f"tok{owner:05d}",
            "team": f"team-{owner % teams}",
            "project": "",
            "fleet": FLEETS[fleet],
            "node_id": f"n{i % 125:04d}",
            "gpu_model": MODELS[fleet % len(MODELS)],
            "priority_class": "on-demand",
            "gpus": gpus,
            "gpu_uuids": "[]",
            "bid": None,
            "started_at": start,
            "ended_at": end,
            "accounted_until": end,
            "gpu_seconds": gpus * length,
            "used_gpu_seconds": gpus * length * rng.random(),
            "sampled_gpu_seconds": gpus * length,
            "cost": gpus * length / 3600 * price,
            "price_per_hour": price,
        }


def fill(runs, teams, owners, seed, batch=2000, sums_every=50_000):
    """Write the ledger rows, and their sums (per day; per workload and day; per workload and
    month, and per workload, month and fleet) through the ledger's own code (_Pass.add,
    write_days), as its passes would."""
    rows, run = [], ledger._Pass(MONTH + dt.timedelta(days=31))
    columns = None
    for i, row in enumerate(generate(runs, teams, owners, seed), 1):
        record = SimpleNamespace(**row)
        run.add(record.started_at, record.kind, record, runs=1)
        for a, b in periods.split_days(record.started_at, record.ended_at):
            share = (b - a).total_seconds() / (record.ended_at - record.started_at).total_seconds()
            run.add(
                a,
                record.kind,
                record,
                record.gpu_seconds * share,
                record.used_gpu_seconds * share,
                record.sampled_gpu_seconds * share,
                record.cost * share,
            )
        columns = columns or list(row)
        rows.append(tuple(row[c] for c in columns))
        if len(rows) >= batch:
            _insert(columns, rows)
            rows = []
        if i % sums_every == 0:
            with database.atomic():
                run.write_days()
    if rows:
        _insert(columns, rows)
    with database.atomic():
        run.write_days()


def _insert(columns, rows):
    """Plain executemany on SQLite, execute_values on PostgreSQL (peewee's insert_many builds a
    statement per batch, slower for a million rows)."""
    sql = f"INSERT INTO usage_record ({', '.join(columns)}) VALUES "  # nosec B608  # fixed names
    with database.atomic():
        cursor = database.cursor()
        if isinstance(database.obj, peewee.PostgresqlDatabase):
            from psycopg2.extras import execute_values

            execute_values(cursor, sql + "%s", rows, page_size=len(rows))
        else:
            cursor.executemany(sql + f"({', '.join('?' for _ in columns)})", rows)


def timed(fn, repeat):
    best, result = None, None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        took = time.perf_counter() - started
        best = took if best is None else min(best, took)
    return best, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--teams", type=int, default=40)
    parser.add_argument("--owners", type=int, default=800)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument(
        "--database-url",
        help="an empty PostgreSQL database (default: SQLite in a temporary directory)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = open_database(args.database_url or f"sqlite:///{tmp}/usage.db")
        upgrade(db)
        bind(db)
        with database.connection_context():
            started = time.perf_counter()
            filled = database.execute_sql("SELECT COUNT(*) FROM usage_record").fetchone()[0]
            if not filled:  # a PostgreSQL database filled by an earlier run is timed again as it is
                fill(args.runs, args.teams, args.owners, args.seed)
                if isinstance(database.obj, peewee.PostgresqlDatabase):
                    database.execute_sql(
                        "ANALYZE"
                    )  # what autovacuum does to a table this size soon after
            counts = {
                f"{table}_rows": database.execute_sql(f"SELECT COUNT(*) FROM {table}").fetchone()[0]  # nosec B608
                for table in (
                    "usage_record",
                    "usage_day",
                    "usage_workload_day",
                    "usage_workload_month",
                    "usage_workload_fleet_month",
                )
            }
            print(
                json.dumps(
                    {
                        "step": "fill" if not filled else "reuse",
                        **counts,
                        "seconds": round(time.perf_counter() - started, 1),
                    }
                ),
                flush=True,
            )
            rt = _Runtime(MONTH + dt.timedelta(days=31))
            admin = Principal(kind="api", id="bench", role="admin", name="bench")
            submitter = Principal(kind="api", id="tok00007", role="submitter", name="user-7")
            cases = [
                ("team", admin, {}),
                ("owner", admin, {}),
                ("fleet", admin, {}),
                ("gpu_model", admin, {}),
                ("day", admin, {}),
                ("team", submitter, {}),
                ("workload", admin, {}),
                ("workload", admin, {"team": "team-3"}),
                ("workload", admin, {"fleet": "gpu-a"}),
                ("workload", submitter, {}),
            ]
            whole, half = (
                (MONTH + dt.timedelta(days=30)).date(),
                (MONTH + dt.timedelta(days=14)).date(),
            )
            # part of the month: month rows inside it, day rows of those that straddle its edge
            cases += [("workload", admin, {"end": half})]
            for group_by, who, extra in cases:
                extra = {"end": whole, **extra}
                took, report = timed(
                    lambda: usage.usage_report(rt, who, group_by, MONTH.date(), **extra),
                    args.repeat,
                )
                extra["end"] = extra["end"].isoformat()
                print(
                    json.dumps(
                        {
                            "step": "report",
                            "group_by": group_by,
                            "as": who.role,
                            **extra,
                            "rows": len(report["rows"]),
                            "runs": report["totals"]["runs"],
                            "gpu_hours": round(report["totals"]["gpu_hours_allocated"]),
                            "seconds": round(took, 4),
                        }
                    ),
                    flush=True,
                )
        db.close()


if __name__ == "__main__":
    main()
