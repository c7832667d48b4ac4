#!/usr/bin/env python3
"""N simulated agents against a real `fleetd serve`: registration and heartbeat throughput and latency.

Runs two phases in one process, side by side so that the noisy machine affects both alike:
  1. heartbeats from N agents (C client threads) for D seconds;
  2. the same while H extra connections hold unfinished requests open (as long-polling agents do).
Prints a table and writes JSON to bench/results/control_plane.json.

    .venv/bin/python bench/control_plane.py --agents 200 --clients 8 --seconds 10 --held 1000
"""

import argparse
import json
import os
import pathlib
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

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
            resp = http.post(url + "/api/v1/agent/heartbeat", json={"tasks": []}, timeout=30,
                             headers={"Authorization": f"Bearer {token}", "X-Fleet-Protocol": "1"})
            local.append(time.perf_counter() - t0)
            resp.raise_for_status()
            i += 1
        with lock:
            latencies.extend(local)

    threads = [threading.Thread(target=worker, args=(sessions[c::clients],)) for c in range(clients)]
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
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as data_dir:
        init = subprocess.run([sys.executable, "-m", "fleetd", "init", "--data-dir", data_dir], check=True,
                              capture_output=True, text=True, timeout=60)
        admin = init.stdout.strip().splitlines()[-1]
        proc = subprocess.Popen([sys.executable, "-m", "fleetd", "serve", "--bind", "127.0.0.1:0", "--data-dir",
                                 data_dir], stderr=subprocess.PIPE, text=True)
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
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "control_plane.json").write_text(json.dumps(results, indent=2))
    print(f"{'phase':<34}{'ops/s':>10}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}")
    for name, r in results["phases"].items():
        print(f"{name:<34}{r['ops_per_s']:>10.0f}{r['p50_ms']:>10.2f}{r['p95_ms']:>10.2f}{r['p99_ms']:>10.2f}")


def run(url, admin, args):
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {admin}"
    http.post(url + "/api/v1/fleets", json={"name": "bench"}, timeout=30).raise_for_status()
    join = http.post(url + "/api/v1/fleets/bench/join-tokens", json={}, timeout=30).json()["token"]
    gpu = {"uuid": "", "index": 0, "model": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * 2**30}
    sessions, reg_latencies = [], []
    for i in range(args.agents):
        body = {"hostname": f"sim-{i}", "machine_id": f"sim-{i}", "agent_version": "bench", "address": "127.0.0.1",
                "resources": {"cpu_count": 64, "memory_bytes": 2**39},
                "gpus": [dict(gpu, uuid=f"GPU-{i}-{k}", index=k) for k in range(8)]}
        t0 = time.perf_counter()
        resp = requests.post(url + "/api/v1/agent/register", json=body, timeout=30,
                             headers={"Authorization": f"Bearer {join}", "X-Fleet-Protocol": "1"})
        reg_latencies.append(time.perf_counter() - t0)
        resp.raise_for_status()
        sessions.append(resp.json()["session_token"])

    def summary(latencies, seconds):
        return {"ops": len(latencies), "ops_per_s": len(latencies) / seconds, "p50_ms": percentile(latencies, 0.5),
                "p95_ms": percentile(latencies, 0.95), "p99_ms": percentile(latencies, 0.99),
                "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan")}

    phases = {"register (sequential)": summary(reg_latencies, sum(reg_latencies))}
    phases[f"heartbeat, {args.clients} clients"] = summary(heartbeat_phase(url, sessions, args.clients, args.seconds),
                                                           args.seconds)
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    held = []
    try:
        for _ in range(args.held):
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.sendall(b"POST /api/v1/agent/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            held.append(sock)
        phases[f"heartbeat, +{args.held} held requests"] = summary(
            heartbeat_phase(url, sessions, args.clients, args.seconds), args.seconds)
    finally:
        for sock in held:
            sock.close()
    return {"agents": args.agents, "clients": args.clients, "seconds": args.seconds, "held": args.held,
            "cpu_count": os.cpu_count(), "phases": phases}


if __name__ == "__main__":
    main()
