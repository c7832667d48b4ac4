"""Dynamic MIG planning (issue 50): which idle GPUs in MIG mode to repartition, and to what.

Pure: GPU states and the queue's demand for slices in, target layouts out; no database, no I/O,
no clock (the caller passes `now`), and, like the rest of the scheduler, only the standard library:
each GPU comes with its model's profile table (the caller reads fleetwire.mig's). The service
(fleetd/services/placement/mig_plan.py) feeds it
the GPUs in MIG mode of the nodes of fleets whose `mig.mode` is dynamic, and the agent applies
what it returns (agent/mig.py).

What it guarantees, whatever the input (tests/fleetd/scheduler/test_mig_planner.py checks them
as properties):
- only a GPU whose every slice is idle (no task holds one), that is not blocked (an earlier
  repartition failed there), has no change pending, and was not repartitioned in the last
  `settle_seconds` may get a target; a busy slice is never touched;
- every target is a layout the GPU's profile table allows (each instance at one of its profile's
  starts, no two sharing a memory slot, at most 7 compute slices);
- a GPU is repartitioned only when its new layout serves strictly more of the queued demand that
  the rest of the fleet leaves unmet than its present layout does (hysteresis: with no unmet
  demand nothing changes, and planning again after a plan is applied changes nothing);
- at most `max_changes` GPUs change per plan.

MIG mode itself is never switched: enabling or disabling it takes a GPU reset, which NVIDIA
allows only with no process on the GPU and which some systems turn into a reboot. Whole-GPU
demand is left to GPUs outside MIG mode.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping

COMPUTE_SLICES = 7  # of a whole MIG-capable GPU
MEMORY_SLOTS = 8


@dataclasses.dataclass(frozen=True)
class SliceProfile:
    """One MIG profile of a GPU's table: `compute` slices and `size` memory slots from one of its
    `starts` (NVIDIA's placements; fleetwire.mig.Profile holds the same)."""

    name: str
    compute: int
    size: int
    starts: tuple[int, ...]

    def mask(self, start: int) -> int:
        """The memory slots an instance at `start` takes, as a bit mask."""
        return ((1 << self.size) - 1) << start


@dataclasses.dataclass(frozen=True)
class SliceState:
    """One MIG device of a GPU: its profile (None: one fleetd does not know, a `+me` variant),
    its placement and whether a task holds it."""

    profile: str | None
    start: int | None = None
    size: int | None = None
    busy: bool = False


@dataclasses.dataclass(frozen=True)
class MigGpu:
    """A GPU in MIG mode as the planner sees it."""

    uuid: str
    profiles: tuple[SliceProfile, ...]  # its model's table; (): a model without MIG
    slices: tuple[SliceState, ...] = ()
    blocked: bool = False  # a repartition failed here: the operator clears it first
    pending: bool = False  # a target was given and is not applied yet
    changed_at: float | None = None  # seconds (the caller's clock) of its last planned change
    settle_seconds: float | None = None  # its fleet's settle time (None: the plan's)
    fixed: bool = False  # not ours to change (a fleet with fixed MIG): its free slices count


@dataclasses.dataclass(frozen=True)
class Placed:
    """One GPU instance of a target layout: its profile at memory slots [start, start + size)."""

    profile: str
    start: int
    size: int


def repartitionable(gpu: MigGpu, now: float, settle_seconds: float) -> bool:
    """True when the planner may change this GPU's layout now."""
    settle = settle_seconds if gpu.settle_seconds is None else gpu.settle_seconds
    return (
        not gpu.fixed
        and not gpu.blocked
        and not gpu.pending
        and not any(s.busy or s.profile is None for s in gpu.slices)
        and (gpu.changed_at is None or now - gpu.changed_at >= settle)
        and bool(gpu.profiles)
    )


def table(gpu: MigGpu) -> dict[str, SliceProfile]:
    """A GPU's profiles by name."""
    return {p.name: p for p in gpu.profiles}


def _served(counts: Mapping[str, int], unmet: Mapping[str, int]) -> int:
    """How many of the unmet requests a layout with these profile counts serves."""
    return sum(min(n, unmet.get(p, 0)) for p, n in counts.items())


def pack(profiles: Mapping[str, SliceProfile], unmet: Mapping[str, int]) -> tuple[Placed, ...]:
    """A layout for one GPU that serves as much of `unmet` as fits: the wanted instances largest
    first (as mig-parted orders them), each at its lowest free start; what room is left goes to
    the smallest wanted profile that still fits. () when this GPU's table offers none of them."""
    wanted = sorted(
        (profiles[name] for name, count in unmet.items() if name in profiles for _ in range(count)),
        key=lambda p: (-p.size, -p.compute, p.name),
    )
    used, compute = 0, 0
    out: list[Placed] = []

    def add(profile: SliceProfile) -> bool:
        nonlocal used, compute
        if len(out) >= COMPUTE_SLICES or compute + profile.compute > COMPUTE_SLICES:
            return False
        for start in profile.starts:
            if start + profile.size <= MEMORY_SLOTS and not used & profile.mask(start):
                used |= profile.mask(start)
                compute += profile.compute
                out.append(Placed(profile.name, start, profile.size))
                return True
        return False

    for profile in wanted:
        add(profile)
    if out:
        smallest = sorted({p.name: p for p in wanted}.values(), key=lambda p: (p.size, p.compute))
        for profile in smallest:
            while add(profile):
                pass
    return tuple(sorted(out, key=lambda p: p.start))


def layout_valid(profiles: Mapping[str, SliceProfile], layout: Iterable[Placed]) -> bool:
    """True when every instance is a placement its profile allows in this table, no two share a
    memory slot and their compute slices add up to at most 7."""
    used, compute, count = 0, 0, 0
    for placed in layout:
        profile = profiles.get(placed.profile)
        if profile is None or placed.size != profile.size or placed.start not in profile.starts:
            return False
        if used & profile.mask(placed.start):
            return False
        used |= profile.mask(placed.start)
        compute += profile.compute
        count += 1
    return compute <= COMPUTE_SLICES and count <= COMPUTE_SLICES


def plan_layouts(
    gpus: Iterable[MigGpu],
    demand: Mapping[str, int],
    now: float,
    settle_seconds: float,
    max_changes: int | None = None,
) -> dict[str, tuple[Placed, ...]]:
    """{GPU uuid: its target layout} for the GPUs to repartition now; {} when none should change.

    `demand` is the queued MIG requests per profile name (slices, not jobs). Free slices of GPUs
    that may not change count against the demand first; then each GPU that may change, those
    whose present layout serves the most first (they are kept), is given the layout `pack` makes
    of what is still unmet, when that serves strictly more than its present one.
    """
    gpus = list(gpus)
    unmet = Counter({p: n for p, n in demand.items() if n > 0})
    movable = [g for g in gpus if repartitionable(g, now, settle_seconds)]
    movable_ids = {g.uuid for g in movable}
    for gpu in gpus:
        if gpu.uuid in movable_ids or gpu.blocked:
            continue
        for s in gpu.slices:
            if not s.busy and s.profile is not None and unmet[s.profile] > 0:
                unmet[s.profile] -= 1

    def present(gpu: MigGpu) -> Counter:
        return Counter(s.profile for s in gpu.slices if s.profile is not None)

    targets: dict[str, tuple[Placed, ...]] = {}
    for gpu in sorted(movable, key=lambda g: (-_served(present(g), unmet), g.uuid)):
        if not +unmet:
            break
        kept = present(gpu)
        full = max_changes is not None and len(targets) >= max_changes
        layout = () if full else pack(table(gpu), +unmet)
        new = Counter(p.profile for p in layout)
        if layout and _served(new, unmet) > _served(kept, unmet):
            targets[gpu.uuid] = layout
            kept = new
        for profile, count in kept.items():
            unmet[profile] = max(0, unmet[profile] - count)
    return targets
