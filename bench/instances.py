#!/usr/bin/env python3
"""Instances: from `POST /api/v1/instances` until its connection URL answers HTTP, on an idle fleet.

A real `fleetd serve` (SQLite, default settings) and one real `fleet-agent run` on a fake 8 x H100
host. --rounds instances one at a time, each: create (1 GPU, port 8000/http), then
`GET .../connection?wait_seconds=30` (answers once it runs), then GET the URL until it answers
200; measured from the create request to that first 200. Then it is deleted (and the next one
created once it is). Two kinds:
  - host process: `python3 -m http.server $FLEET_PORT_8000`;
  - container (when podman runs here): busybox `httpd -f -p 8000` in an image imported without a
    registry (tests/agent/podman_support.py), port 8000 published to the host port.
Prints a table and writes JSON to bench/results/instances.json.

    .venv/bin/python bench/instances.py --rounds 20
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import requests

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPE = ROOT / "tests" / "fixtures" / "nvml" / "h100_x8.json"

from bench.cancel_latency import start_fleetd  # noqa: E402


def start_agent(url, join, root, containers, env):
    root.mkdir()
    config = root / "agent.toml"
    command = json.dumps(" ".join(containers) if containers else "none")
    config.write_text(
        f'state_dir = "{root / "state"}"\nmachine_id = "bench-instances"\nlog_level = "warning"\n'
        f'[local_api]\nlisten = "127.0.0.1:0"\n[devices]\nbackend = "fake:{SHAPE}"\n'
        f'[ports]\nrange = "42000-42999"\n[containers]\ncommand = {command}\n'
    )
    subprocess.run(
        [sys.executable, "-m", "agent", "join", "--server", url, "--config", str(config)],
        check=True,
        capture_output=True,
        timeout=60,
        env=dict(env, FLEET_AGENT_JOIN_TOKEN=join),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "run", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def podman_setup(directory):
    """(podman command, environment) with the test image imported, or (None, reason)."""
    import pytest

    from tests.agent.podman_support import PODMAN, prepare_podman

    try:
        return PODMAN, prepare_podman(directory)
    except pytest.skip.Exception as exc:
        return None, str(exc)


def one_round(http, url, spec):
    started = time.perf_counter()
    inst = http.post(url + "/api/v1/instances", json=spec, timeout=30).json()
    conn = None
    for _ in range(10):
        resp = http.get(
            f"{url}/api/v1/instances/{inst['id']}/connection?wait_seconds=30", timeout=60
        )
        if resp.status_code == 200:
            conn = resp.json()
            break
    if conn is None:
        raise SystemExit(f"instance {inst['id']} never ran: {resp.text}")
    for _ in range(3000):
        try:
            if requests.get(conn["url"], timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.005)
    else:
        raise SystemExit(f"{conn['url']} never answered")
    elapsed = time.perf_counter() - started
    http.delete(f"{url}/api/v1/instances/{inst['id']}", timeout=30)
    for _ in range(10):
        if (
            http.get(f"{url}/api/v1/instances/{inst['id']}?wait_seconds=10", timeout=30).json()[
                "state"
            ]
            == "deleted"
        ):
            break
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as data_dir:
        os.chmod(
            data_dir, 0o711
        )  # the agents' tasks run as other uids: their state dir must be passable
        containers, env = podman_setup(data_dir)
        skipped = None
        if containers is None:
            skipped, env = env, dict(os.environ)
        proc, url, admin = start_fleetd(data_dir)
        agent = None
        try:
            http = requests.Session()
            http.headers["Authorization"] = f"Bearer {admin}"
            http.post(url + "/api/v1/fleets", json={"name": "bench"}, timeout=30).raise_for_status()
            join = http.post(url + "/api/v1/fleets/bench/join-tokens", json={}, timeout=30).json()[
                "token"
            ]
            agent = start_agent(url, join, pathlib.Path(data_dir) / "agent", containers, env)
            for _ in range(600):
                nodes = http.get(url + "/api/v1/nodes?fleet=bench", timeout=30).json()["items"]
                if nodes and nodes[0]["status"] == "ready":
                    break
                time.sleep(0.1)
            kinds = {
                "host process": {
                    "name": "web",
                    "resources": {"gpus": 1},
                    "ports": [{"port": 8000}],
                    "command": ["sh", "-c", "exec python3 -m http.server $FLEET_PORT_8000"],
                }
            }
            if containers:
                kinds["container"] = {
                    "name": "web-c",
                    "resources": {"gpus": 1},
                    "ports": [{"port": 8000}],
                    "image": "localhost/fleet-test-busybox:latest",
                    "command": [
                        "sh",
                        "-c",
                        "echo ok > /tmp/index.html && exec httpd -f -p 8000 -h /tmp",
                    ],
                }
            for kind, spec in kinds.items():
                times = [one_round(http, url, spec) for _ in range(args.rounds)]
                results[kind] = {
                    "rounds": len(times),
                    "p50_s": statistics.median(times),
                    "p90_s": sorted(times)[int(0.9 * (len(times) - 1))],
                    "max_s": max(times),
                }
            if skipped:
                results["container"] = {"skipped": skipped}
        finally:
            if agent is not None:
                agent.terminate()
                agent.wait(timeout=60)
                from tests.agent.instance_support import kill_left_instances

                kill_left_instances(
                    pathlib.Path(data_dir) / "agent" / "state"
                )  # instances outlive their agent
            proc.terminate()
            proc.wait(timeout=60)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "instances.json").write_text(json.dumps(results, indent=2))
    for kind, r in results.items():
        if "skipped" in r:
            print(f"{kind:<14} skipped: {r['skipped']}")
        else:
            print(
                f"{kind:<14} create -> answering  p50 {r['p50_s'] * 1000:.0f} ms  p90 "
                f"{r['p90_s'] * 1000:.0f} ms  max {r['max_s'] * 1000:.0f} ms  ({r['rounds']} "
                f"rounds)"
            )


if __name__ == "__main__":
    main()
