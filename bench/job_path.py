#!/usr/bin/env python3
"""fleetd's own CPU per job on the agent protocol path, in one process: no HTTP server, no agent.

Each job is submitted, placed by a scheduling pass, acquired, started and finished through
the Flask test client against a real SQLite database (synchronous=FULL, one fsync per
commit), with one enrolled node. By default one job at a time, each call on its own (a pass per
job, a start report apart from the finish); with ``--batch N`` in the shape the agent and the
scheduler loop give a busy fleetd: N submits, one pass, one acquire of up to N assignments, one
``/agent/finish`` of the N reports each carrying its start (short tasks report so). The figure
is steadier than the end-to-end run of bench/control_plane.py, whose agents and load generator
share the cores, so it is the one to compare when changing the request path, the services or the
statements. Also counts the SQL
statements per job.

    .venv/bin/python bench/job_path.py --jobs 400
"""

import argparse
import cProfile
import pathlib
import pstats
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from fleetd.app import create_app  # noqa: E402
from fleetd.clock import Clock  # noqa: E402
from fleetd.db import database, open_database, upgrade  # noqa: E402
from fleetd.services.identity.tokens import issue_first_admin_token  # noqa: E402
from fleetd.services.placement.scheduling import run_pass  # noqa: E402
from fleetd.settings import Settings  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument(
        "--batch",
        type=int,
        default=0,
        metavar="N",
        help="N jobs per round: N submits, one pass, one acquire, one batched finish",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile the jobs (cProfile) and print the N costliest functions per job",
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="also print the SQL statements of one measured round",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings.load(environ={}, data_dir=data_dir)
        db = open_database(settings.database_url, settings.sqlite_synchronous)
        upgrade(db)
        app = create_app(settings, clock=Clock(), db=db)
        with database.connection_context():
            admin = issue_first_admin_token(Clock().now())
        http = app.test_client()

        def call(path, body, token=admin, agent=False):
            headers = {"Authorization": f"Bearer {token}"}
            if agent:
                headers["X-Fleet-Protocol"] = "1"
            resp = http.post(path, json=body, headers=headers)
            assert resp.status_code < 300, (path, resp.status_code, resp.get_json())
            return resp.get_json(silent=True)

        call("/api/v1/fleets", {"name": "bench"})
        join = call("/api/v1/fleets/bench/join-tokens", {})["token"]
        gpus = [
            {
                "uuid": f"GPU-{i}",
                "index": i,
                "model": "NVIDIA H100 80GB HBM3",
                "memory_total_bytes": 80 << 30,
            }
            for i in range(8)
        ]
        node = call(
            "/api/v1/agent/register",
            {
                "hostname": "h",
                "machine_id": "m",
                "agent_version": "bench",
                "address": "127.0.0.1",
                "gpus": gpus,
                "resources": {"cpu_count": 64, "memory_bytes": 1 << 39},
            },
            token=join,
            agent=True,
        )
        session = node["session_token"]
        call("/api/v1/agent/heartbeat", {"tasks": []}, token=session, agent=True)

        def one_job():
            call("/api/v1/jobs", {"name": "noop", "command": ["true"]})
            task = call("/api/v1/agent/acquire", {"wait_seconds": 0}, token=session, agent=True)[
                "assignment"
            ]
            call(
                f"/api/v1/agent/tasks/{task['task_id']}/start",
                {"epoch": task["epoch"], "pid": 1},
                token=session,
                agent=True,
            )
            call(
                f"/api/v1/agent/tasks/{task['task_id']}/finish",
                {"epoch": task["epoch"], "outcome": "succeeded", "exit_code": 0},
                token=session,
                agent=True,
            )

        def batch_of_jobs(n):
            for _ in range(n):
                call("/api/v1/jobs", {"name": "noop", "command": ["true"]})
            with app.app_context(), database.connection_context():
                run_pass(rt, full=False)
            got = call(
                "/api/v1/agent/acquire",
                {"wait_seconds": 0, "max_assignments": n},
                token=session,
                agent=True,
            )["assignments"]
            assert len(got) == n, f"{len(got)} of {n} jobs placed"
            finishes = [
                {
                    "task_id": task["task_id"],
                    "epoch": task["epoch"],
                    "outcome": "succeeded",
                    "exit_code": 0,
                    "pid": 1,
                    "started_seconds_ago": 0.01,
                }
                for task in got
            ]
            call("/api/v1/agent/finish", {"finishes": finishes}, token=session, agent=True)

        rt = app.extensions["fleetd"]
        if args.batch:
            # As under `fleetd serve`, a submit's kick only asks the loop for a pass (a thread
            # that never runs here): the round runs the one pass itself.
            rt.scheduler._thread = threading.current_thread()
            rounds = max(1, args.jobs // args.batch)
            args.jobs = rounds * args.batch
            one_job = lambda: batch_of_jobs(args.batch)  # noqa: E731
        else:
            rounds = args.jobs
        for _ in range(20):  # warm-up: statements compiled, caches filled
            one_job()
        statements = []
        execute_sql = type(db).execute_sql
        type(db).execute_sql = lambda self, sql, params=None: (
            statements.append(sql) or execute_sql(self, sql, params)
        )
        try:
            one_job()
        finally:
            type(db).execute_sql = execute_sql
        if args.statements:
            for sql in statements:
                print(" ".join(str(sql).split())[:240])
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            one_job()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(lambda: [one_job() for _ in range(rounds)])
            _print_profile(profile, args.jobs, args.profile)
    print(
        f"{args.jobs} jobs: fleetd CPU {1000 * cpu / args.jobs:.2f} ms/job, wall "
        f"{1000 * wall / args.jobs:.2f} ms/job, "
        f"{len(statements) / (args.batch or 1):.1f} SQL statements/job (besides BEGIN/COMMIT)"
    )


def _print_profile(profile, jobs, top):
    """The costliest functions per job: by their own time, and fleetd's by time with callees."""
    stats = pstats.Stats(profile).stats
    rows = [
        (tt / jobs * 1000, ct / jobs * 1000, calls / jobs, f"{pathlib.Path(f).name}:{line} {fn}")
        for (f, line, fn), (_, calls, tt, ct, _) in stats.items()
    ]
    print(f"own time per job (ms), top {top}:")
    for own, _, calls, name in sorted(rows, reverse=True)[:top]:
        print(f"  {own:7.3f}  {calls:7.1f} calls  {name}")
    print(f"fleetd's functions with callees per job (ms), top {top}:")
    ours = [
        (cum, calls, name)
        for (f, line, fn), (_, calls, tt, cum, _) in stats.items()
        if "/fleetd/" in f
        for name in [f"{pathlib.Path(f).name}:{line} {fn}"]
    ]
    for cum, calls, name in sorted(ours, reverse=True)[:top]:
        print(f"  {cum / jobs * 1000:7.3f}  {calls / jobs:7.1f} calls  {name}")


if __name__ == "__main__":
    main()
