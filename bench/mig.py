#!/usr/bin/env python3
"""Dynamic MIG against a fixed 7 x 1g.10gb layout and against no MIG (issue 50), in process with
fleetd's real placement engine and dynamic MIG planner.

A fleet of A100-SXM4-80GB nodes (8 GPUs each) takes a mixed queue: whole-GPU jobs and jobs that
ask for a MIG slice (1g.10gb, 2g.20gb, 3g.40gb), arriving at random (Poisson, one draw per tick)
with random lengths (exponential), at an offered load given as a share of the fleet's compute
(a slice counts as its compute slices over 7). Three runs on the same arrivals:

- `none`: no GPU in MIG mode; a slice job takes a whole GPU (the only thing it can get).
- `fixed`: `--mig-share` of the GPUs in MIG mode with 7 x 1g.10gb, the rest whole; a 1g.10gb job
  takes a 1g.10gb slice, a 2g/3g job (which no 1g layout serves) a whole GPU.
- `dynamic`: the same GPUs in MIG mode, starting as 7 x 1g.10gb; every slice job asks for its
  profile, and fleetd's planner (fleetd/scheduler/mig.py, as services/placement/mig_plan.py calls
  it) repartitions idle MIG GPUs to what the queue wants: a target is applied one tick later (the
  agent's next heartbeat), the GPU takes no work meanwhile, and a GPU is not changed again within
  `--settle` ticks. MIG mode itself never changes, as in fleetd.

Each tick: tasks that ended free their GPUs; (dynamic) targets are applied and a plan is made;
then a placement engine over the fleet as it is places the queue in order (FIFO with backfill,
the first `--window` jobs). Reported after `--warmup` ticks: mean GPUs in use (any task on it),
mean jobs waiting, mean wait of the jobs that started, jobs finished, and repartitions.

    .venv/bin/python bench/mig.py --gpus 400 --load 0.8 --json bench/results/mig.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import random
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fleetd.scheduler import (  # noqa: E402
    ClusterSnapshot,
    GpuSnapshot,
    MigSlice,
    NodeSnapshot,
    PlacementEngine,
    TaskRequest,
)
from fleetd.scheduler.mig import MigGpu, SliceState, plan_layouts  # noqa: E402
from fleetd.services.placement.mig import slice_profiles  # noqa: E402
from fleetwire.mig import FAMILIES  # noqa: E402

MODEL = "NVIDIA A100-SXM4-80GB"
TABLE = FAMILIES["A100-80GB"]
PROFILES = slice_profiles(MODEL)
GIB = 1024**3
GPUS_PER_NODE = 8
# (kind, share of jobs): "whole" or a profile
MIX = (("whole", 0.40), ("1g.10gb", 0.35), ("2g.20gb", 0.15), ("3g.40gb", 0.10))
SEVEN = tuple(("1g.10gb", slot, 1) for slot in range(7))


def compute_share(kind: str) -> float:
    """The share of a GPU a job of this kind uses (a slice: its compute slices over 7)."""
    return 1.0 if kind == "whole" else TABLE[kind].compute / 7


@dataclasses.dataclass
class Job:
    id: int
    kind: str
    arrive: int
    length: int
    start: int | None = None


def arrivals(gpus: int, load: float, ticks: int, mean_length: float, seed: int) -> list[Job]:
    """The jobs of a run: offered compute = load x gpus (in GPU-equivalents, on average)."""
    rng = random.Random(seed)
    mean_share = sum(compute_share(k) * p for k, p in MIX)
    rate = load * gpus / (mean_length * mean_share)  # jobs per tick
    kinds, weights = zip(*MIX)
    jobs: list[Job] = []
    for tick in range(ticks):
        # Poisson(rate) by summing exponential gaps within the tick
        t = rng.expovariate(rate)
        while t < 1.0:
            kind = rng.choices(kinds, weights)[0]
            length = max(1, round(rng.expovariate(1 / mean_length)))
            jobs.append(Job(len(jobs), kind, tick, length))
            t += rng.expovariate(rate)
    return jobs


@dataclasses.dataclass
class Gpu:
    uuid: str
    node: str
    mig: bool
    # MIG mode: uuid -> (profile, start, size); holders: uuid (whole GPU or MIG device) -> job id
    devices: dict = dataclasses.field(default_factory=dict)
    holders: dict = dataclasses.field(default_factory=dict)
    target: tuple | None = None  # a planned layout, applied at the next tick
    changed_at: int | None = None
    made: int = 0  # MIG devices made on it so far (their uuids)

    def lay_out(self, layout) -> None:
        self.devices = {}
        for profile, start, size in layout:
            self.devices[f"MIG-{self.uuid}-{self.made}"] = (profile, start, size)
            self.made += 1

    def snapshot(self) -> GpuSnapshot:
        if not self.mig:
            busy = self.uuid in self.holders
            return GpuSnapshot(
                uuid=self.uuid,
                model=MODEL,
                memory_total_bytes=80 * GIB,
                memory_free_bytes=0 if busy else None,
                compute_free_milli=0 if busy else 1000,
                exclusive=busy,
            )
        slices = (
            ()
            if self.target is not None  # a target pending: no work until applied
            else tuple(
                MigSlice(uuid, profile, free=uuid not in self.holders)
                for uuid, (profile, _, _) in self.devices.items()
            )
        )
        return GpuSnapshot(
            uuid=self.uuid, model=MODEL, memory_total_bytes=80 * GIB, mig_devices=slices
        )


def request_for(kind: str, config: str, gpu_mig: bool) -> TaskRequest:
    """What a job of this kind asks for under a configuration (see the module's text)."""
    if kind == "whole" or config == "none":
        return TaskRequest(gpus=1)
    if config == "fixed" and kind != "1g.10gb":
        return TaskRequest(gpus=1)
    return TaskRequest(mig=kind)


def run(config: str, jobs: list[Job], args) -> dict:
    """One configuration over these arrivals."""
    nodes = args.gpus // GPUS_PER_NODE
    mig_gpus = 0 if config == "none" else round(args.gpus * args.mig_share)
    gpus: list[Gpu] = []
    for n in range(nodes):
        for i in range(GPUS_PER_NODE):
            g = Gpu(f"GPU-{n}-{i}", f"n{n}", mig=len(gpus) < mig_gpus)
            if g.mig:
                g.lay_out(SEVEN)
            gpus.append(g)
    by_node: dict[str, list[Gpu]] = {}
    for g in gpus:
        by_node.setdefault(g.node, []).append(g)
    by_uuid = {g.uuid: g for g in gpus}
    jobs = [dataclasses.replace(j) for j in jobs]
    pending = list(reversed(jobs))  # arrivals, next last
    queue: list[Job] = []
    running: dict[int, tuple[Job, list[tuple[Gpu, str]]]] = {}
    used_sum = waiting_sum = samples = 0
    waits: list[int] = []
    finished = repartitions = 0
    decide = 0.0
    for tick in range(args.ticks):
        for job_id in [j for j, (job, _) in running.items() if job.start + job.length <= tick]:
            job, held = running.pop(job_id)
            for gpu, key in held:
                gpu.holders.pop(key, None)
            if tick >= args.warmup:
                finished += 1
        while pending and pending[-1].arrive <= tick:
            queue.append(pending.pop())
        if config == "dynamic":
            for g in gpus:
                if g.target is not None:
                    g.lay_out(g.target)
                    g.target = None
            demand: dict[str, int] = {}
            for job in queue:
                if job.kind != "whole":
                    demand[job.kind] = demand.get(job.kind, 0) + 1
            planned = [
                MigGpu(
                    g.uuid,
                    PROFILES,
                    slices=tuple(
                        SliceState(p, s, z, busy=u in g.holders)
                        for u, (p, s, z) in g.devices.items()
                    ),
                    changed_at=g.changed_at,
                )
                for g in gpus
                if g.mig
            ]
            t0 = time.perf_counter()
            targets = plan_layouts(planned, demand, tick, args.settle, args.max_changes)
            decide += time.perf_counter() - t0
            for uuid, layout in targets.items():
                g = by_uuid[uuid]
                g.target = tuple((p.profile, p.start, p.size) for p in layout)
                g.changed_at = tick
                repartitions += 1
        snapshot = ClusterSnapshot(
            tuple(
                NodeSnapshot(
                    id=node,
                    gpus=tuple(g.snapshot() for g in node_gpus),
                    cpu_free_milli=10**9,
                    memory_free_bytes=10**15,
                )
                for node, node_gpus in by_node.items()
            )
        )
        engine = PlacementEngine(snapshot, seed=args.seed)
        still = []
        t0 = time.perf_counter()
        for index, job in enumerate(queue):
            if index >= args.window:
                still.extend(queue[index:])
                break
            result = engine.place(request_for(job.kind, config, True))
            if not result.schedulable:
                still.append(job)
                continue
            held = []
            for alloc in result.ranks[0].gpus:
                gpu = by_uuid[alloc.uuid]
                key = alloc.mig_device or alloc.uuid
                gpu.holders[key] = job.id
                held.append((gpu, key))
            job.start = tick
            running[job.id] = (job, held)
            if tick >= args.warmup:
                waits.append(tick - job.arrive)
        decide += time.perf_counter() - t0
        queue = still
        if tick >= args.warmup:
            used_sum += sum(1 for g in gpus if g.holders)
            waiting_sum += len(queue)
            samples += 1
    return {
        "gpus_used_mean": used_sum / samples,
        "gpus_used_pct": 100.0 * used_sum / samples / len(gpus),
        "jobs_waiting_mean": waiting_sum / samples,
        "jobs_waiting_end": len(queue),
        "wait_ticks_mean": sum(waits) / len(waits) if waits else float("nan"),
        "jobs_started": len(waits),
        "jobs_finished": finished,
        "repartitions": repartitions,
        "mig_gpus": mig_gpus,
        "seconds_deciding": decide,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=400, help="GPUs (8 per node)")
    parser.add_argument("--load", type=float, default=0.8, help="offered compute / capacity")
    parser.add_argument("--mig-share", type=float, default=0.3, help="share of GPUs in MIG mode")
    parser.add_argument("--ticks", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--mean-length", type=float, default=20.0, help="mean job length, ticks")
    parser.add_argument("--settle", type=float, default=10.0, help="ticks between changes of a GPU")
    parser.add_argument("--max-changes", type=int, default=32, help="GPUs changed per plan")
    parser.add_argument("--window", type=int, default=500, help="queued jobs tried per tick")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    jobs = arrivals(args.gpus, args.load, args.ticks, args.mean_length, args.seed)
    results = {config: run(config, jobs, args) for config in ("none", "fixed", "dynamic")}
    print(
        f"{args.gpus} A100-80GB GPUs, load {args.load:.0%}, {len(jobs)} jobs "
        f"({', '.join(f'{k} {p:.0%}' for k, p in MIX)}), {args.ticks} ticks "
        f"(warm-up {args.warmup}), MIG GPUs {args.mig_share:.0%}, seed {args.seed}"
    )
    header = ("config", "GPUs used", "used %", "waiting", "waiting at end", "wait", "finished")
    print("{:<8} {:>10} {:>7} {:>9} {:>15} {:>7} {:>9} {:>13}".format(*header, "repartitions"))
    for config, r in results.items():
        print(
            f"{config:<8} {r['gpus_used_mean']:>10.1f} {r['gpus_used_pct']:>7.1f} "
            f"{r['jobs_waiting_mean']:>9.1f} {r['jobs_waiting_end']:>15d} "
            f"{r['wait_ticks_mean']:>7.1f} {r['jobs_finished']:>9d} {r['repartitions']:>13d}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"args": {k: str(v) for k, v in vars(args).items()}, "jobs": len(jobs)}
        args.json.write_text(json.dumps(dict(doc, results=results), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
