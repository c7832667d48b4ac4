#!/usr/bin/env python3
"""Replicas on PostgreSQL: failover time, and heartbeat throughput with one vs two replicas.

A throwaway PostgreSQL server (the Debian binaries; `scripts/setup.sh` installs them) and
real `fleetd serve` processes with default settings (leader lease 8 s) on one database.
  1. heartbeats: --nodes registered nodes heartbeat from --clients threads for --seconds,
     all to one replica, then spread over two (each client thread keeps to one replica);
  2. failover, --rounds times: a node waits in an acquire long poll on the follower, the
     leader gets SIGKILL, a job is submitted to the follower at once; measured from the kill
     until the node receives the job (the new leader placed it and its wake-up crossed
     replicas) and until the survivor's health says it leads. The killed replica is started
     again (as a follower) before the next round.
Prints a table and writes JSON to bench/results/replicas.json.

    .venv/bin/python bench/replicas.py --nodes 200 --clients 8 --seconds 10 --rounds 5
"""

import argparse
import glob
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import psycopg2
import requests

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.control_plane import heartbeat_phase, percentile  # noqa: E402
from tests.conftest import gpus  # noqa: E402


def _pg(name):
    return shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1]


def _as_postgres(args):
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class Postgres:
    """initdb + pg_ctl start on a free port; stop() removes it."""

    def __init__(self):
        self.base = pathlib.Path(tempfile.mkdtemp(prefix="fleetd-bench-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        data = self.base / "data"
        subprocess.run(
            _as_postgres([_pg("initdb"), "-D", str(data), "-A", "trust", "-U", "fleetd"]),
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            _as_postgres(
                [
                    _pg("pg_ctl"),
                    "-D",
                    str(data),
                    "-o",
                    f"-h 127.0.0.1 -p {self.port} -k {self.base}",
                    "-l",
                    str(self.base / "log"),
                    "-w",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        self.url = f"postgresql://fleetd@127.0.0.1:{self.port}/postgres"

    def database(self):
        name = f"fleetd_{uuid.uuid4().hex[:8]}"
        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        conn.close()
        return self.url.rsplit("/", 1)[0] + "/" + name

    def stop(self):
        subprocess.run(
            _as_postgres(
                [_pg("pg_ctl"), "-D", str(self.base / "data"), "-m", "immediate", "-w", "stop"]
            ),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.base, ignore_errors=True)


class Replica:
    def __init__(self, env):
        self.env = env
        self.proc = None
        self.url = None

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetd", "serve", "--bind", "127.0.0.1:0"],
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        for line in self.proc.stderr:
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                self.url = match.group(1)
                self.lines = []
                threading.Thread(
                    target=lambda: [self.lines.append(x) for x in self.proc.stderr], daemon=True
                ).start()
                return self
        raise SystemExit("a replica did not start")

    def leads(self):
        try:
            return requests.get(self.url + "/api/v1/health", timeout=2).json()["leader"]
        except (requests.RequestException, ValueError, KeyError):
            return False

    def stop(self, sig=signal.SIGTERM):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)


def fleetd_init(env):
    """`fleetd init` over the database `env` names; returns the first admin token."""
    init = subprocess.run(
        [sys.executable, "-m", "fleetd", "init"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    return init.stdout.strip().splitlines()[-1]


def until(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def register(url, join, count, prefix):
    out = []
    for i in range(count):
        resp = requests.post(
            url + "/api/v1/agent/register",
            timeout=30,
            headers={"Authorization": f"Bearer {join}", "X-Fleet-Protocol": "1"},
            json={
                "hostname": f"{prefix}-{i}",
                "machine_id": f"{prefix}-{i}",
                "agent_version": "0.1.0",
                "address": "10.0.0.9",
                "resources": {"cpu_count": 8, "memory_bytes": 1 << 34},
                "gpus": gpus(1),
            },
        )
        resp.raise_for_status()
        out.append(resp.json()["session_token"])
    return out


def heartbeats(urls, sessions, clients, seconds):
    """Client thread c sends to urls[c % len(urls)]; returns ops/s and latency percentiles."""
    latencies, lock = [], threading.Lock()

    def worker(c):
        found = heartbeat_phase(urls[c % len(urls)], sessions[c::clients], 1, seconds)
        with lock:
            latencies.extend(found)

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "ops_per_s": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
    }


def failover_round(replicas, admin, node_headers):
    leader = until(lambda: next((r for r in replicas if r.leads()), None), 60, "a leader")
    follower = next(r for r in replicas if r is not leader)
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {admin}"
    requests.post(
        follower.url + "/api/v1/agent/heartbeat",
        json={"tasks": []},
        headers=node_headers,
        timeout=30,
    ).raise_for_status()
    got = {}

    def wait_for_work():
        for _ in range(4):
            try:
                resp = requests.post(
                    follower.url + "/api/v1/agent/acquire",
                    json={"wait_seconds": 30},
                    timeout=60,
                    headers=node_headers,
                )
            except requests.ConnectionError as exc:
                got["error"] = f"{follower.url}: {exc}"
                continue
            assignment = resp.json().get("assignment")
            if assignment:
                got["at"] = time.perf_counter()
                got["assignment"] = assignment
                return

    waiter = threading.Thread(target=wait_for_work)
    waiter.start()
    time.sleep(0.5)  # the long poll is waiting on the follower
    killed = time.perf_counter()
    leader.stop(signal.SIGKILL)
    job = http.post(
        follower.url + "/api/v1/jobs",
        timeout=30,
        json={
            "name": "after-failover",
            "command": ["true"],
            "resources": {"gpus": 1},
            "node_selector": {"fleet": "failover"},
        },
    ).json()
    until(follower.leads, 60, "the follower to lead")
    led = time.perf_counter() - killed
    waiter.join(120)
    if "assignment" not in got:
        raise SystemExit(
            f"no assignment after the failover ({got.get('error')}; leader was {leader.url}); "
            "the follower's log:\n" + "".join(follower.lines[-30:])
        )
    assignment = got["assignment"]
    for action, body in (
        ("start", {"pid": 42}),
        ("finish", {"outcome": "succeeded", "exit_code": 0}),
    ):
        requests.post(
            f"{follower.url}/api/v1/agent/tasks/{assignment['task_id']}/{action}",
            timeout=30,
            headers=node_headers,
            json=dict(body, epoch=assignment["epoch"]),
        ).raise_for_status()
    assert assignment["job_id"] == job["id"]
    leader.start()  # back as a follower
    return {"new_leader_s": led, "first_assignment_s": got["at"] - killed}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    pg = Postgres()
    replicas = []
    try:
        env = dict(os.environ, FLEETD_DB_URL=pg.database(), FLEETD_DATA_DIR=tempfile.mkdtemp())
        admin = fleetd_init(env)
        replicas = [Replica(env).start(), Replica(env).start()]
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {admin}"
        http.post(
            replicas[0].url + "/api/v1/fleets", json={"name": "bench"}, timeout=30
        ).raise_for_status()
        join = http.post(
            replicas[0].url + "/api/v1/fleets/bench/join-tokens", json={}, timeout=30
        ).json()["token"]
        sessions = register(replicas[0].url, join, args.nodes, "hb")
        results = {
            "heartbeats": {
                "one replica": heartbeats([replicas[0].url], sessions, args.clients, args.seconds),
                "two replicas": heartbeats(
                    [r.url for r in replicas], sessions, args.clients, args.seconds
                ),
            }
        }
        http.post(
            replicas[0].url + "/api/v1/fleets", json={"name": "failover"}, timeout=30
        ).raise_for_status()
        join = http.post(
            replicas[0].url + "/api/v1/fleets/failover/join-tokens", json={}, timeout=30
        ).json()["token"]
        worker = register(replicas[1].url, join, 1, "worker")[0]
        headers = {"Authorization": f"Bearer {worker}", "X-Fleet-Protocol": "1"}
        requests.post(
            replicas[1].url + "/api/v1/agent/heartbeat",
            json={"tasks": []},
            headers=headers,
            timeout=30,
        ).raise_for_status()
        rounds = [failover_round(replicas, admin, headers) for _ in range(args.rounds)]
        results["failover"] = {
            key: {
                "median": statistics.median(r[key] for r in rounds),
                "max": max(r[key] for r in rounds),
            }
            for key in ("new_leader_s", "first_assignment_s")
        }
        results["rounds"] = rounds
    finally:
        for replica in replicas:
            replica.stop(signal.SIGKILL)
        pg.stop()
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "replicas.json").write_text(json.dumps(results, indent=2))
    for name, r in results["heartbeats"].items():
        print(
            f"heartbeats, {name:<14}{r['ops_per_s']:>8.0f}/s  p50 {r['p50_ms']:.1f} ms  p99 "
            f"{r['p99_ms']:.1f} ms"
        )
    for key, r in results["failover"].items():
        print(f"failover {key:<22} median {r['median']:.2f} s  max {r['max']:.2f} s")


if __name__ == "__main__":
    main()
