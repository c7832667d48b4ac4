#!/usr/bin/env python3
"""Cancel latency: from `POST /jobs/{id}/cancel` until the job's process is gone, on an idle fleet.

A real `fleetd serve` (default settings: heartbeats every 10 s) and one real `fleet-agent run` on
a fake 8 x H100 host. N jobs, one at a time: each runs `sleep` (its pid written to a file by the
shell that then execs it), and once that process exists and fleetd shows the task running, the
job is cancelled. Measured per job:
  - cancel answer: the cancel call's own round trip (it answers `cancelling`);
  - process gone: cancel sent -> the process has exited (a pidfd of it becomes readable);
  - job cancelled: cancel sent -> `GET /jobs/{id}?wait_seconds=` answers `cancelled`.
Prints a table and writes JSON to bench/results/cancel_latency.json.

    .venv/bin/python bench/cancel_latency.py --jobs 50
"""

import argparse
import datetime as dt
import json
import os
import pathlib
import re
import select
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


def start_fleetd(data_dir):
    """(process, url, admin token) of a fresh `fleetd serve`."""
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
    for line in proc.stderr:
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, match.group(1), admin
    proc.kill()
    raise SystemExit("fleetd did not start")


def start_agent(url, join, root):
    """A joined `fleet-agent run` on a fake 8 x H100 host."""
    shape = ROOT / "tests" / "fixtures" / "nvml" / "h100_x8.json"
    root.mkdir()
    config = root / "agent.toml"
    config.write_text(
        f'state_dir = "{root / "state"}"\nmachine_id = "bench-cancel"\nlog_level = "warning"\n'
        f'[local_api]\nlisten = "127.0.0.1:0"\n[devices]\nbackend = "fake:{shape}"\n'
    )
    subprocess.run(
        [sys.executable, "-m", "agent", "join", "--server", url, "--config", str(config)],
        check=True,
        capture_output=True,
        timeout=60,
        env=dict(os.environ, FLEET_AGENT_JOIN_TOKEN=join),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for_pid(path, timeout=60):
    """The pid the job's shell wrote, once it has exec'd `sleep` (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = ""
        if text.endswith("\n"):
            pid = int(text)
            try:
                if os.readlink(f"/proc/{pid}/exe").endswith("sleep"):
                    return pid
            except OSError:
                pass
        time.sleep(0.005)
    raise SystemExit(f"no running sleep in {path} within {timeout}s")


def one_cancel(http, url, spec, pid_file):
    """Submit, wait for the process, cancel; (answer s, gone s, cancelled s, state the cancel
    answered)."""
    job = http.post(url + "/api/v1/jobs", json=spec, timeout=30).json()
    pid = wait_for_pid(pid_file)
    # Cancel once fleetd knows it runs (the agent reported its start), as a user would see it.
    for _ in range(12000):
        if (
            http.get(f"{url}/api/v1/jobs/{job['id']}", timeout=30).json()["tasks"][0]["state"]
            == "running"
        ):
            break
        time.sleep(0.005)
    else:
        raise SystemExit(f"job {job['id']} never reported running")
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        sent = time.perf_counter()
        answer = http.post(f"{url}/api/v1/jobs/{job['id']}/cancel", timeout=30).json()
        answered = time.perf_counter() - sent
        if not poller.poll(60_000):
            raise SystemExit(f"job {job['id']}: pid {pid} still runs 60 s after the cancel")
        gone = time.perf_counter() - sent
    finally:
        os.close(pidfd)
    for _ in range(10):
        state = http.get(f"{url}/api/v1/jobs/{job['id']}?wait_seconds=30", timeout=60).json()[
            "state"
        ]
        if state == "cancelled":
            break
    else:
        raise SystemExit(f"job {job['id']} is {state}, not cancelled")
    cancelled = time.perf_counter() - sent
    pid_file.unlink()
    return answered, gone, cancelled, answer["state"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        os.chmod(
            data_dir, 0o711
        )  # the agents' tasks run as other uids: their state dir must be passable
        proc, url, admin = start_fleetd(data_dir)
        agent = None
        try:
            http = requests.Session()
            http.headers["Authorization"] = f"Bearer {admin}"
            http.post(url + "/api/v1/fleets", json={"name": "bench"}, timeout=30).raise_for_status()
            join = http.post(url + "/api/v1/fleets/bench/join-tokens", json={}, timeout=30).json()[
                "token"
            ]
            agent = start_agent(url, join, pathlib.Path(data_dir) / "agent")
            for _ in range(600):
                nodes = http.get(url + "/api/v1/nodes?fleet=bench", timeout=30).json()["items"]
                if nodes and nodes[0]["status"] == "ready":
                    break
                time.sleep(0.1)
            else:
                raise SystemExit("the agent's node did not become ready")
            pid_file = pathlib.Path(data_dir) / "pid"
            spec = {
                "name": "sleeper",
                "resources": {"gpus": 1},
                "command": [
                    "sh",
                    "-c",
                    f'echo $$ > "{pid_file}.tmp" && mv "{pid_file}.tmp" "{pid_file}" '
                    f"&& exec sleep 600",
                ],
            }
            rows = [one_cancel(http, url, spec, pid_file) for _ in range(args.jobs)]
        finally:
            if agent is not None:
                agent.terminate()
                agent.wait(timeout=60)
            proc.terminate()
            proc.wait(timeout=30)

    answered, gone, cancelled, states = zip(*rows)
    results = {
        "date": dt.date.today().isoformat(),
        "jobs": args.jobs,
        "heartbeat_interval_seconds": 10,
        "cancel_answered": {s: sum(1 for x in states if x == s) for s in set(states)},
        "phases": {
            name: {
                "p50_ms": percentile(values, 0.5),
                "p95_ms": percentile(values, 0.95),
                "max_ms": max(values) * 1000,
            }
            for name, values in (
                ("cancel answer", answered),
                ("cancel -> process gone", gone),
                ("cancel -> job cancelled", cancelled),
            )
        },
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cancel_latency.json").write_text(json.dumps(results, indent=2))
    print(
        f"{args.jobs} jobs, one at a time, heartbeats every 10 s; the cancel answered "
        + ", ".join(f"{s} {n} time(s)" for s, n in sorted(results["cancel_answered"].items()))
    )
    print(f"{'interval':<26}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}")
    for name, r in results["phases"].items():
        print(f"{name:<26}{r['p50_ms']:>10.1f}{r['p95_ms']:>10.1f}{r['max_ms']:>10.1f}")


if __name__ == "__main__":
    main()
