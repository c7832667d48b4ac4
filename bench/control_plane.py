#!/usr/bin/env python3
"""N simulated agents against a real `fleetd serve`: registration and heartbeat throughput, latency;
and with --jobs, no-op jobs run end to end by M real `fleet-agent` processes on fake GPUs.

Phases, in one run so that the noisy machine affects them alike:
  1. heartbeats from N simulated agents (C client threads) for D seconds;
  2. the same while H extra connections hold unfinished requests open (as long-polling agents do);
  3. (--jobs J --real-agents M) M real agents; 30 sequential jobs on the idle fleet for the
     submit -> start latency, then J jobs submitted from S threads (--submitters, 16) for
     end-to-end jobs/s: from the first submit until the last job ended.
Prints a table and writes JSON to bench/results/control_plane.json.

    .venv/bin/python bench/control_plane.py --agents 200 --clients 8 --seconds 10 --held 1000
    .venv/bin/python bench/control_plane.py --agents 0 --seconds 0 --held 0 --jobs 1000 \\
        --real-agents 8
"""

import argparse
import json
import os
import pathlib
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.client import HTTPConnection

import requests

ROOT = pathlib.Path(__file__).resolve().parent.parent


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


def heartbeat_phase(url, sessions, clients, seconds):
    """Each client thread heartbeats its share of agents round-robin; returns (count, latencies)."""
    latencies, lock = [], threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker(mine):
        http = requests.Session()
        local = []
        i = 0
        while time.monotonic() < stop_at and mine:
            token = mine[i % len(mine)]
            t0 = time.perf_counter()
            resp = http.post(
                url + "/api/v1/agent/heartbeat",
                json={"tasks": []},
                timeout=30,
                headers={"Authorization": f"Bearer {token}", "X-Fleet-Protocol": "1"},
            )
            local.append(time.perf_counter() - t0)
            resp.raise_for_status()
            i += 1
        with lock:
            latencies.extend(local)

    threads = [
        threading.Thread(target=worker, args=(sessions[c::clients],)) for c in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument(
        "--jobs", type=int, default=0, help="no-op jobs for the end-to-end phase (0: skip it)"
    )
    parser.add_argument("--real-agents", type=int, default=8)
    parser.add_argument(
        "--submitters",
        type=int,
        default=16,
        help="threads submitting the jobs, each one job at a time (a closed loop)",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as data_dir:
        os.chmod(
            data_dir, 0o711
        )  # the agents' tasks run as other uids: their state dir must be passable
        init = subprocess.run(
            [sys.executable, "-m", "fleetd", "init", "--data-dir", data_dir],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        admin = init.stdout.strip().splitlines()[-1]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetd",
                "serve",
                "--bind",
                "127.0.0.1:0",
                "--data-dir",
                data_dir,
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            url = None
            for line in proc.stderr:
                match = re.search(r"listening on (http://\S+)", line)
                if match:
                    url = match.group(1)
                    break
            assert url, "fleetd did not start"
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            results = run(url, admin, args)
            if args.jobs:
                results["phases"].update(run_jobs(url, admin, args, data_dir, proc.pid))
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "control_plane.json").write_text(json.dumps(results, indent=2))
    print(f"{'phase':<34}{'ops/s':>10}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}")
    for name, r in results["phases"].items():
        print(
            f"{name:<34}{r['ops_per_s']:>10.0f}{r['p50_ms']:>10.2f}{r['p95_ms']:>10.2f}{r['p99_ms']:>10.2f}"
        )
        if "cpu_seconds" in r:
            print(
                f"  CPU per job: fleetd {r['fleetd_cpu_ms_per_job']:.1f} ms, agents "
                f"{r['agents_cpu_ms_per_job']:.1f} ms, their tasks' processes (root shell, "
                f"setpriv, command) {r['tasks_cpu_ms_per_job']:.1f} ms, load generator "
                f"({r['submitters']} submitters) {r['load_generator_cpu_ms_per_job']:.1f} ms"
            )
            if r["succeeded"] != r["ops"]:
                print(f"  WARNING: only {r['succeeded']} of the {r['ops']} jobs succeeded")


def run(url, admin, args):
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {admin}"
    http.post(url + "/api/v1/fleets", json={"name": "bench"}, timeout=30).raise_for_status()
    if not args.agents:
        return {"agents": 0, "phases": {}}
    join = http.post(url + "/api/v1/fleets/bench/join-tokens", json={}, timeout=30).json()["token"]
    gpu = {
        "uuid": "",
        "index": 0,
        "model": "NVIDIA H100 80GB HBM3",
        "memory_total_bytes": 80 * 2**30,
    }
    sessions, reg_latencies = [], []
    for i in range(args.agents):
        body = {
            "hostname": f"sim-{i}",
            "machine_id": f"sim-{i}",
            "agent_version": "bench",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 64, "memory_bytes": 2**39},
            "gpus": [dict(gpu, uuid=f"GPU-{i}-{k}", index=k) for k in range(8)],
        }
        t0 = time.perf_counter()
        resp = requests.post(
            url + "/api/v1/agent/register",
            json=body,
            timeout=30,
            headers={"Authorization": f"Bearer {join}", "X-Fleet-Protocol": "1"},
        )
        reg_latencies.append(time.perf_counter() - t0)
        resp.raise_for_status()
        sessions.append(resp.json()["session_token"])

    phases = {}
    if not args.agents:
        return {"agents": 0, "phases": phases}
    phases["register (sequential)"] = summary(reg_latencies, sum(reg_latencies))
    phases[f"heartbeat, {args.clients} clients"] = summary(
        heartbeat_phase(url, sessions, args.clients, args.seconds), args.seconds
    )
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    held = []
    try:
        for _ in range(args.held):
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.sendall(
                b"POST /api/v1/agent/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
            )
            held.append(sock)
        phases[f"heartbeat, +{args.held} held requests"] = summary(
            heartbeat_phase(url, sessions, args.clients, args.seconds), args.seconds
        )
    finally:
        for sock in held:
            sock.close()
    return {
        "agents": args.agents,
        "clients": args.clients,
        "seconds": args.seconds,
        "held": args.held,
        "cpu_count": os.cpu_count(),
        "phases": phases,
    }


def summary(latencies, seconds):
    return {
        "ops": len(latencies),
        "ops_per_s": len(latencies) / seconds if seconds else float("nan"),
        "p50_ms": percentile(latencies, 0.5),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
    }


def _parse(ts):
    import datetime as dt

    return dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def cpu_seconds(pid, own=True, children=True):
    """User + system CPU seconds of a process (`own`) and of its reaped children (`children`: for
    an agent, the tasks' processes: the root shell, setpriv and the command), from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    ticks = (sum(int(x) for x in fields[11:13]) if own else 0) + (
        sum(int(x) for x in fields[13:15]) if children else 0
    )
    return ticks / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds():
    """User + system CPU seconds of this process (the load generator), all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _job_ids(http, url, state):
    """The ids of every job in `state`, page by page."""
    ids, cursor = set(), None
    for _ in range(100_000):
        params = {"state": state, "limit": 1000, **({"cursor": cursor} if cursor else {})}
        page = http.get(url + "/api/v1/jobs", params=params, timeout=60).json()
        ids.update(j["id"] for j in page["items"])
        cursor = page["next_cursor"]
        if not cursor:
            break
    return ids


def run_jobs(url, admin, args, data_dir, server_pid=None):
    """Real agents on fake 8 x H100 hosts run no-op jobs; returns the phases' figures."""
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {admin}"
    http.post(url + "/api/v1/fleets", json={"name": "jobs"}, timeout=30).raise_for_status()
    join = http.post(url + "/api/v1/fleets/jobs/join-tokens", json={}, timeout=30).json()["token"]
    shape = ROOT / "tests" / "fixtures" / "nvml" / "h100_x8.json"
    agents = []
    try:
        for i in range(args.real_agents):
            root = pathlib.Path(data_dir) / f"agent-{i}"
            root.mkdir()
            config = root / "agent.toml"
            config.write_text(
                f'state_dir = "{root / "state"}"\nmachine_id = "bench-agent-{i}"\n'
                f'log_level = "warning"\n[local_api]\nlisten = "127.0.0.1:0"\n'
                f'[devices]\nbackend = "fake:{shape}"\n'
            )
            subprocess.run(
                [sys.executable, "-m", "agent", "join", "--server", url, "--config", str(config)],
                check=True,
                capture_output=True,
                timeout=60,
                env=dict(os.environ, FLEET_AGENT_JOIN_TOKEN=join),
            )
            agents.append(
                subprocess.Popen(
                    [sys.executable, "-m", "agent", "run", "--config", str(config)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for _ in range(300):
            nodes = http.get(url + "/api/v1/nodes?fleet=jobs", timeout=30).json()["items"]
            if sum(n["status"] == "ready" for n in nodes) == args.real_agents:
                break
            time.sleep(0.1)
        spec = {"name": "noop", "command": ["true"], "node_selector": {"fleet": "jobs"}}
        starts = []
        for _ in range(30):  # idle fleet: one job at a time
            job = http.post(url + "/api/v1/jobs", json=spec, timeout=30).json()
            done = http.get(f"{url}/api/v1/jobs/{job['id']}?wait_seconds=30", timeout=60).json()
            if done["tasks"][0]["started_at"] is None:
                raise SystemExit(f"job {job['id']} did not start: {json.dumps(done)[:2000]}")
            starts.append(_parse(done["tasks"][0]["started_at"]) - _parse(done["submitted_at"]))
        phases = {f"submit -> start, idle fleet, {args.real_agents} agents": summary(starts, 0)}
        ids, lock, failures = [], threading.Lock(), []
        cpu0 = {
            "fleetd": cpu_seconds(server_pid) if server_pid else 0.0,
            "agents": sum(cpu_seconds(a.pid, children=False) for a in agents),
            "tasks": sum(cpu_seconds(a.pid, own=False) for a in agents),
            "load generator": _own_cpu_seconds(),
        }
        t0 = time.perf_counter()

        body = json.dumps(spec).encode()
        server = urllib.parse.urlsplit(url)
        headers = {"Authorization": f"Bearer {admin}", "Content-Type": "application/json"}

        def submit(count):
            # The standard library's HTTP client on one kept-alive connection: the load generator
            # shares the two cores with what it measures, and spends about half the CPU per call
            # of urllib3 this way (a quarter of requests').
            conn = HTTPConnection(server.hostname, server.port, timeout=60)
            try:
                for _ in range(count):
                    conn.request("POST", "/api/v1/jobs", body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    if resp.status != 201:
                        raise RuntimeError(f"submit answered {resp.status}: {data[:300]!r}")
                    with lock:
                        ids.append(json.loads(data)["id"])
            except Exception as exc:
                failures.append(exc)
            finally:
                conn.close()

        shares = [
            args.jobs // args.submitters + (i < args.jobs % args.submitters)
            for i in range(args.submitters)
        ]
        threads = [threading.Thread(target=submit, args=(n,)) for n in shares if n]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise SystemExit(
                f"{len(failures)} submitting thread(s) failed; the first: {failures[0]!r}"
            )
        for _ in range(1000):
            # The jobs not yet ended (few by now), each waited for with the job long poll: the end
            # is seen when it happens, at the cost of a request per job still running.
            left = [
                j["id"]
                for state in ("queued", "running")
                for j in http.get(
                    url + "/api/v1/jobs", params={"state": state, "limit": 1000}, timeout=60
                ).json()["items"]
            ]
            if not left:
                break
            for job_id in left:
                http.get(f"{url}/api/v1/jobs/{job_id}", params={"wait_seconds": 30}, timeout=60)
        elapsed = time.perf_counter() - t0
        cpu = {
            "fleetd": (cpu_seconds(server_pid) if server_pid else 0.0) - cpu0["fleetd"],
            "agents": sum(cpu_seconds(a.pid, children=False) for a in agents) - cpu0["agents"],
            "tasks": sum(cpu_seconds(a.pid, own=False) for a in agents) - cpu0["tasks"],
            "load generator": _own_cpu_seconds() - cpu0["load generator"],
        }
        succeeded = set(ids) & _job_ids(http, url, "succeeded")
        phases[f"{len(ids)} no-op jobs end to end, {args.real_agents} agents"] = {
            "ops": len(ids),
            "ops_per_s": len(ids) / elapsed,
            "p50_ms": float("nan"),
            "p95_ms": float("nan"),
            "p99_ms": float("nan"),
            "mean_ms": float("nan"),
            "succeeded": len(succeeded),
            "cpu_seconds": cpu,
            "fleetd_cpu_ms_per_job": 1000 * cpu["fleetd"] / max(1, len(ids)),
            "agents_cpu_ms_per_job": 1000 * cpu["agents"] / max(1, len(ids)),
            "tasks_cpu_ms_per_job": 1000 * cpu["tasks"] / max(1, len(ids)),
            "load_generator_cpu_ms_per_job": 1000 * cpu["load generator"] / max(1, len(ids)),
            "submitters": args.submitters,
        }
        return phases
    finally:
        for agent in agents:
            agent.terminate()
        for agent in agents:
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()


if __name__ == "__main__":
    main()
