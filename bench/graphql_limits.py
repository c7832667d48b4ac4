#!/usr/bin/env python3
"""Hostile GraphQL documents against a real `fleetd serve`: how long each takes to be refused, by the
client's clock, what it costs fleetd in CPU (its own /proc counters), and how /health answers
meanwhile.

The documents are the ones an audit sent (each at the size it used, or at the 64 KiB limit where it
used more): fragments that double at every spread, 20,000 operations, 40,000 __typename aliases,
30,000 aliased fields, 20,000 @skip directives. A load generator in its own process sends each one
--rounds times from --senders threads while this process asks /health every 10 ms.

    .venv/bin/python bench/graphql_limits.py --rounds 20
"""

import argparse
import json
import multiprocessing
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


def documents():
    def doubling(n, leaf="__typename"):
        chain = " ".join(f"fragment F{i} on Query {{ ...F{i + 1} ...F{i + 1} }}" for i in range(n))
        return f"query {{ ...F0 }} {chain} fragment F{n} on Query {{ {leaf} }}"

    return {
        "2^26 fragment spreads (1 KB)": doubling(26),
        "20,000 operations": " ".join(f"query q{i} {{ __typename }}" for i in range(20000)),
        "40,000 __typename aliases": "{ " + " ".join(f"a{i}: __typename" for i in range(40000)) + " }",
        "30,000 aliased fields": "{ " + " ".join(f"a{i}: myself {{ id }}" for i in range(30000)) + " }",
        "20,000 @skip": "{ " + "__typename @skip(if: false) " * 20000 + "}",
        "5,000 tokens under 64 KiB": "{ " + "a " * 5000 + "}",
        "1,000 aliases x 11 spreads": "query { " + "...W " * 11 + "} fragment W on Query { "
                                      + " ".join(f"t{i}: __typename" for i in range(1000)) + " }",
        "accepted: 1,000 aliases x 10 spreads": "query { " + "...W " * 10 + "} fragment W on Query { "
                                                + " ".join(f"t{i}: __typename" for i in range(1000)) + " }",
    }


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks of 10 ms


def send(url, admin, document, rounds, senders, out):
    """The load generator (its own process): `rounds` requests from `senders` threads; client times."""
    times, statuses, lock = [], [], threading.Lock()

    def worker(count):
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {admin}"
        for _ in range(count):
            start = time.perf_counter()
            resp = session.post(url + "/graphql", json={"query": document}, timeout=600)
            elapsed = time.perf_counter() - start
            with lock:
                times.append(elapsed)
                statuses.append(resp.status_code)

    threads = [threading.Thread(target=worker, args=(rounds // senders + (i < rounds % senders),))
               for i in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put((times, statuses))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="requests per document")
    parser.add_argument("--senders", type=int, default=4, help="threads of the load generator")
    args = parser.parse_args()
    results = {}
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
            for name, document in documents().items():
                results[name] = measure(url, admin, proc.pid, document, args)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "graphql_limits.json").write_text(json.dumps(results, indent=2))
    print(f"{'document':<38}{'bytes':>8}{'status':>8}{'p50 ms':>9}{'max ms':>9}{'fleetd CPU ms':>15}"
          f"{'/health p99 ms':>16}{'max ms':>9}")
    for name, r in results.items():
        print(f"{name:<38}{r['bytes']:>8}{r['status']:>8}{r['p50_ms']:>9.1f}{r['max_ms']:>9.1f}"
              f"{r['fleetd_cpu_ms_per_request']:>15.1f}{r['health_p99_ms']:>16.1f}{r['health_max_ms']:>9.1f}")


def measure(url, admin, pid, document, args):
    queue = multiprocessing.Queue()
    cpu_before = cpu_seconds(pid)
    sender = multiprocessing.Process(target=send, args=(url, admin, document, args.rounds, args.senders, queue))
    sender.start()
    health = []
    deadline = time.monotonic() + 600
    while sender.is_alive() and time.monotonic() < deadline:
        start = time.perf_counter()
        requests.get(url + "/api/v1/health", timeout=600)
        health.append(time.perf_counter() - start)
        time.sleep(0.01)
    times, statuses = queue.get(timeout=600)
    sender.join(timeout=60)
    cpu = cpu_seconds(pid) - cpu_before
    return {"bytes": len(document.encode()), "status": "/".join(sorted({str(s) for s in statuses})),
            "p50_ms": statistics.median(times) * 1000, "max_ms": max(times) * 1000,
            "fleetd_cpu_ms_per_request": cpu * 1000 / len(times),
            "health_probes": len(health), "health_p99_ms": percentile(health, 0.99) * 1000,
            "health_max_ms": max(health, default=float("nan")) * 1000}


if __name__ == "__main__":
    main()
