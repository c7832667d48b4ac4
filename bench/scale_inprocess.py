#!/usr/bin/env python3
"""The scheduling pass in one process, for bench/scale.py: N nodes x 8 GPUs and a backlog of jobs
that fit nowhere in a fresh SQLite database; passes timed through
fleetd.services.placement.scheduling.run_pass (no HTTP), with this process's memory. One JSON line
per step on stdout, so that a run cut short by its time limit still says how far it got. Run by
bench/scale.py, one fresh process per size.

    .venv/bin/python bench/scale_inprocess.py --nodes 10000 --backlog 3000
    .venv/bin/python bench/scale_inprocess.py --nodes 10000 --backlog 3000 --unscoped-backlog
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from fleetd.app import create_app  # noqa: E402
from fleetd.clock import Clock  # noqa: E402
from fleetd.db import database, open_database, upgrade  # noqa: E402
from fleetd.models import Gpu, Node, new_id  # noqa: E402
from fleetd.server import freeze_long_lived  # noqa: E402
from fleetd.services.identity.tokens import issue_first_admin_token  # noqa: E402
from fleetd.services.placement import scheduling
from fleetd.settings import Settings  # noqa: E402

MISSING_GPU_TYPE = "NVIDIA B300"  # no node has it: the backlog fits nowhere
PLACE_SAMPLE = 50  # queued jobs placed one by one in the breakdown
PLACEABLE = 20  # jobs that fit (1 GPU in the big fleet), each submitted before a kicked pass


def proc_status(pid):
    """{VmRSS, VmHWM} of a process in bytes, from /proc."""
    out = {}
    for line in open(f"/proc/{pid}/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def insert_sql(table, columns):
    """INSERT INTO "table" ("a", "b") VALUES (?, ?)."""
    names = ", ".join(f'"{c}"' for c in columns)
    return f'INSERT INTO "{table}" ({names}) VALUES ({", ".join("?" * len(columns))})'


def insert_nodes(database, count, fleet, prefix="sim"):
    """`count` ready nodes of `fleet`, 8 H100s each, written straight into the tables (registering
    through the API, about 200/s here, would take most of 10 minutes at 100k nodes): the columns a
    registration fills, in the models' own formats. Returns their ids."""
    now = Clock().now()
    node_ids = [new_id() for _ in range(count)]
    nf, gf = Node._meta.fields, Gpu._meta.fields
    node_cols = [
        "id",
        "fleet",
        "machine_id",
        "hostname",
        "address",
        "labels",
        "agent_version",
        "status",
        "status_reason",
        "registered_at",
        "last_heartbeat_at",
        "cpu_count",
        "memory_bytes",
        "bundle_sha256",
        "gpu_status",
        "gpu_status_reason",
    ]
    gpu_cols = [
        "node",
        "uuid",
        "index",
        "vendor",
        "model",
        "memory_total_bytes",
        "numa_node",
        "healthy",
        "health_reason",
        "mig_mode",
    ]
    ts = nf["registered_at"].db_value(now)
    labels = nf["labels"].db_value({})
    healthy = gf["healthy"].db_value(True)
    conn = database.connection()
    with database.atomic():
        conn.executemany(
            insert_sql(Node._meta.table_name, [nf[c].column_name for c in node_cols]),
            (
                (
                    nid,
                    fleet,
                    f"{prefix}-{i:06d}",
                    f"{prefix}-{i:06d}",
                    "127.0.0.1",
                    labels,
                    "bench-sim",
                    "ready",
                    "first heartbeat",
                    ts,
                    ts,
                    128,
                    2 << 40,
                    "",
                    "ok",
                    "",
                )
                for i, nid in enumerate(node_ids)
            ),
        )
        conn.executemany(
            insert_sql(Gpu._meta.table_name, [gf[c].column_name for c in gpu_cols]),
            (
                (
                    nid,
                    f"GPU-{prefix}-{i:06d}-{k}",
                    k,
                    "nvidia",
                    "NVIDIA H100 80GB HBM3",
                    80 << 30,
                    k // 4,
                    healthy,
                    "",
                    "disabled",
                )
                for i, nid in enumerate(node_ids)
                for k in range(8)
            ),
        )
    return node_ids


def run(n_nodes, backlog, passes, budget, unscoped=False):
    """Build the fleet and the backlog, then time passes; one JSON line per step."""

    def emit(step, **fields):
        fields.update(step=step, nodes=n_nodes, rss=proc_status(os.getpid()))
        print(json.dumps(fields), flush=True)

    started = time.monotonic()
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings.load(environ={}, data_dir=data_dir, sqlite_synchronous="OFF")
        db = open_database(settings.database_url, settings.sqlite_synchronous)
        upgrade(db)
        clock = Clock()
        app = create_app(settings, clock=clock, db=db)
        rt = app.extensions["fleetd"]
        rt.scheduler.kick = lambda *a, **k: False  # no pass per submit while the backlog is built
        # As fleetd serve does: what a full inventory read or an engine build makes is frozen out of
        # the cyclic collector's full passes.
        rt.inventory.after_full_read = rt.engines.after_build = freeze_long_lived
        with database.connection_context():
            admin = issue_first_admin_token(clock.now())
        http = app.test_client()
        headers = {"Authorization": f"Bearer {admin}"}
        assert http.post("/api/v1/fleets", json={"name": "sim"}, headers=headers).status_code == 201
        emit("app")

        t0 = time.perf_counter()
        with database.connection_context():
            node_ids = insert_nodes(database, n_nodes, "sim")
        for nid in node_ids:
            rt.liveness.touch(nid)
        emit("nodes", seconds=round(time.perf_counter() - t0, 2))

        t0 = time.perf_counter()
        spec = {
            "name": "backlog",
            "command": ["true"],
            "node_selector": {"fleet": "sim"},
            "resources": {"gpus": 1, "gpu_types": [MISSING_GPU_TYPE]},
        }
        if unscoped:  # as users mostly submit: the backlog, and the jobs that fit, name no fleet
            del spec["node_selector"]
        for _ in range(backlog):
            resp = http.post("/api/v1/jobs", json=spec, headers=headers)
            assert resp.status_code == 201, resp.get_json()
        emit("backlog", seconds=round(time.perf_counter() - t0, 2), jobs=backlog)

        def heard_from_all():
            for nid in node_ids:  # the nodes heartbeat: none is overdue when the pass looks
                rt.liveness.touch(nid)

        timings = []
        for k in range(passes):
            if k and time.monotonic() - started > budget:
                break
            heard_from_all()
            t0, cpu0 = time.perf_counter(), time.process_time()
            with app.app_context(), database.connection_context():
                outcome = scheduling.run_pass(rt)
            timings.append(time.perf_counter() - t0)
            emit(
                "pass",
                index=k,
                seconds=round(timings[-1], 3),
                cpu_seconds=round(time.process_time() - cpu0, 3),
                outcome=outcome,
            )

        if time.monotonic() - started < budget:
            # Jobs that fit, one at a time, each placed by the pass that its submit would kick
            # (which skips the parked backlog): what a submit to a large fleet costs the scheduler.
            placeable = dict(spec, name="fits", resources={"gpus": 1})
            kicked = []
            heard_from_all()
            for _ in range(PLACEABLE):
                assert http.post("/api/v1/jobs", json=placeable, headers=headers).status_code == 201
                t0 = time.perf_counter()
                with app.app_context(), database.connection_context():
                    outcome = scheduling.run_pass(rt, full=False)
                kicked.append(time.perf_counter() - t0)
                assert outcome["assigned"] == 1, outcome
            kicked.sort()
            emit(
                "placeable",
                jobs=PLACEABLE,
                p50_seconds=round(kicked[len(kicked) // 2], 4),
                max_seconds=round(kicked[-1], 4),
            )

        breakdown = {}
        if time.monotonic() - started < budget:
            breakdown = engine_breakdown(rt, app, database)
            emit("breakdown", **breakdown)

        if time.monotonic() - started < budget:
            # Memory a pass allocates (peak) and keeps (after), by Python's own count; slow, so
            # last.
            tracemalloc.start()
            with app.app_context(), database.connection_context():
                scheduling.run_pass(rt)
            current, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            emit("tracemalloc", pass_peak_bytes=peak, pass_kept_bytes=current)
        # A job that fits: the passes above saw the nodes (a backlog that fits nowhere would also
        # fit nowhere in an empty fleet).
        probe = dict(spec, name="probe", resources={"gpus": 1})
        assert http.post("/api/v1/jobs", json=probe, headers=headers).status_code == 201
        heard_from_all()  # the breakdown took long enough at 100,000 nodes for all to be overdue
        with app.app_context(), database.connection_context():
            emit("probe", outcome=scheduling.run_pass(rt))
        emit("done", seconds=round(time.monotonic() - started, 1))
        db.close()


def engine_breakdown(rt, app, database):
    """Where a pass's time goes, through fleetd's internals (these change as the scheduler is
    rewritten: a missing piece is reported, not fatal)."""
    out = {}
    try:
        from fleetd import scheduler
        from fleetd.models import Job
        from fleetd.services.placement.cluster import ClusterState
        from fleetd.services.placement.terms import task_request
        from fleetd.specs import JobSpec

        with app.app_context(), database.connection_context():
            t0 = time.perf_counter()
            state = ClusterState(
                rt.terms, rt.clock.now(), rt.liveness.is_overdue, rt.liveness.reported_running()
            )
            out["state_load_s"] = round(time.perf_counter() - t0, 3)
            t0 = time.perf_counter()
            snapshot = state.snapshot()
            out["snapshot_s"] = round(time.perf_counter() - t0, 3)
            out["state_nodes"] = len(state.nodes)
            out["state_gpus"] = sum(len(gpus) for gpus in state.gpus.values())
            specs = [job.spec for job in Job.select().where(Job.state == "queued")]
        t0 = time.perf_counter()
        engine = scheduler.PlacementEngine(snapshot)
        out["engine_build_s"] = round(time.perf_counter() - t0, 3)
        # A sample: each place() on its own (no grouping of equal requests, as a pass may do) scans
        # the cluster, and the whole backlog one by one would take minutes at 100k nodes.
        requests = [task_request(JobSpec.from_dict(spec)) for spec in specs[:PLACE_SAMPLE]]
        t0 = time.perf_counter()
        placed = sum(engine.place(r, explain=True).schedulable for r in requests)
        elapsed = time.perf_counter() - t0
        out["place_ms_per_job"] = round(1000 * elapsed / len(requests), 2) if requests else None
        out["placed"] = placed
        out["sampled"] = len(requests)
    except Exception as exc:  # the internals moved: say so
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--backlog", type=int, default=3000)
    parser.add_argument(
        "--passes", type=int, default=3, help="timed passes (the first one is cold)"
    )
    parser.add_argument(
        "--budget", type=float, default=900, help="no new step after this many seconds"
    )
    parser.add_argument(
        "--unscoped-backlog", action="store_true", help="the backlog names no fleet"
    )
    args = parser.parse_args()
    run(args.nodes, args.backlog, args.passes, args.budget, args.unscoped_backlog)


if __name__ == "__main__":
    main()
