#!/usr/bin/env python3
"""Placement quality and speed on the Alibaba GPU traces, with the FGD paper's protocol.

Replays a pod list of Alibaba's public GPU cluster traces (openb_*.csv, in a directory
$TRACES) through the real engine in fleetd/scheduler/, for every policy side by side, and
compares with the paper artifact's published figures (PUBLISHED.md beside the pod list, when
there is one):

  for each seed: the pod list shuffled with the seed, followed by pods sampled uniformly
  with replacement from it until the next would push requested GPU above 130% of cluster
  GPU capacity (the artifact's order: its simulator appends the sampled pods after the
  shuffled list, and replaying them shuffled together instead moves GpuPacking's figures
  by more than a point); the node order shuffled too, as it breaks score ties as node
  names do in the paper's simulator; pods placed one at a time, never leaving; a pod that
  does not fit fails and is not retried.

Reported, as the mean over seeds: GPU allocation ratio when arrived GPU demand reaches
80%, 90% and 100% of capacity (the mean over every decision whose arrived demand rounds
to that percentage, as the artifact's analysis does) and after the last pod; the final
unallocated GPU %; the fragmentation ratio at 90% arrived (fragmented / idle GPU share
against the typical task shapes, per node as in the paper; the shapes are the most
popular ones that make up --typical-coverage of the pod list, 95% as in the artifact's
run scripts); and placement decisions per second inside the engine. --max-pods N replays
only the first N pods of each seed's sequence, for quick runs; percentages such a run
does not reach are reported as null.

    .venv/bin/python bench/placement.py --nodes $TRACES/openb_node_list_gpu_node.csv \\
        --pods $TRACES/openb_pod_list_gpushare40.csv --seeds 10 --policy all \\
        --json bench/results/placement_gpushare40.json
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import random
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fleetd.scheduler import (  # noqa: E402
    DEFAULT_POLICY,
    POLICIES,
    ClusterSnapshot,
    FragmentationModel,
    GpuSnapshot,
    NodeSnapshot,
    PlacementEngine,
    TaskRequest,
    WorkloadProfile,
    make_policy,
)

MIB = 1024 * 1024
INFLATION = 1.30
SEED_BASE = 42
POLICY_ORDER = ["random", "dotprod", "packing", "bestfit", "fgd", DEFAULT_POLICY]
# Our policy names -> the artifact's names in PUBLISHED.md.
PUBLISHED_NAMES = {
    "random": "Random",
    "dotprod": "DotProd",
    "packing": "GpuPacking",
    "bestfit": "BestFit",
    "fgd": "FGD",
}
METRICS = [
    "alloc_at_80",
    "alloc_at_90",
    "alloc_at_100",
    "alloc_final",
    "unallocated_final_pct",
    "frag_ratio_at_90",
]


def load_nodes(path) -> list[NodeSnapshot]:
    """Node list CSV (sn, cpu_milli, memory_mib, gpu, model) -> snapshot nodes."""
    nodes = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            count = int(row["gpu"] or 0)
            model = row.get("model") or ""
            # The trace has no GPU memory or NUMA layout: 16 GiB each, half the GPUs per NUMA node.
            gpus = tuple(
                GpuSnapshot(
                    uuid=f"{row['sn']}-gpu{i}",
                    model=model,
                    memory_total_bytes=16 * 1024 * MIB,
                    numa_node=i * 2 // max(count, 1),
                )
                for i in range(count)
            )
            nodes.append(
                NodeSnapshot(
                    id=row["sn"],
                    gpus=gpus,
                    cpu_free_milli=int(row["cpu_milli"]),
                    memory_free_bytes=int(row["memory_mib"]) * MIB,
                )
            )
    return nodes


def load_pods(path) -> list[dict]:
    """Pod list CSV -> dicts with cpu, memory, gpu count, per-GPU milli and accepted models."""
    pods = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            num = int(row["num_gpu"] or 0)
            milli = int(row["gpu_milli"] or 0) if num else 0
            milli = min(milli, 1000)
            spec = tuple(sorted(x for x in (row.get("gpu_spec") or "").split("|") if x))
            pods.append(
                {
                    "cpu": int(row["cpu_milli"]),
                    "memory": int(float(row["memory_mib"] or 0)) * MIB,
                    "num_gpu": num,
                    "milli": milli,
                    "spec": spec,
                    "total_milli": num * milli,
                }
            )
    return pods


def to_request(pod: dict) -> TaskRequest:
    """One trace pod as a single-rank task request."""
    if pod["num_gpu"] == 0 or pod["milli"] == 0:
        gpus = 0
    elif pod["num_gpu"] == 1 and pod["milli"] < 1000:
        gpus = pod["milli"] / 1000
    else:
        gpus = pod["num_gpu"]
    return TaskRequest(
        gpus=gpus,
        cpus=pod["cpu"] / 1000,
        memory_bytes=pod["memory"],
        gpu_types=pod["spec"] if gpus else (),
    )


def workload_profile(pods: list[dict]) -> WorkloadProfile:
    """Every pod shape of the list (CPU-only ones too) with its share of pods."""
    counts: dict[tuple, float] = {}
    for p in pods:
        req = to_request(p)
        key = (
            req.cpu_milli,
            req.gpu_milli if req.gpu_count else 0,
            req.gpu_count,
            tuple(sorted(req.gpu_types)),
        )
        counts[key] = counts.get(key, 0) + 1
    return WorkloadProfile.from_counts(counts)


def workload(pods: list[dict], capacity: int, seed: int) -> tuple[list[dict], random.Random]:
    """The seed's pod sequence: the list shuffled, then sampled pods up to 130% of GPU capacity."""
    rng = random.Random(seed)
    seq = list(pods)
    rng.shuffle(seq)
    total = sum(p["total_milli"] for p in seq)
    target = INFLATION * capacity
    while True:
        p = pods[rng.randrange(len(pods))]
        if total + p["total_milli"] > target:
            break
        seq.append(p)
        total += p["total_milli"]
    return seq, rng


def run_one(nodes_path, pods_path, policy_name, seed, max_pods, coverage) -> dict:
    """One policy, one seed: the metrics of that run."""
    nodes = load_nodes(nodes_path)
    pods = load_pods(pods_path)
    capacity = sum(len(n.gpus) for n in nodes) * 1000
    profile = workload_profile(pods)
    seq, rng = workload(pods, capacity, seed)
    if max_pods:
        seq = seq[:max_pods]
    order = list(range(len(nodes)))
    rng.shuffle(order)
    snapshot = ClusterSnapshot(tuple(nodes[i] for i in order))
    engine = PlacementEngine(snapshot, policy=make_policy(policy_name, profile), seed=seed)
    metric = FragmentationModel(profile.typical(coverage))
    requests = [to_request(p) for p in seq]

    window: dict[int, list[float]] = {80: [], 90: [], 100: []}
    frag90: list[float] = []
    arrived = allocated = 0
    placed = failed = 0
    elapsed = 0.0
    clock = time.perf_counter
    for pod, req in zip(seq, requests):
        arrived += pod["total_milli"]
        t0 = clock()
        result = engine.place(req)
        elapsed += clock() - t0
        if result.schedulable:
            allocated += pod["total_milli"]
            placed += 1
        else:
            failed += 1
        arrive_pct = round(100.0 * arrived / capacity)
        if arrive_pct in window:
            window[arrive_pct].append(100.0 * allocated / capacity)
            if arrive_pct == 90:
                frag90.append(cluster_frag_ratio(engine, metric))
    alloc_final = 100.0 * allocated / capacity
    out = {
        "alloc_final": alloc_final,
        "unallocated_final_pct": 100.0 - alloc_final,
        "frag_ratio_at_90": statistics.fmean(frag90) if frag90 else float("nan"),
        "decisions_per_second": len(seq) / elapsed if elapsed else float("nan"),
        "pods": len(seq),
        "placed": placed,
        "failed": failed,
    }
    for x, values in window.items():
        out[f"alloc_at_{x}"] = statistics.fmean(values) if values else float("nan")
    return out


def mean_or_none(values, digits):
    """Mean of the values that were reached (a short --max-pods run may not reach 80%)."""
    reached = [v for v in values if v == v]
    return round(statistics.fmean(reached), digits) if reached else None


def cluster_frag_ratio(engine: PlacementEngine, metric: FragmentationModel) -> float:
    """Fragmented / idle GPU share over all nodes, in percent."""
    frag = idle = 0.0
    for node in engine.nodes:
        model, cpu_free, gpus = node.key[:3]
        idle += sum(gpus)
        frag += metric.amount(model, cpu_free, gpus)
    return 100.0 * frag / idle if idle else 0.0


def read_published(path: pathlib.Path, trace: str) -> dict[str, dict]:
    """Figures for one trace from PUBLISHED.md: {artifact policy name: {metric: value}}."""
    if not path.is_file():
        return {}
    out = {}
    pat = re.compile(
        r"^(\S+)\s+\d+-(\S+)\s+alloc@80=\s*([\d.]+)\s+alloc@90=\s*([\d.]+)\s+alloc@100=\s*([\d.]+)\s+"
        r"final=\s*([\d.]+)\s+unalloc_final=\s*([\d.]+)%\s+fragRatio@90=\s*([\d.]+)"
    )
    for line in path.read_text().splitlines():
        m = pat.match(line.strip())
        if m and m.group(1) == trace:
            vals = [float(v) for v in m.groups()[2:]]
            out[m.group(2)] = dict(zip(METRICS, vals))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", required=True, help="node list CSV")
    ap.add_argument("--pods", required=True, help="pod list CSV")
    ap.add_argument("--seeds", type=int, default=10, help="number of seeds (42, 43, ...)")
    ap.add_argument("--policy", default="all", help=f"one of {', '.join(POLICIES)}, or all")
    ap.add_argument(
        "--max-pods",
        type=int,
        default=0,
        help="replay only the first N pods of each seed's sequence (0: all)",
    )
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (runs are independent)")
    ap.add_argument(
        "--typical-coverage",
        type=float,
        default=0.95,
        help="share of pods the typical shapes cover",
    )
    ap.add_argument(
        "--published", help="PUBLISHED.md to compare with (default: beside the pod list)"
    )
    args = ap.parse_args(argv)

    if args.policy == "all":
        policies = [p for p in POLICY_ORDER if p in POLICIES]
    elif args.policy in POLICIES:
        policies = [args.policy]
    else:
        ap.error(f"unknown policy {args.policy!r}; known: {', '.join(POLICIES)}, all")
    seeds = [SEED_BASE + i for i in range(args.seeds)]
    jobs = [
        (args.nodes, args.pods, p, s, args.max_pods, args.typical_coverage)
        for p in policies
        for s in seeds
    ]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            runs = list(pool.map(run_one, *zip(*jobs)))
    else:
        runs = [run_one(*j) for j in jobs]

    results = {}
    for p in policies:
        mine = [r for (job, r) in zip(jobs, runs) if job[2] == p]
        agg = {k: mean_or_none([r[k] for r in mine], 2) for k in METRICS}
        agg["decisions_per_second"] = round(
            statistics.fmean(r["decisions_per_second"] for r in mine), 1
        )
        agg["seeds"] = len(mine)
        agg["pods_per_seed"] = round(statistics.fmean(r["pods"] for r in mine), 1)
        results[p] = agg

    trace = pathlib.Path(args.pods).stem
    published_path = (
        pathlib.Path(args.published)
        if args.published
        else pathlib.Path(args.pods).parent / "PUBLISHED.md"
    )
    published = read_published(published_path, trace)
    print(
        f"{trace}: {len(seeds)} seed(s), policies {', '.join(policies)}, default {DEFAULT_POLICY}"
    )
    columns = ("alloc@80", "alloc@90", "alloc@100", "final", "unalloc%", "frag@90")
    header = f"{'policy':<10}" + "".join(f"{k:>23}" for k in columns) + f"{'dec/s':>9}"
    print(header)
    for p in policies:
        ref = published.get(PUBLISHED_NAMES.get(p, "FGD"))
        cells = []
        for k in METRICS:
            v = results[p][k]
            shown = f"{v:7.2f}" if v is not None else f"{'-':>7}"
            cells.append(f"{shown} (pub {ref[k]:6.2f})" if ref else f"{shown}{'':13}")
        print(
            f"{p:<10}"
            + "".join(f"{c:>23}" for c in cells)
            + f"{results[p]['decisions_per_second']:9.0f}"
        )
    if published:
        print(f"(pub: {published_path.name}; {DEFAULT_POLICY} is compared with the published FGD)")

    if args.json:
        doc = {
            "default_policy": DEFAULT_POLICY,
            "trace": trace,
            "seeds": len(seeds),
            "max_pods": args.max_pods or None,
            "typical_coverage": args.typical_coverage,
            "policies": results,
        }
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
