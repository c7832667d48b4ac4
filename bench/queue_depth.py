#!/usr/bin/env python3
"""A queue that does not drain: 100,000 queued jobs at 10,000 nodes, measured over HTTP.

Built first, in this process, on a fresh data dir (`fleetd init`): N nodes x 8 H100 written straight
into the tables (as bench/scale_inprocess.py does), plus a small `probe` fleet kept free; owners
(service-account tokens of 10 teams); then the backlog, submitted through the API as those owners
(the Flask test client, no pass per submit): a third ask for a GPU model no node has (they fit
nowhere), the rest ask 1, 2, 4 or 8 H100s in the big fleet. One pass then fills the fleet (its
time is reported apart: it writes tens of thousands of assignments once), and what is left waits
for capacity. Then `fleetd serve` runs on that data dir (its node TTL long, as no agent
heartbeats) and this process, the load generator, measures by its own clock:

- submits of more backlog (mixed shapes and owners), one at a time and from 8 threads;
- a probe job (1 GPU in the free fleet): submit until its task is placed, and how many passes
  ended in between (fleetd's own figure);
- listings: queued jobs, a page of 100 and the page after it; every job, a page of 100; one
  job; `GET /api/v1/cluster/status`;
- scheduling passes while all that runs (fleetd's /metrics).

    .venv/bin/python bench/queue_depth.py                      # 10,000 nodes, 100,000 jobs
    .venv/bin/python bench/queue_depth.py --nodes 1000 --jobs 10000

Writes bench/results/queue_depth.json and prints a summary.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.scale import (  # noqa: E402
    ROOT,
    init_data_dir,
    percentiles,
    proc_status,
    start_fleetd,
    stop_processes,
)
from bench.scale_inprocess import insert_nodes  # noqa: E402

MISSING_GPU_TYPE = "NVIDIA B300"  # no node has it: a third of the backlog fits nowhere
SHAPES = (1, 2, 4, 8)
TEAMS = 10
OWNERS = 40
TARGETS = {"submit_p99_ms": 50, "pass_p99_ms": 100, "listing_p99_ms": 50, "probe_passes": 1}
ENV = {
    "FLEETD_NODE_TTL_SECONDS": "86400",  # no agent heartbeats: the nodes must stay ready
    "FLEETD_LIMITS_MAX_ACTIVE_JOBS": "1000000",
    "FLEETD_LIMITS_REQUESTS_PER_SECOND": "0",
}


def spec(i, fleet="sim"):
    """The i-th backlog job's spec: every third fits nowhere, the others 1 to 8 H100s."""
    body = {"name": f"q{i}", "command": ["true"], "node_selector": {"fleet": fleet}}
    if i % 3 == 0:
        body["resources"] = {"gpus": 1, "gpu_types": [MISSING_GPU_TYPE]}
    else:
        body["resources"] = {"gpus": SHAPES[i % len(SHAPES)]}
    return body


def build(data_dir, admin, nodes, jobs):
    """The fleet, the owners and the backlog, in this process; returns the owners' tokens."""
    os.environ.update(ENV)
    from fleetd.app import create_app
    from fleetd.clock import Clock
    from fleetd.db import database, open_database
    from fleetd.services.placement import scheduling
    from fleetd.settings import Settings

    settings = Settings.load(data_dir=data_dir, sqlite_synchronous="OFF")
    db = open_database(settings.database_url, settings.sqlite_synchronous)
    app = create_app(settings, clock=Clock(), db=db)
    rt = app.extensions["fleetd"]
    rt.scheduler.kick = lambda *a, **k: False  # one pass at the end, not one per submit
    http = app.test_client()

    def call(method, path, body=None, token=admin):
        resp = http.open(
            path, method=method, json=body, headers={"Authorization": f"Bearer {token}"}
        )
        assert resp.status_code < 300, (path, resp.status_code, resp.get_json())
        return resp.get_json(silent=True)

    for fleet in ("sim", "probe"):
        call("POST", "/api/v1/fleets", {"name": fleet})
    t0 = time.perf_counter()
    with database.connection_context():
        node_ids = insert_nodes(database, nodes, "sim") + insert_nodes(database, 16, "probe", "p")
    for nid in node_ids:
        rt.liveness.touch(nid)
    steps = {"nodes_seconds": round(time.perf_counter() - t0, 1)}
    owners = [
        call(
            "POST",
            "/api/v1/tokens",
            {"name": f"owner-{k}", "role": "submitter", "team": f"team-{k % TEAMS}"},
        )["token"]
        for k in range(OWNERS)
    ]
    t0 = time.perf_counter()
    for i in range(jobs):
        call("POST", "/api/v1/jobs", spec(i), token=owners[i % OWNERS])
        if i and i % 10000 == 0:
            print(json.dumps({"step": "backlog", "jobs": i}), flush=True)
    steps["backlog_seconds"] = round(time.perf_counter() - t0, 1)
    for nid in node_ids:
        rt.liveness.touch(nid)
    # Passes fill the fleet (each places a bounded number of jobs) until no queued job fits.
    t0, assigned, passes = time.perf_counter(), 0, 0
    for passes in range(1, 1001):
        for nid in node_ids:
            rt.liveness.touch(nid)
        with app.app_context(), database.connection_context():
            placed = scheduling.run_pass(rt).get("assigned", 0)
        assigned += placed
        print(json.dumps({"step": "filling", "pass": passes, "assigned": placed}), file=sys.stderr)
        if not placed:
            break
    steps["filling_seconds"] = round(time.perf_counter() - t0, 1)
    steps["filling_passes"], steps["filling_assigned"] = passes, assigned
    db.close()
    return owners, steps


def timed(session, method, url, **kwargs):
    t0 = time.perf_counter()
    resp = session.request(method, url, timeout=120, **kwargs)
    took = time.perf_counter() - t0
    if resp.status_code >= 300:
        raise SystemExit(f"{method} {url} answered {resp.status_code}: {resp.text[:300]}")
    return took, resp.json()


def pass_histogram(url, admin):
    """(count, sum seconds, {le: count}) of fleetd_scheduling_pass_seconds from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(
        url + "/metrics", headers={"Authorization": f"Bearer {admin}"}, timeout=60
    ).text
    count = total = 0.0
    buckets = {}
    for family in text_string_to_metric_families(text):
        if family.name != "fleetd_scheduling_pass_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_count"):
                count += sample.value
            elif sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return count, total, buckets


def pass_figures(before, after):
    """Passes between two scrapes: count, mean and p99 (upper bound of its bucket), ms."""
    count = after[0] - before[0]
    if not count:
        return {"count": 0}
    cumulative = sorted((le, after[2][le] - before[2].get(le, 0.0)) for le in after[2])
    p99 = next((le for le, seen in cumulative if seen >= 0.99 * count), float("inf"))
    return {
        "count": int(count),
        "mean_ms": round(1000 * (after[1] - before[1]) / count, 1),
        "p99_le_ms": round(1000 * p99, 1),
    }


def settle(url, admin, limit=300):
    """After a start the passes read the whole backlog until its groups are parked again: wait
    until a second goes by with passes averaging under 100 ms (or `limit` seconds); returns how
    long that took and the passes meanwhile."""
    t0 = time.monotonic()
    first = last = pass_histogram(url, admin)
    for _ in range(limit):
        time.sleep(1)
        now = pass_histogram(url, admin)
        count, total = now[0] - last[0], now[1] - last[1]
        last = now
        if count and total / count < 0.1 or time.monotonic() - t0 > limit:
            break
    return {
        "seconds": round(time.monotonic() - t0, 1),
        "passes": pass_figures(first, last),
    }


def measure(url, admin, owners, jobs, rounds):
    """The HTTP phase; returns its figures."""
    sessions = [requests.Session() for _ in owners]
    for session, token in zip(sessions, owners):
        session.headers["Authorization"] = f"Bearer {token}"
    admin_http = requests.Session()
    admin_http.headers["Authorization"] = f"Bearer {admin}"
    out = {}
    passes0 = pass_histogram(url, admin)

    one = []
    for i in range(rounds):
        took, _ = timed(
            sessions[i % len(sessions)], "POST", url + "/api/v1/jobs", json=spec(jobs + i)
        )
        one.append(took)
    out["submit_one_at_a_time"] = percentiles(one)
    many, lock = [], threading.Lock()

    def submitter(k):
        for i in range(rounds // 8):
            n = jobs + rounds + k * rounds + i
            took, _ = timed(sessions[n % len(sessions)], "POST", url + "/api/v1/jobs", json=spec(n))
            with lock:
                many.append(took)

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["submit_8_threads"] = percentiles(many)

    probes, probe_passes = [], []
    for i in range(20):
        before = pass_histogram(url, admin)[0]
        t0 = time.perf_counter()
        _, job = timed(
            sessions[i % len(sessions)],
            "POST",
            url + "/api/v1/jobs",
            json={
                "name": f"probe{i}",
                "command": ["true"],
                "node_selector": {"fleet": "probe"},
                "resources": {"gpus": 1},
            },
        )
        deadline = time.monotonic() + 60
        for _ in range(100_000):
            _, seen = timed(admin_http, "GET", f"{url}/api/v1/jobs/{job['id']}")
            if seen["tasks"][0].get("node_id"):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"probe {job['id']} was not placed in 60 s: {seen}")
            time.sleep(0.005)
        probes.append(time.perf_counter() - t0)
        probe_passes.append(int(pass_histogram(url, admin)[0] - before))
        timed(admin_http, "POST", f"{url}/api/v1/jobs/{job['id']}/cancel")
    out["probe_submit_to_placed"] = percentiles(probes)
    out["probe_passes_ended_until_placed"] = {"max": max(probe_passes), "all": probe_passes}

    listings = {
        "queued, first page of 100": "/api/v1/jobs?state=queued&limit=100",
        "every job, first page of 100": "/api/v1/jobs?limit=100",
        "cluster status": "/api/v1/cluster/status",
    }
    for name, path in listings.items():
        times = []
        for _ in range(rounds // 10):
            took, body = timed(admin_http, "GET", url + path)
            times.append(took)
        out[name] = percentiles(times)
        if name.startswith("queued"):
            cursor = body.get("next_cursor")
            times = []
            for _ in range(rounds // 10):
                took, _ = timed(
                    admin_http, "GET", url + f"/api/v1/jobs?state=queued&limit=100&cursor={cursor}"
                )
                times.append(took)
            out["queued, the next page"] = percentiles(times)
    out["passes"] = pass_figures(passes0, pass_histogram(url, admin))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--jobs", type=int, default=100000)
    parser.add_argument("--rounds", type=int, default=400, help="submits and listings measured")
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="build into DIR and keep it; a DIR built before is copied and measured again as it "
        "was (a build takes minutes)",
    )
    args = parser.parse_args()
    results = {"nodes": args.nodes, "jobs": args.jobs, "targets": TARGETS}
    with tempfile.TemporaryDirectory() as data_dir:
        os.chmod(data_dir, 0o711)
        kept = pathlib.Path(args.keep) if args.keep else None
        if kept is not None and (kept / "bench-build.json").exists():
            shutil.copytree(kept, data_dir, dirs_exist_ok=True)
            admin, owners, steps = json.loads((kept / "bench-build.json").read_text())
            results["build"] = steps
            return _measure_built(args, results, data_dir, admin, owners)
        admin = init_data_dir(data_dir)
        # The build runs in a child process, so that this one (the load generator) stays small.
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                "import json, sys; sys.path.insert(0, sys.argv[1]); "
                "from bench.queue_depth import build; "
                "print(json.dumps(build(sys.argv[2], sys.argv[3], int(sys.argv[4]), "
                "int(sys.argv[5]))))",
                str(ROOT),
                data_dir,
                admin,
                str(args.nodes),
                str(args.jobs),
            ],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
            timeout=3600,
            cwd=ROOT,
        )
        owners, steps = json.loads(child.stdout.strip().splitlines()[-1])
        results["build"] = steps
        print(json.dumps({"step": "built", **steps}), flush=True)
        if kept is not None:
            shutil.copytree(data_dir, kept, dirs_exist_ok=True)
            (kept / "bench-build.json").write_text(json.dumps([admin, owners, steps]))
        return _measure_built(args, results, data_dir, admin, owners)


def _measure_built(args, results, data_dir, admin, owners):
    """fleetd serve on a built data dir, measured; writes and prints the results."""
    os.environ.update(ENV)
    proc, url, _ = start_fleetd(data_dir, os.path.join(data_dir, "fleetd.log"), init=False)
    try:
        results["settling"] = settle(url, admin)
        results["http"] = measure(url, admin, owners, args.jobs, args.rounds)
        results["fleetd_peak_rss_bytes"] = proc_status(proc.pid).get("VmHWM")
    finally:
        stop_processes([proc])
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "queue_depth.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
