"""RSS and CPU of `fleet-agent run` against a real `fleetd serve`, with a fake 8xH100 host.

    python bench/agent_footprint.py [--seconds 60] [--poll 1] [--shape FILE]

--shape: the fake host's NVML shape, tests/fixtures/nvml/h100_x8.json by default.

Starts fleetd (fresh data dir), enrols one agent, lets it settle, then samples
/proc/<pid> once a second for --seconds. A bare Python interpreter is measured side by side
as the floor. Prints a table and writes bench/results/agent_footprint.json.
Target (issue 3): under 60 MB RSS and under 1 % of one core.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid):
    """Resident set size of a process."""
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def threads(pid):
    """Thread count of a process."""
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("Threads:")).split()[1])


def start_fleetd(data_dir):
    """`fleetd init` and `fleetd serve` on a free port: (process, url, admin token)."""
    out = subprocess.run(
        [sys.executable, "-m", "fleetd", "init", "--data-dir", data_dir],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    admin = out.strip().splitlines()[-1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetd", "serve", "--bind", "127.0.0.1:0", "--data-dir", data_dir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    for line in proc.stderr:
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return proc, match.group(1), admin
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit("fleetd did not start")


def measure(pid, seconds):
    """Sample a process once a second; returns the figures."""
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    samples = []
    for _ in range(int(seconds)):
        time.sleep(1)
        samples.append(rss_bytes(pid))
    wall = time.monotonic() - start
    used = cpu_seconds(pid) - start_cpu
    return {
        "seconds": round(wall, 1),
        "cpu_percent_of_one_core": round(100 * used / wall, 3),
        "rss_mb_max": round(max(samples) / 1e6, 1),
        "rss_mb_mean": round(sum(samples) / len(samples) / 1e6, 1),
        "threads": threads(pid),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--poll", type=float, default=1.0, help="devices.poll_seconds")
    parser.add_argument("--shape", default=str(ROOT / "tests/fixtures/nvml/h100_x8.json"))
    parser.add_argument(
        "--settle", type=float, default=5, help="seconds to let the agent start before sampling"
    )
    parser.add_argument("--out", default=str(ROOT / "bench/results/agent_footprint.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="agent-footprint-") as tmp:
        os.chmod(
            tmp, 0o711
        )  # the agents' tasks run as other uids: their state dir must be passable
        fleetd, url, admin = start_fleetd(os.path.join(tmp, "fleetd"))
        agent = baseline = None
        try:
            http = requests.Session()
            http.headers["Authorization"] = f"Bearer {admin}"
            http.post(url + "/api/v1/fleets", json={"name": "bench"}, timeout=30).raise_for_status()
            join = http.post(url + "/api/v1/fleets/bench/join-tokens", json={}, timeout=30).json()[
                "token"
            ]
            state = os.path.join(tmp, "agent")
            config = os.path.join(tmp, "agent.toml")
            with open(config, "w") as fh:
                fh.write(
                    f'state_dir = "{state}"\nmachine_id = "bench-1"\n[labels]\nsimulated = "true"\n'
                    f'[local_api]\nlisten = "127.0.0.1:0"\n'
                    f'[devices]\nbackend = "fake:{args.shape}"\npoll_seconds = {args.poll}\n'
                )
            agent_cmd = [sys.executable, "-m", "agent"]
            subprocess.run(
                agent_cmd + ["join", "--server", url, "--config", config],
                check=True,
                capture_output=True,
                timeout=120,
                env=dict(os.environ, FLEET_AGENT_JOIN_TOKEN=join),
            )
            agent = subprocess.Popen(
                agent_cmd + ["run", "--config", config],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            baseline = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            time.sleep(args.settle)
            if agent.poll() is not None:
                raise SystemExit(f"fleet-agent exited with {agent.returncode}")
            results = {}
            samplers = [
                threading.Thread(
                    target=lambda k, p: results.__setitem__(k, measure(p, args.seconds)),
                    args=(name, proc.pid),
                )
                for name, proc in (("fleet-agent run", agent), ("bare python", baseline))
            ]
            for sampler in samplers:
                sampler.start()
            for sampler in samplers:
                sampler.join()
        finally:
            for proc in (agent, baseline):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=30)
            fleetd.send_signal(signal.SIGTERM)
            fleetd.wait(timeout=30)

    report = {
        "shape": os.path.relpath(args.shape, ROOT),
        "poll_seconds": args.poll,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "results": results,
    }
    print(
        f"{'process':<18} {'CPU % of one core':>18} {'RSS max MB':>11} {'RSS mean MB':>12} "
        f"{'threads':>8}"
    )
    for name in ("fleet-agent run", "bare python"):
        r = results[name]
        print(
            f"{name:<18} {r['cpu_percent_of_one_core']:>18.3f} {r['rss_mb_max']:>11.1f} "
            f"{r['rss_mb_mean']:>12.1f} {r['threads']:>8}"
        )
    print(
        f"over {results['fleet-agent run']['seconds']} s, shape {report['shape']}, "
        f"devices.poll_seconds {args.poll}, fleetd heartbeat interval default (10 s)"
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=2)


if __name__ == "__main__":
    main()
