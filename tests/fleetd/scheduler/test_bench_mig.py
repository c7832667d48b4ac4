"""bench/mig.py runs end to end on a small fleet, so that it cannot rot. Assertions are on the
output, never on timings."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_bench_compares_dynamic_fixed_and_no_mig_and_writes_json(tmp_path):
    out = tmp_path / "mig.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "mig.py"),
            *("--gpus", "80", "--ticks", "200", "--warmup", "40", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "repartitions" in proc.stdout
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"none", "fixed", "dynamic"}
    assert results["none"]["repartitions"] == results["fixed"]["repartitions"] == 0
    assert results["dynamic"]["repartitions"] > 0
    # the same arrivals: MIG lets more of them run than whole GPUs only
    assert results["dynamic"]["jobs_waiting_mean"] < results["none"]["jobs_waiting_mean"]
