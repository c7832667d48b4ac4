#!/usr/bin/env python3
"""Chatty jobs against a real `fleetd serve` on SQLite and real `fleet-agent`s on fake 8 x H100
hosts: each job prints --lines lines of about 100 bytes (2,000,000: 200 MB) as fast as it can.

Measured, the client's clock beside fleetd's timestamps (the load generator is this process):
  - end reported: the job's `ended_at` (fleetd) after the command wrote its last line (the
    command prints its own clock last, to stderr; agents and fleetd share this host's clock;
    the line is searched for once the output is stored);
  - stored: how long after the end until `output/info` has no pending range;
  - database growth: fleetd.db and its WAL, before and after;
  - every line back: the whole output downloaded (`GET .../output`), each line checked, MB/s;
  - a search (`GET .../logs?q=`) for one line's unique text over the whole output;
  - fleetd's health p99, polled every 50 ms while the jobs run;
  - with --probes: no-op jobs submitted one after another while the chatty ones run, their
    submit -> start (fleetd's timestamps) against the same on the idle fleet.
Prints a table and writes JSON to bench/results/output.json.

    .venv/bin/python bench/output.py --lines 2000000
    .venv/bin/python bench/output.py --lines 2000000 --jobs 10 --agents 4 --probes 20
"""

import argparse
import datetime as dt
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import requests

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRINTER = (
    "import sys, time\n"
    "w = sys.stdout.write\n"
    "for i in range({lines}):\n"
    "    w('%010d ' % i + 'x' * 88 + '\\n')\n"
    "sys.stdout.flush()\n"
    "sys.stderr.write('last line at %.6f\\n' % time.time())\n"
)


def _parse(ts):
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _db_bytes(data_dir):
    return sum(
        os.path.getsize(os.path.join(data_dir, name))
        for name in ("fleetd.db", "fleetd.db-wal")
        if os.path.exists(os.path.join(data_dir, name))
    )


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


def start_fleetd(data_dir):
    init = subprocess.run(
        [sys.executable, "-m", "fleetd", "init", "--data-dir", data_dir],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    admin = init.stdout.strip().splitlines()[-1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetd", "serve", "--bind", "127.0.0.1:0", "--data-dir", data_dir],
        stderr=subprocess.PIPE,
        text=True,
    )
    url = None
    for line in proc.stderr:
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            url = match.group(1)
            break
    if not url:
        proc.kill()
        raise SystemExit("fleetd did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, url, admin


def start_agents(http, url, data_dir, count):
    http.post(url + "/api/v1/fleets", json={"name": "out"}, timeout=30).raise_for_status()
    join = http.post(url + "/api/v1/fleets/out/join-tokens", json={"max_uses": count}, timeout=30)
    join.raise_for_status()
    shape = ROOT / "tests" / "fixtures" / "nvml" / "h100_x8.json"
    agents = []
    for i in range(count):
        root = pathlib.Path(data_dir) / f"agent-{i}"
        root.mkdir()
        config = root / "agent.toml"
        config.write_text(
            f'state_dir = "{root / "state"}"\nmachine_id = "output-bench-{i}"\n'
            f'log_level = "warning"\n[local_api]\nlisten = "127.0.0.1:0"\n'
            f'[devices]\nbackend = "fake:{shape}"\n'
        )
        subprocess.run(
            [sys.executable, "-m", "agent", "join", "--server", url, "--config", str(config)],
            check=True,
            capture_output=True,
            timeout=60,
            env=dict(os.environ, FLEET_AGENT_JOIN_TOKEN=join.json()["token"]),
        )
        agents.append(
            subprocess.Popen(
                [sys.executable, "-m", "agent", "run", "--config", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    for _ in range(600):
        nodes = http.get(url + "/api/v1/nodes?fleet=out", timeout=30).json()["items"]
        if sum(n["status"] == "ready" for n in nodes) == count:
            return agents
        time.sleep(0.1)
    raise SystemExit("the agents did not come up")


def probe_starts(http, url, count):
    """Submit -> start (fleetd's timestamps) of `count` no-op jobs, one after another."""
    spec = {"name": "probe", "command": ["true"], "node_selector": {"fleet": "out"}}
    starts = []
    for _ in range(count):
        job = http.post(url + "/api/v1/jobs", json=spec, timeout=30).json()
        done = http.get(f"{url}/api/v1/jobs/{job['id']}?wait_seconds=30", timeout=60).json()
        started = done["tasks"][0]["started_at"]
        if started is None:
            raise SystemExit(f"probe {job['id']} did not start: {json.dumps(done)[:500]}")
        starts.append(_parse(started) - _parse(done["submitted_at"]))
    return starts


def health_poller(url, stop):
    latencies = []

    def run():
        session = requests.Session()
        for _ in range(10_000_000):
            if stop.is_set():
                return
            t0 = time.perf_counter()
            session.get(url + "/api/v1/health", timeout=30)
            latencies.append(time.perf_counter() - t0)
            stop.wait(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return latencies, thread


def wait_ended(http, url, job_id, limit_seconds):
    deadline = time.monotonic() + limit_seconds
    while time.monotonic() < deadline:
        job = http.get(f"{url}/api/v1/jobs/{job_id}?wait_seconds=30", timeout=60).json()
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
    raise SystemExit(f"job {job_id} did not end within {limit_seconds} s")


def last_line_at(http, url, job_id):
    page = http.get(f"{url}/api/v1/jobs/{job_id}/logs?stream=stderr&q=last line at", timeout=60)
    for item in page.json()["items"]:
        match = re.match(r"last line at ([0-9.]+)", item["text"])
        if match:
            return float(match.group(1))
    raise SystemExit(f"job {job_id}: no 'last line at' line")


def wait_stored(http, url, job_id, limit_seconds):
    t0 = time.monotonic()
    for _ in range(int(limit_seconds * 10)):
        info = http.get(f"{url}/api/v1/jobs/{job_id}/output/info", timeout=30).json()
        if not info["pending_ranges"] and info["outputs"] and info["outputs"][0]["ended"]:
            return time.monotonic() - t0, info
        time.sleep(0.1)
    raise SystemExit(f"job {job_id}: output not stored within {limit_seconds} s: {info}")


def download(http, url, job_id, lines):
    """The whole output: (seconds, bytes), every line checked."""
    t0 = time.perf_counter()
    size, expected, tail = 0, 0, b""
    with http.get(
        f"{url}/api/v1/jobs/{job_id}/output?stream=stdout", stream=True, timeout=600
    ) as r:
        r.raise_for_status()
        for piece in r.iter_content(chunk_size=1 << 20):
            size += len(piece)
            parts = (tail + piece).split(b"\n")
            tail = parts.pop()
            for part in parts:
                if not part.startswith(b"%010d " % expected):
                    raise SystemExit(f"job {job_id}: line {expected} reads {part[:40]!r}")
                expected += 1
    seconds = time.perf_counter() - t0
    if expected != lines or tail:
        raise SystemExit(f"job {job_id}: {expected} lines back of {lines}")
    return seconds, size


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--agents", type=int, default=1)
    parser.add_argument("--probes", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        os.chmod(data_dir, 0o711)  # tasks run as other uids
        proc, url, admin = start_fleetd(data_dir)
        agents = []
        try:
            http = requests.Session()
            http.headers["Authorization"] = f"Bearer {admin}"
            agents = start_agents(http, url, data_dir, args.agents)
            results = run(http, url, data_dir, args)
        finally:
            for agent in agents:
                agent.terminate()
            for agent in agents:
                agent.wait(timeout=60)
            proc.terminate()
            proc.wait(timeout=30)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "output.json").write_text(json.dumps(results, indent=2))
    for key, value in results.items():
        print(f"{key:<46}{value}")


def run(http, url, data_dir, args):
    idle = probe_starts(http, url, args.probes) if args.probes else []
    db0 = _db_bytes(data_dir)
    spec = {
        "name": "chatty",
        "command": ["python3", "-c", PRINTER.format(lines=args.lines)],
        "node_selector": {"fleet": "out"},
    }
    stop = threading.Event()
    health, poller = health_poller(url, stop)
    ids = [
        http.post(url + "/api/v1/jobs", json=spec, timeout=30).json()["id"]
        for _ in range(args.jobs)
    ]
    busy = probe_starts(http, url, args.probes) if args.probes else []
    ended = [wait_ended(http, url, job_id, 3600) for job_id in ids]
    stop.set()
    poller.join(timeout=60)
    if any(job["state"] != "succeeded" for job in ended):
        raise SystemExit(f"not all succeeded: {[job['state'] for job in ended]}")
    stored = [wait_stored(http, url, job_id, 600) for job_id in ids]
    end_lags = [_parse(job["ended_at"]) - last_line_at(http, url, job["id"]) for job in ended]
    db1 = _db_bytes(data_dir)
    seconds, size = download(http, url, ids[0], args.lines)
    needle = f"{args.lines * 2 // 3:010d} "
    t0 = time.perf_counter()
    found = http.get(f"{url}/api/v1/jobs/{ids[0]}/logs", params={"q": needle}, timeout=600).json()
    search = time.perf_counter() - t0
    if [item["text"][:11] for item in found["items"]] != [needle]:
        raise SystemExit(f"the search found {found['items'][:3]}")
    results = {
        "jobs x lines": f"{args.jobs} x {args.lines:,} on {args.agents} agent(s)",
        "end reported after the last line, s (max)": round(max(end_lags), 3),
        "stored after the end, s (max)": round(max(s for s, _info in stored), 2),
        "database growth, MB (all jobs)": round((db1 - db0) / 1e6, 2),
        "output per job, MB": round(stored[0][1]["bytes"] / 1e6, 1),
        "stored per job (gzip), MB": round(stored[0][1]["stored_bytes"] / 1e6, 1),
        "download, MB/s": round(size / 1e6 / seconds, 1),
        "search over the whole output, s": round(search, 3),
        "fleetd health p50 / p99 while running, ms": (
            f"{percentile(health, 0.5):.1f} / {percentile(health, 0.99):.1f}"
        ),
    }
    if args.probes:
        results["probe submit -> start idle p50 / max, ms"] = (
            f"{statistics.median(idle) * 1000:.0f} / {max(idle) * 1000:.0f}"
        )
        results["probe submit -> start busy p50 / max, ms"] = (
            f"{statistics.median(busy) * 1000:.0f} / {max(busy) * 1000:.0f}"
        )
    return results


if __name__ == "__main__":
    main()
