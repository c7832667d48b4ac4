#!/usr/bin/env python3
"""Storms: what a user's jobs see while thousands of nodes arrive at once, with a deep queue.

One `fleetd serve` (SQLite) with 2 real agents (fleet `real`) and --backlog jobs that fit nowhere
(a GPU type no node has; naming no fleet unless --scoped-backlog), queued before the storms:
  1. registration storm: --nodes simulated nodes x 8 H100 (bench/scale_sim.py, its own process)
     register --register-concurrency at a time, and heartbeat from then on;
  2. restart storm: fleetd is killed (SIGKILL, as a crash) and started again on the same port and
     database; every node's heartbeat comes back at once (each agent retries with its backoff).
     With --replicas: two `fleetd serve` replicas on a throwaway PostgreSQL (bench/replicas.py's),
     nodes and agents given both URLs and spread over them; instead of a restart, the leader is
     killed (SIGKILL) in the middle of the loaded phase and the survivor takes over (failover).
A probe (its own thread, its own connection) submits jobs to fleet `real` one after another the
whole time, each a `true` waited for by long poll as `fleetd job submit --wait` does; each job's
submit -> running comes from fleetd's timestamps and submit -> ended from the client's clock.
A storm ends when the last node has registered (1) or when every node has had a heartbeat
answered by the new fleetd (2). The figures are per window of submit time: during the storm,
the first 10 s after it, the next 10 s. Then the nodes heartbeat --after-seconds more (longer
than fleetd's start-up grace plus a TTL) and no simulated node may ever have been declared lost.

    .venv/bin/python bench/storms.py --nodes 2000 --backlog 500 --after-seconds 30   # a quick look
    .venv/bin/python bench/storms.py                     # 10,000 nodes, 3,000 queued jobs
    .venv/bin/python bench/storms.py --replicas          # the same on two replicas, with a failover

Each probe job must end `succeeded` with one task (none lost, none run twice); at the end no
probe job may be left queued, running or failed.
"""

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from scale import (  # noqa: E402 - bench/ is on the path above
    EVER_LOST_SQL,
    MISSING_GPU_TYPE,
    Api,
    Simulator,
    _parse_ts,
    job_spec,
    log,
    lost_nodes,
    percentiles,
    proc_status,
    start_agents,
    start_fleetd,
    stop_processes,
    submit_backlog,
    wait_ready,
)

TARGET_P50_MS = 100
WINDOWS = (
    ("during the storm", None, 0.0),
    ("first 10 s after", 0.0, 10.0),
    ("10-20 s after", 10.0, 20.0),
)


class Probe:
    """Jobs on fleet `real`, one after another, until stopped; each with its submit time (wall)."""

    def __init__(self, urls, admin):
        self.urls, self.admin = urls, admin
        # (submitted at, wall; submit -> running s or None; submit -> ended s, client)
        self.samples = []
        self.errors = {}
        self.first_errors = {}  # the first message of each kind of error
        self.anomalies = []  # jobs that did not end succeeded with exactly one task
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(120)

    def _run(self):
        at = 0
        api = Api(self.urls[at], self.admin, timeout=60)
        spec = job_spec("real", 1)
        for _ in range(100_000):  # bounded; stop() ends it first
            if self._stop.is_set():
                break
            wall, t0 = time.time(), time.perf_counter()
            job = None
            try:
                job = api.call("POST", "/api/v1/jobs", spec)
                done = job
                for _ in range(10):  # long polls of at most 30 s each
                    done = api.call("GET", f"/api/v1/jobs/{job['id']}?wait_seconds=30")
                    if done["state"] in ("succeeded", "failed", "cancelled"):
                        break
            except (OSError, RuntimeError, ValueError) as exc:  # fleetd down, restarting: try again
                kind = type(exc).__name__
                self.errors[kind] = self.errors.get(kind, 0) + 1
                self.first_errors.setdefault(kind, str(exc)[:300])
                api.close()
                if (
                    isinstance(exc, OSError) and len(self.urls) > 1
                ):  # that replica is gone: the other
                    at += 1
                    api = Api(self.urls[at % len(self.urls)], self.admin, timeout=60)
                self._stop.wait(0.2)
                # A job submitted before the error is checked at the end (leftover_probe_jobs).
                continue
            client = time.perf_counter() - t0
            task = (done.get("tasks") or [{}])[0]
            started = (
                _parse_ts(task["started_at"]) - _parse_ts(done["submitted_at"])
                if done["state"] == "succeeded" and task.get("started_at")
                else None
            )
            if done["state"] != "succeeded" or len(done.get("tasks") or ()) != 1:
                self.anomalies.append(
                    {
                        "id": done["id"],
                        "state": done["state"],
                        "tasks": len(done.get("tasks") or ()),
                    }
                )
            self.samples.append((wall, started, client))
        api.close()

    def windows(self, storm_end):
        """{window: figures} of the jobs submitted in each window relative to the storm's end."""
        out = {}
        for name, lo, hi in WINDOWS:
            picked = [
                (s, c)
                for wall, s, c in self.samples
                if (lo is None or wall - storm_end >= lo) and wall - storm_end < hi
            ]
            out[name] = {
                "jobs": len(picked),
                "failed": sum(s is None for s, _ in picked),
                "submit_to_running": percentiles([s for s, _ in picked if s is not None]),
                "client_submit_to_end": percentiles([c for _, c in picked]),
            }
        return out


def storm_phase(name, urls, admin, run_storm, after=20.0):
    """Probe jobs through a storm (run_storm() returns the storm's end, wall clock) and `after` s
    more."""
    probe = Probe(urls, admin).start()
    try:
        storm_end, detail = run_storm()
        time.sleep(max(0.0, storm_end + after - time.time()))
    finally:
        probe.stop()
    figures = {
        "storm": detail,
        "windows": probe.windows(storm_end),
        "probe_errors": probe.errors,
        "probe_first_errors": probe.first_errors,
        "probe_anomalies": probe.anomalies[:20],
        "probe_anomaly_count": len(probe.anomalies),
    }
    first = figures["windows"]["first 10 s after"]
    log(
        f"{name}: {detail}; first 10 s after: {first['jobs']} jobs, submit -> running p50 "
        f"{first['submit_to_running']['p50_ms']} ms, client p50 "
        f"{first['client_submit_to_end']['p50_ms']} ms"
    )
    return figures


def lost_in_postgres(url):
    """Simulated nodes ever declared lost, from fleetd's events in PostgreSQL."""
    import psycopg2

    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(EVER_LOST_SQL)
            return cursor.fetchone()[0]
    finally:
        conn.close()


def leftover_probe_jobs(api):
    """Probe jobs (named noop) not succeeded at the end: lost, stuck or failed."""
    left = []
    for state in ("queued", "running", "failed", "cancelled"):
        left += [
            j["id"] for j in api.pages("/api/v1/jobs", {"state": state}) if j.get("name") == "noop"
        ]
    return left


class Single:
    """One `fleetd serve` on SQLite; restart() kills it (SIGKILL) and starts it on the same port."""

    def __init__(self, args, data_dir):
        self.args, self.data_dir = args, data_dir
        self.log_path = os.path.join(data_dir, "fleetd.log")
        self.proc, url, self.admin = start_fleetd(data_dir, self.log_path)
        self.urls = [url]
        self.procs = [self.proc]

    def interrupt(self, sim):
        log("restart storm: fleetd killed (SIGKILL) and started again on the same port")
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        time.sleep(self.args.down_seconds)
        t0 = time.time()
        port = urllib.parse.urlsplit(self.urls[0]).port
        self.proc, _, _ = start_fleetd(
            self.data_dir, self.log_path, bind=f"127.0.0.1:{port}", init=False
        )
        self.procs.append(self.proc)
        listening = time.time()
        sim.send("mark")
        heard = sim.next(timeout=600)
        return time.time(), {
            "down_s": self.args.down_seconds,
            "start_to_listening_s": round(listening - t0, 2),
            "all_nodes_heard_after_s": heard["seconds"],
            "nodes": heard["nodes"],
        }

    def lost(self, api):
        return lost_nodes(api, self.data_dir)

    def memory(self):
        return {"fleetd": proc_status(self.proc.pid)}

    def close(self):
        stop_processes([self.proc])


class Replicated:
    """Two `fleetd serve` replicas on a throwaway PostgreSQL; interrupt() kills the leader
    (SIGKILL)."""

    def __init__(self, args, data_dir):
        from bench.replicas import Postgres, Replica, fleetd_init

        self.pg = Postgres()
        try:
            self.db_url = self.pg.database()
            env = dict(os.environ, FLEETD_DB_URL=self.db_url, FLEETD_DATA_DIR=data_dir)
            self.admin = fleetd_init(env)
            self.replicas = [Replica(env).start(), Replica(env).start()]
        except BaseException:
            self.pg.stop()
            raise
        self.urls = [r.url for r in self.replicas]
        self.procs = [r.proc for r in self.replicas]

    def _leader(self, among, seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for replica in among:
                if replica.leads():
                    return replica
            time.sleep(0.05)
        logs = "".join(line for r in among for line in r.lines[-40:])
        raise SystemExit(f"no replica leads after {seconds} s; their logs end:\n{logs}")

    def interrupt(self, sim):
        leader = self._leader(self.replicas)
        survivor = next(r for r in self.replicas if r is not leader)
        log(f"failover: the leader {leader.url} killed (SIGKILL); {survivor.url} takes over")
        killed = time.time()
        leader.stop(signal.SIGKILL)
        sim.send("mark")
        self._leader([survivor])
        led = time.time()
        heard = sim.next(timeout=600)
        self.replicas, self.urls = [survivor], [survivor.url]
        return time.time(), {
            "kill_to_new_leader_s": round(led - killed, 2),
            "all_nodes_heard_after_s": heard["seconds"],
            "nodes": heard["nodes"],
        }

    def lost(self, api):
        now = [n["id"] for n in api.pages("/api/v1/nodes", {"status": "lost", "fleet": "sim"})]
        return {"lost_now": len(now), "ever_lost": lost_in_postgres(self.db_url)}

    def memory(self):
        return {r.url: proc_status(r.proc.pid) for r in self.replicas if r.proc.poll() is None}

    def close(self):
        for replica in self.replicas:
            replica.stop()
        self.pg.stop()


def run(args, data_dir):
    results = {}
    sim = None
    control = Replicated(args, data_dir) if args.replicas else Single(args, data_dir)
    urls, admin = control.urls, control.admin
    url = ",".join(urls)
    procs = []
    api = Api(urls[0], admin)
    try:
        for fleet in ("real", "sim"):
            api.call("POST", "/api/v1/fleets", {"name": fleet})
        real_join = api.call("POST", "/api/v1/fleets/real/join-tokens", {})["token"]
        sim_join = api.call("POST", "/api/v1/fleets/sim/join-tokens", {})["token"]
        agents = start_agents(url, real_join, data_dir, 2, "real")
        procs.extend(agents)
        wait_ready(api, "real", 2)
        spec = dict(
            job_spec("sim", 1),
            name="backlog",
            resources={"gpus": 1, "gpu_types": [MISSING_GPU_TYPE]},
        )
        if not args.scoped_backlog:
            del spec["node_selector"]
        log(f"fleetd at {url}; submitting {args.backlog} jobs that fit nowhere")
        results["backlog"] = submit_backlog(urls[-1], admin, spec, args.backlog, 500, 8)

        def registration():
            nonlocal sim
            log(f"registration storm: {args.nodes} nodes, {args.register_concurrency} at a time")
            sim = Simulator(
                url,
                sim_join,
                types.SimpleNamespace(
                    nodes=args.nodes,
                    register_concurrency=args.register_concurrency,
                    sim_connections=args.sim_connections,
                    max_seconds=args.max_seconds,
                ),
                os.path.join(data_dir, "sim.log"),
            )
            procs.append(sim.proc)
            registered = sim.next(timeout=args.max_seconds)
            end = time.time()
            sim.next(timeout=120)  # the heartbeats' window of the registration
            return end, {
                "nodes": registered["nodes"],
                "seconds": registered["seconds"],
                "per_s": registered["per_s"],
                "failures": registered["failures"],
                "told_to_come_back": registered.get("told_to_come_back") or {},
            }

        results["registration"] = storm_phase("registration storm", urls, admin, registration)
        phase = "failover" if args.replicas else "restart"
        results[phase] = storm_phase(f"{phase} storm", urls, admin, lambda: control.interrupt(sim))
        log(f"heartbeats for {args.after_seconds:.0f} s more, then the lost check")
        time.sleep(args.after_seconds)
        results["heartbeats_after"] = sim.report()
        survivor = Api(control.urls[-1] if args.replicas else urls[0], admin)
        results["lost"] = control.lost(survivor)
        results["leftover_probe_jobs"] = leftover_probe_jobs(survivor)
        survivor.close()
        results["fleetd_memory"] = control.memory()
    finally:
        api.close()
        if sim is not None:
            sim.stop()
        stop_processes(procs)
        control.close()
    return results


def print_report(results, args):
    print(
        f"\n{args.nodes:,} simulated nodes x 8 GPUs + 2 real agents, {args.backlog:,} queued jobs "
        f"that fit nowhere ({'in fleet sim' if args.scoped_backlog else 'naming no fleet'}); "
        f"{os.cpu_count()} cores, load average at start {results['load_average_at_start'][0]:.2f}"
    )
    phases = ("registration", "failover" if args.replicas else "restart")
    for phase in phases:
        got = results.get(phase)
        if not got:
            continue
        print(
            f"\n{phase} storm: {got['storm']}; probe errors while fleetd was away: "
            f"{got['probe_errors'] or 'none'}; probe jobs not succeeded once: "
            f"{got['probe_anomaly_count']}"
        )
        print(
            f"  {'jobs submitted':<22}{'jobs':>6}{'running p50 ms':>16}{'p95':>8}"
            f"{'client p50 ms':>15}{'p95':>8}"
        )
        for name, w in got["windows"].items():
            print(
                f"  {name:<22}{w['jobs']:>6}{str(w['submit_to_running']['p50_ms']):>16}"
                f"{str(w['submit_to_running']['p95_ms']):>8}{str(w['client_submit_to_end']['p50_ms']):>15}"
                f"{str(w['client_submit_to_end']['p95_ms']):>8}"
            )
    lost = results.get("lost") or {}
    hb = results.get("heartbeats_after") or {}
    print(
        f"\nafter the storms: heartbeats p99 {hb.get('latency', {}).get('p99_ms')} ms (agent "
        f"side), failures {hb.get('failures') or 'none'}; nodes lost now {lost.get('lost_now')}, "
        f"ever {lost.get('ever_lost')}; fleetd RSS {results.get('fleetd_memory')}"
    )
    print("targets:")
    for phase in phases:
        w = ((results.get(phase) or {}).get("windows") or {}).get("first 10 s after")
        p50 = w and w["submit_to_running"]["p50_ms"]
        ok = p50 is not None and p50 < TARGET_P50_MS
        print(
            f"  {'PASS' if ok else 'FAIL'}  {phase}: jobs that fit start with p50 < "
            f"{TARGET_P50_MS} ms within 10 s of the storm's end: {p50} ms (client "
            f"{w and w['client_submit_to_end']['p50_ms']} ms)"
        )
    ok = lost.get("lost_now") == 0 and lost.get("ever_lost") == 0
    print(f"  {'PASS' if ok else 'FAIL'}  no simulated node ever declared lost")
    bad = sum((results.get(p) or {}).get("probe_anomaly_count", 0) for p in phases)
    left = results.get("leftover_probe_jobs")
    ok = bad == 0 and left == []
    print(
        f"  {'PASS' if ok else 'FAIL'}  no probe job lost or run twice: {bad} not succeeded with "
        f"one task, {len(left or [])} left unfinished"
    )
    failover = (results.get("failover") or {}).get("storm")
    if failover:
        ok = failover["kill_to_new_leader_s"] <= 15
        print(
            f"  {'PASS' if ok else 'FAIL'}  a new leader within 15 s of the kill: "
            f"{failover['kill_to_new_leader_s']} s"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--backlog", type=int, default=3000)
    parser.add_argument("--scoped-backlog", action="store_true", help="the backlog names fleet sim")
    parser.add_argument(
        "--replicas",
        action="store_true",
        help="two replicas on PostgreSQL, and a failover instead of a restart",
    )
    parser.add_argument("--register-concurrency", type=int, default=64)
    parser.add_argument("--sim-connections", type=int, default=256)
    parser.add_argument(
        "--down-seconds", type=float, default=5.0, help="how long fleetd stays down"
    )
    parser.add_argument(
        "--after-seconds",
        type=float,
        default=90.0,
        help="heartbeats after the restart storm before the lost check (more than fleetd's "
        "start-up grace of 2 x TTL is what makes the check mean something)",
    )
    parser.add_argument("--max-seconds", type=float, default=3600)
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "storms.json"))
    args = parser.parse_args()
    results = {
        "args": vars(args),
        "load_average_at_start": os.getloadavg(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    results["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=10,
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as data_dir:
        os.chmod(data_dir, 0o711)  # the agents' tasks run as other uids: it must be passable
        results.update(run(args, data_dir))
    print_report(results, args)
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
