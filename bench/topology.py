#!/usr/bin/env python3
"""Aligned GPU sets on the Alibaba GPU traces: today's engine against the one that reads links.

The pod sequence of `bench/placement.py` (FGD's protocol: the list shuffled per seed, then sampled
pods up to 130% of GPU capacity, pods never leave), replayed twice per seed with the default
policy on the same nodes: once with no links (today's engine, NUMA grouping) and once with each
node given the links of one of issue 50's four host shapes by its GPU count: 8 GPUs alternately
an H100 NVSwitch box and an L40S box (two sockets, four PCIe switches of two), 4 GPUs an A100
PCIe box with NVLink pairs 0-1 and 2-3, 2 GPUs a consumer box (all `system`), 1 GPU alone.

Reported per run: the share of multi-GPU tasks placed on an aligned set (its weakest link as good
as its node's best for that many GPUs) when one existed (a node that could take the task had an
aligned set free: the same task asked with `topology: required` was placeable), for the run with
links and, with the same links read afterwards, for today's engine; the GPUs left unallocated at
the end (stranded, % of capacity); and the engine's time per placement decision (the aligned-set
check is outside the timing).

    .venv/bin/python bench/topology.py --nodes $TRACES/openb_node_list_gpu_node.csv \\
        --pods $TRACES/openb_pod_list_multigpu20.csv --seeds 2 --json bench/results/topology.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.placement import (  # noqa: E402
    SEED_BASE,
    load_nodes,
    load_pods,
    to_request,
    workload,
    workload_profile,
)
from fleetd.scheduler import (  # noqa: E402
    DEFAULT_POLICY,
    ClusterSnapshot,
    NodeSnapshot,
    PlacementEngine,
    make_policy,
)
from fleetd.scheduler.topology import Topology  # noqa: E402
from tests.fleetd.scheduler.factories import (  # noqa: E402
    A100_NVLINK_PAIRS_X4,
    CONSUMER_X2,
    H100_NVSWITCH_X8,
    L40S_PCIE_X8,
    link_matrix,
)

SHAPES = {
    "h100_nvswitch_x8": H100_NVSWITCH_X8,
    "l40s_pcie_x8": L40S_PCIE_X8,
    "a100_pcie_nvlink_pairs_x4": A100_NVLINK_PAIRS_X4,
    "consumer_x2": CONSUMER_X2,
}


def with_links(nodes: list[NodeSnapshot]) -> list[NodeSnapshot]:
    """The nodes, each with the links of its shape (by GPU count; 8-GPU nodes alternate)."""
    out, eights = [], 0
    for node in nodes:
        count = len(node.gpus)
        if count == 8:
            name = "h100_nvswitch_x8" if eights % 2 == 0 else "l40s_pcie_x8"
            eights += 1
            links = SHAPES[name]
        elif count == 4:
            links = SHAPES["a100_pcie_nvlink_pairs_x4"]
        elif count == 2:
            links = SHAPES["consumer_x2"]
        else:
            links = link_matrix(count, lambda i, j: "system")
        out.append(dataclasses.replace(node, links=links))
    return out


def aligned(topologies: dict, node_id: str, uuids: list[str], gpu_index: dict) -> bool:
    """True when these GPUs' weakest link is as good as their node's best for that many."""
    topo = topologies[node_id]
    mask = 0
    for uuid in uuids:
        mask |= 1 << gpu_index[uuid]
    return topo.weakest(mask) <= topo.best_full[len(uuids)]


def run_one(nodes_path, pods_path, seed, max_pods, mode: str) -> dict:
    """One seed: "today" (no links), "topology" (links), "check" (links, and before each
    multi-GPU task whether an aligned set existed: that check's simulations would skew the
    timing, so it runs apart from "topology", whose decisions it repeats)."""
    plain = load_nodes(nodes_path)
    linked = with_links(plain)
    pods = load_pods(pods_path)
    capacity = sum(len(n.gpus) for n in plain) * 1000
    profile = workload_profile(pods)
    seq, rng = workload(pods, capacity, seed)
    if max_pods:
        seq = seq[:max_pods]
    order = list(range(len(plain)))
    rng.shuffle(order)
    nodes = plain if mode == "today" else linked
    engine = PlacementEngine(
        ClusterSnapshot(tuple(nodes[i] for i in order)),
        policy=make_policy(DEFAULT_POLICY, profile),
        seed=seed,
    )
    topologies = {n.id: Topology(n.links) for n in linked if n.links}
    gpu_index = {g.uuid: i for n in plain for i, g in enumerate(n.gpus)}
    allocated = multi = could = got = got_when_could = 0
    elapsed = 0.0
    clock = time.perf_counter
    for pod in seq:
        req = to_request(pod)
        k = 0 if req.shared else req.gpu_count
        existed = False
        if mode == "check" and k >= 2:
            check = engine.simulate(dataclasses.replace(req, topology="required"), explain=False)
            existed = check.schedulable
        t0 = clock()
        result = engine.place(req)
        elapsed += clock() - t0
        if not result.schedulable:
            continue
        allocated += pod["total_milli"]
        if k >= 2:
            rank = result.ranks[0]
            ok = aligned(topologies, rank.node_id, [g.uuid for g in rank.gpus], gpu_index)
            multi += 1
            got += ok
            could += existed
            got_when_could += ok and existed
    out = {
        "unallocated_pct": 100.0 - 100.0 * allocated / capacity,
        "us_per_decision": 1e6 * elapsed / len(seq) if seq else float("nan"),
        "multi_gpu_placed": multi,
        "aligned_pct": 100.0 * got / multi if multi else float("nan"),
        "pods": len(seq),
    }
    if mode == "check":
        out["aligned_possible"] = could
        out["aligned_when_possible_pct"] = 100.0 * got_when_could / could if could else float("nan")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", required=True, help="node list CSV")
    ap.add_argument("--pods", required=True, help="pod list CSV")
    ap.add_argument("--seeds", type=int, default=2, help="number of seeds (42, 43, ...)")
    ap.add_argument("--max-pods", type=int, default=0, help="replay only the first N pods (0: all)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    seeds = [SEED_BASE + i for i in range(args.seeds)]
    results = {}
    for label in ("today", "topology", "check"):
        runs = [run_one(args.nodes, args.pods, s, args.max_pods, label) for s in seeds]
        results[label] = {
            k: round(statistics.fmean(r[k] for r in runs), 3)
            for k in runs[0]
            if all(r[k] == r[k] for r in runs)
        }
    trace = pathlib.Path(args.pods).stem
    print(f"{trace}: {len(seeds)} seed(s), policy {DEFAULT_POLICY}")
    check = results.pop("check")
    results["topology"]["aligned_possible"] = check.get("aligned_possible")
    results["topology"]["aligned_when_possible_pct"] = check.get("aligned_when_possible_pct")
    nan = float("nan")
    print(
        f"{'engine':<10}{'aligned%':>10}{'when possible%':>16}{'unalloc%':>10}{'us/decision':>13}"
    )
    for label, r in results.items():
        print(
            f"{label:<10}{r.get('aligned_pct', nan):>10.2f}"
            f"{r.get('aligned_when_possible_pct') or nan:>16.2f}"
            f"{r['unallocated_pct']:>10.2f}{r['us_per_decision']:>13.1f}"
        )
    ratio = results["topology"]["us_per_decision"] / results["today"]["us_per_decision"]
    stranded = results["topology"]["unallocated_pct"] - results["today"]["unallocated_pct"]
    print(f"time per decision x{ratio:.2f}; stranded GPUs {stranded:+.2f} points")
    results["time_ratio"] = round(ratio, 3)  # type: ignore[assignment]
    results["stranded_delta_points"] = round(stranded, 3)  # type: ignore[assignment]
    if args.json:
        doc = {"trace": trace, "seeds": len(seeds), "max_pods": args.max_pods or None}
        doc["results"] = results
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
