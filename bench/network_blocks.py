#!/usr/bin/env python3
"""Gangs over network blocks: the engine that reads each node's block and leaf against today's.

A fleet of `--nodes` 8-GPU nodes in blocks of `--block-size` (leaves of `--leaf-size`, ten blocks
per spine) with a fixed background load: each block gets a fill drawn from 20-80 %, and each of its
nodes is busy with that chance, holding 1 to 8 of its GPUs. Then `--gangs` gangs of 2 to 32 nodes
(8 whole GPUs a rank, the sizes drawn with weights 30/25/20/15/10 %) arrive one after another;
each runs until the fleet has no room for the next, when the oldest ones end first. The same
sequence is replayed on two engines over the same nodes: one whose snapshot carries each node's
network place (`NodeSnapshot.network`), and one without (today's: gangs go rank by rank).

Reported per engine: the share of gangs placed in one block among those that one block could hold
when they arrived (its free nodes at that moment; the goal is 100 %), the share of all gangs in
one block, the mean number of leaves a one-block gang spans, and the time per gang placement
(`PlacementEngine.place` alone).

    .venv/bin/python bench/network_blocks.py --seeds 2 --json bench/results/network_blocks.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import random
import statistics
import sys
import time
from collections import deque

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fleetd.scheduler import (  # noqa: E402
    ClusterSnapshot,
    GpuSnapshot,
    NetworkPlace,
    NodeSnapshot,
    Placement,
    PlacementEngine,
    TaskRequest,
)

GIB = 1024**3
SIZES = (2, 4, 8, 16, 32)
WEIGHTS = (0.30, 0.25, 0.20, 0.15, 0.10)
BLOCKS_PER_SPINE = 10


def fleet(nodes: int, block_size: int, leaf_size: int, seed: int) -> list[NodeSnapshot]:
    """The nodes with their places and background load (the same for a seed)."""
    rng = random.Random(seed)
    out = []
    fill = 0.0
    for i in range(nodes):
        b, at = divmod(i, block_size)
        if at == 0:
            fill = rng.uniform(0.2, 0.8)
        busy = rng.randint(1, 8) if rng.random() < fill else 0
        gpus = tuple(
            GpuSnapshot(
                uuid=f"GPU-{i}-{g}",
                model="H100",
                memory_total_bytes=80 * GIB,
                exclusive=g < busy,
                compute_free_milli=0 if g < busy else 1000,
                memory_free_bytes=0 if g < busy else None,
            )
            for g in range(8)
        )
        out.append(
            NodeSnapshot(
                id=f"n{i:05d}",
                gpus=gpus,
                cpu_free_milli=128_000,
                memory_free_bytes=1024 * GIB,
                network=NetworkPlace(
                    f"b{b:03d}", f"b{b:03d}-l{at // leaf_size}", f"s{b // BLOCKS_PER_SPINE}"
                ),
            )
        )
    return out


@dataclasses.dataclass
class Tally:
    gangs: int = 0
    placed: int = 0
    holdable: int = 0  # placed gangs one block could have held when they arrived
    one_block_when_holdable: int = 0
    one_block: int = 0
    leaves: list = dataclasses.field(default_factory=list)
    seconds: list = dataclasses.field(default_factory=list)


def replay(nodes, sizes, networked: bool) -> Tally:
    """Place the gangs in order on one engine; the oldest end while the next finds no room."""
    snaps = nodes if networked else [dataclasses.replace(n, network=None) for n in nodes]
    engine = PlacementEngine(ClusterSnapshot(tuple(snaps)))
    block_of = {n.id: n.network.block for n in nodes}
    leaf_of = {n.id: n.network.leaf for n in nodes}
    free: dict[str, set[str]] = {}  # block -> its nodes with all 8 GPUs free
    for n in nodes:
        if all(not g.exclusive for g in n.gpus):
            free.setdefault(block_of[n.id], set()).add(n.id)
    running: deque[Placement] = deque()
    tally = Tally()
    for k in sizes:
        tally.gangs += 1
        request = TaskRequest(gpus=8, num_nodes=k)
        for _ in range(len(sizes) + 1):  # bounded: each miss ends one running gang
            could = max((len(s) for s in free.values()), default=0) >= k
            started = time.perf_counter()
            result = engine.place(request)
            tally.seconds.append(time.perf_counter() - started)
            if isinstance(result, Placement) or not running:
                break
            ended = running.popleft()
            engine.release(ended)
            for node_id in ended.node_ids:
                free.setdefault(block_of[node_id], set()).add(node_id)
        if not isinstance(result, Placement):
            continue
        running.append(result)
        blocks = {block_of[i] for i in result.node_ids}
        for node_id in result.node_ids:
            free[block_of[node_id]].discard(node_id)
        tally.placed += 1
        tally.one_block += len(blocks) == 1
        if could:
            tally.holdable += 1
            tally.one_block_when_holdable += len(blocks) == 1
        if len(blocks) == 1:
            tally.leaves.append(len({leaf_of[i] for i in result.node_ids}))
    return tally


def summary(t: Tally) -> dict:
    return {
        "gangs": t.gangs,
        "placed": t.placed,
        "one_block_when_one_could_hold_it_pct": round(
            100 * t.one_block_when_holdable / max(1, t.holdable), 2
        ),
        "holdable": t.holdable,
        "one_block_pct_of_all": round(100 * t.one_block / max(1, t.placed), 2),
        "leaves_per_one_block_gang": round(statistics.fmean(t.leaves), 2) if t.leaves else None,
        "ms_per_placement_mean": round(1000 * statistics.fmean(t.seconds), 3),
        "ms_per_placement_p99": round(1000 * sorted(t.seconds)[int(0.99 * len(t.seconds))], 3),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--block-size", type=int, default=20)
    parser.add_argument("--leaf-size", type=int, default=5)
    parser.add_argument("--gangs", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    runs = []
    for seed in range(args.seeds):
        nodes = fleet(args.nodes, args.block_size, args.leaf_size, seed)
        rng = random.Random(1000 + seed)
        sizes = rng.choices(SIZES, WEIGHTS, k=args.gangs)
        for networked in (True, False):
            row = {"seed": seed, "engine": "blocks" if networked else "today"}
            row.update(summary(replay(nodes, sizes, networked)))
            runs.append(row)
            print(json.dumps(row))
    out = {
        "nodes": args.nodes,
        "block_size": args.block_size,
        "leaf_size": args.leaf_size,
        "gangs": args.gangs,
        "runs": runs,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
