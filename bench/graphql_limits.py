#!/usr/bin/env python3
"""Hostile GraphQL documents against a real `fleetd serve`: how long each takes to be refused (by
the client's clock), what it costs fleetd in CPU (its own /proc counters), and how /health answers
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
import os
import sys
import tempfile
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.scale import ROOT, cpu_seconds, percentiles, start_fleetd, stop_processes  # noqa: E402


def documents():
    def doubling(n, leaf="__typename"):
        chain = " ".join(f"fragment F{i} on Query {{ ...F{i + 1} ...F{i + 1} }}" for i in range(n))
        return f"query {{ ...F0 }} {chain} fragment F{n} on Query {{ {leaf} }}"

    return {
        "2^26 fragment spreads (1 KB)": doubling(26),
        "20,000 operations": " ".join(f"query q{i} {{ __typename }}" for i in range(20000)),
        "40,000 __typename aliases": "{ "
        + " ".join(f"a{i}: __typename" for i in range(40000))
        + " }",
        "30,000 aliased fields": "{ "
        + " ".join(f"a{i}: myself {{ id }}" for i in range(30000))
        + " }",
        "20,000 @skip": "{ " + "__typename @skip(if: false) " * 20000 + "}",
        "5,000 tokens under 64 KiB": "{ " + "a " * 5000 + "}",
        "1,000 aliases x 11 spreads": "query { "
        + "...W " * 11
        + "} fragment W on Query { "
        + " ".join(f"t{i}: __typename" for i in range(1000))
        + " }",
        "accepted: 1,000 aliases x 10 spreads": "query { "
        + "...W " * 10
        + "} fragment W on Query { "
        + " ".join(f"t{i}: __typename" for i in range(1000))
        + " }",
    }


def send(url, admin, document, rounds, senders, out):
    """The load generator (its own process): `rounds` requests from `senders` threads; client
    times."""
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

    threads = [
        threading.Thread(target=worker, args=(rounds // senders + (i < rounds % senders),))
        for i in range(senders)
    ]
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
        proc, url, admin = start_fleetd(data_dir, os.path.join(data_dir, "fleetd.log"))
        try:
            for name, document in documents().items():
                results[name] = measure(url, admin, proc.pid, document, args)
        finally:
            stop_processes([proc])
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "graphql_limits.json").write_text(json.dumps(results, indent=2))
    print(
        f"{'document':<38}{'bytes':>8}{'status':>8}{'p50 ms':>9}{'max ms':>9}{'fleetd CPU ms':>15}"
        f"{'/health p99 ms':>16}{'max ms':>9}"
    )
    for name, r in results.items():
        print(
            f"{name:<38}{r['bytes']:>8}{r['status']:>8}{r['p50_ms']:>9.1f}{r['max_ms']:>9.1f}"
            f"{r['fleetd_cpu_ms_per_request']:>15.1f}{r['health_p99_ms']:>16.1f}{r['health_max_ms']:>9.1f}"
        )


def measure(url, admin, pid, document, args):
    queue = multiprocessing.Queue()
    cpu_before = cpu_seconds(pid)
    sender = multiprocessing.Process(
        target=send, args=(url, admin, document, args.rounds, args.senders, queue)
    )
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
    sent, probes = percentiles(times), percentiles(health)
    return {
        "bytes": len(document.encode()),
        "status": "/".join(sorted({str(s) for s in statuses})),
        "p50_ms": sent["p50_ms"],
        "max_ms": sent["max_ms"],
        "fleetd_cpu_ms_per_request": cpu * 1000 / len(times),
        "health_probes": probes["count"],
        "health_p99_ms": probes["p99_ms"],
        "health_max_ms": probes["max_ms"],
    }


if __name__ == "__main__":
    main()
