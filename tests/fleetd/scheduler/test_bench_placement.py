"""bench/placement.py runs end to end on a small slice, so that it cannot rot.

A 24-node cut of the real node list and the first 300 pods of a real pod list (committed
under tests/fixtures/traces, so the test runs wherever the suite does) keep the whole protocol
(inflation to 130%, shuffling, the 80/90/100% marks, fragmentation at 90%) while running in seconds.
Assertions are on the output, never on timings.
"""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
TRACES = ROOT / "tests" / "fixtures" / "traces"
NODES = TRACES / "openb_node_list_gpu_node_every50.csv"
PODS = TRACES / "openb_pod_list_gpuspec10_first300.csv"
POLICIES = {"random", "bestfit", "packing", "dotprod", "fgd", "fragbal"}
KEYS = {
    "alloc_at_80",
    "alloc_at_90",
    "alloc_at_100",
    "alloc_final",
    "unallocated_final_pct",
    "frag_ratio_at_90",
    "decisions_per_second",
}


@pytest.fixture(scope="module")
def small_trace():
    # Every 50th node keeps the mix of GPU models (G2, T4, P100, V100, ...).
    return NODES, PODS


def run_bench(*args):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "placement.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_bench_runs_every_policy_and_writes_the_documented_json(small_trace, tmp_path):
    nodes, pods = small_trace
    out = tmp_path / "placement.json"
    stdout = run_bench(
        "--nodes", nodes, "--pods", pods, "--seeds", 2, "--policy", "all", "--json", out
    )
    doc = json.loads(out.read_text())
    assert doc["default_policy"] == "fragbal"
    assert set(doc["policies"]) == POLICIES
    for name, figures in doc["policies"].items():
        assert KEYS <= set(figures), name
        for key in KEYS - {"decisions_per_second"}:
            assert 0 <= figures[key] <= 100, (name, key, figures[key])
        assert figures["alloc_final"] + figures["unallocated_final_pct"] == pytest.approx(
            100, abs=0.02
        )
        assert (
            figures["alloc_at_80"]
            <= figures["alloc_at_100"] + 1e-9
            <= figures["alloc_final"] + 1e-9
        )
        assert figures["decisions_per_second"] > 0
        assert figures["seeds"] == 2
        assert name in stdout
    # Demand arrives up to 130% of capacity, so no policy can hold on to every GPU share,
    # and the fragmentation-aware ones are not beaten by a random placement.
    assert all(f["alloc_final"] < 100 for f in doc["policies"].values())
    assert doc["policies"]["fgd"]["alloc_final"] >= doc["policies"]["random"]["alloc_final"]
    assert doc["policies"]["fragbal"]["alloc_final"] >= doc["policies"]["random"]["alloc_final"]


def test_bench_max_pods_replays_a_prefix_and_reports_unreached_marks_as_null(small_trace, tmp_path):
    nodes, pods = small_trace
    out = tmp_path / "one.json"
    run_bench(
        "--nodes",
        nodes,
        "--pods",
        pods,
        "--seeds",
        1,
        "--policy",
        "fgd",
        "--max-pods",
        20,
        "--json",
        out,
    )
    doc = json.loads(out.read_text())
    figures = doc["policies"]["fgd"]
    assert set(doc["policies"]) == {"fgd"}
    assert figures["pods_per_seed"] == 20
    assert figures["alloc_at_100"] is None
    assert 0 < figures["alloc_final"] < 100


def test_bench_refuses_an_unknown_policy(small_trace):
    nodes, pods = small_trace
    bench = str(ROOT / "bench" / "placement.py")
    proc = subprocess.run(
        [sys.executable, bench, "--nodes", str(nodes), "--pods", str(pods), "--policy", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown policy" in proc.stderr
