"""bench/topology.py runs end to end on the small committed trace slice, so that it cannot rot.
Assertions are on the output, never on timings."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
TRACES = ROOT / "tests" / "fixtures" / "traces"


def test_bench_compares_today_with_topology_and_writes_json(tmp_path):
    out = tmp_path / "topology.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "topology.py"),
            "--nodes",
            str(TRACES / "openb_node_list_gpu_node_every50.csv"),
            "--pods",
            str(TRACES / "openb_pod_list_gpuspec10_first300.csv"),
            "--seeds",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "time per decision x" in proc.stdout
    doc = json.loads(out.read_text())
    today, topology = doc["results"]["today"], doc["results"]["topology"]
    assert topology["aligned_pct"] == 100.0 and topology["aligned_when_possible_pct"] == 100.0
    assert topology["multi_gpu_placed"] > 0 and today["pods"] == topology["pods"]
    assert abs(doc["results"]["stranded_delta_points"]) <= 0.1
