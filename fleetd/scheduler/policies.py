"""Scoring policies: given one node's free resources and a task shape, how good is placing it there.

A policy sees a node as (GPU model, free milli-CPU, free compute share of each usable GPU,
sorted high to low) and returns a score (higher is better) and, for a slice of one GPU,
the free share of the GPU it wants to slice. The engine has already checked that the task
fits; ties go to the node that comes first in the snapshot.

The baselines follow the definitions in the FGD paper's simulator (Weng et al., "Beware of
Fragmentation", USENIX ATC '23), including their integer 0-100 scores, so that the
placement benchmark reproduces its published figures. `fgd` is that paper's
fragmentation-gradient policy; `fragbal` (the default) is ours.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fleetd.scheduler.model import MILLI, WorkloadProfile

# Normalisers the paper's baselines use: the largest node in its trace.
MAX_SPEC_CPU = 128000
MAX_SPEC_GPU = 8 * MILLI


@dataclass(frozen=True)
class Shape:
    """What one rank needs, reduced to the numbers scoring cares about."""

    cpu_milli: int
    gpu_milli: int  # per GPU; 1000 for whole GPUs; 0 with gpu_count 0 for CPU-only
    gpu_count: int
    shared: bool
    gpu_types: frozenset = frozenset()
    # An aligned GPU set is required (whole GPUs, two or more; scheduler/topology.py).
    aligned: bool = False
    # MIG devices of a profile, `mig_count` of them: the engine checks them itself; for policies
    # the shape is CPU-only (gpu_count 0), as a MIG device leaves no share of a GPU to score.
    mig: str | None = None
    mig_count: int = 0

    @property
    def total_gpu_milli(self) -> int:
        """Compute share over all the rank's GPUs."""
        return self.gpu_milli * self.gpu_count


def after_placement(
    cpu_free: int, gpus: tuple[int, ...], shape: Shape, slice_of: int | None
) -> tuple[int, tuple[int, ...]]:
    """A node's (free CPU, sorted GPU shares) once `shape` is placed on it."""
    cpu_after = cpu_free - shape.cpu_milli
    if shape.gpu_count == 0:
        return cpu_after, gpus
    if shape.shared:
        assert slice_of is not None  # a shared shape lands on a slice of one GPU
        rest = list(gpus)
        rest.remove(slice_of)
        rest.append(slice_of - shape.gpu_milli)
        return cpu_after, tuple(sorted(rest, reverse=True))
    n = shape.gpu_count  # whole GPUs: idle ones (value 1000) sort first
    return cpu_after, tuple(sorted(gpus[n:] + (0,) * n, reverse=True))


def slice_candidates(gpus: tuple[int, ...], shape: Shape) -> list[int]:
    """Distinct free shares of GPUs a slice fits on, smallest first."""
    return sorted({g for g in gpus if g >= shape.gpu_milli})


def best_fit_slice(gpus: tuple[int, ...], shape: Shape) -> int | None:
    """The GPU with the least free share that still fits the slice."""
    if not shape.shared:
        return None
    return min(g for g in gpus if g >= shape.gpu_milli)


class FragmentationModel:
    """Expected GPU fragmentation of a node against the workload's typical task shapes.

    For each typical shape, the node's idle GPU share that this shape cannot use counts as
    fragmented, weighted by the shape's popularity: all of it when the shape cannot fit the
    node at all (wrong GPU model, too few GPUs with enough share, too little CPU, or a
    CPU-only shape), else the GPUs whose free share is below the shape's per-GPU need.
    """

    def __init__(self, profile: WorkloadProfile | None):
        shapes = profile.shapes if profile is not None else ()
        self.shapes = tuple(
            (s.cpu_milli, s.gpu_milli, s.gpu_count, frozenset(s.gpu_types), s.weight)
            for s in shapes
        )
        self._memo: dict[tuple, float] = {}

    def amount(self, model: str, cpu_free: int, gpus: tuple[int, ...]) -> float:
        """Fragmented GPU share (milli-GPU) of one node state."""
        key = (model, cpu_free, gpus)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        idle = sum(gpus)
        frag = 0.0
        if idle > 0:
            for cpu, milli, count, types, weight in self.shapes:
                if milli == 0 or (types and model not in types) or cpu > cpu_free:
                    frag += weight * idle
                    continue
                fits, below = 0, 0
                for g in gpus:
                    if g >= milli:
                        fits += 1
                    else:
                        below += g
                frag += weight * (below if fits >= count else idle)
        self._memo[key] = frag
        return frag


class Policy:
    """Base: `score(model, cpu_free, gpus, shape)` -> (score, slice_of) for a node the task fits."""

    name = ""
    randomized = False  # the engine picks uniformly among feasible nodes
    uses_profile = False

    def __init__(self, profile: WorkloadProfile | None = None):
        self.profile = profile

    def score(
        self, model: str, cpu_free: int, gpus: tuple[int, ...], shape: Shape
    ) -> tuple[float, int | None]:
        """Higher is better; `slice_of` is the free share of the GPU to slice (None for whole
        GPUs)."""
        raise TypeError(f"{type(self).__name__} does not score nodes")


class RandomPolicy(Policy):
    """Random-fit: any feasible node with equal chance, any fitting GPU."""

    name = "random"
    randomized = True

    def score(self, model, cpu_free, gpus, shape):
        """Every feasible node scores the same; the engine draws one."""
        return 0.0, None


class BestFitPolicy(Policy):
    """Least CPU and GPU left over (each normalised by the largest node), GPU best-fit."""

    name = "bestfit"

    def score(self, model, cpu_free, gpus, shape):
        """The paper's integer best-fit score: 100 x (1 - mean normalised leftover)."""
        left = 0.5 * (cpu_free - shape.cpu_milli) / MAX_SPEC_CPU
        left += 0.5 * (sum(gpus) - shape.total_gpu_milli) / MAX_SPEC_GPU
        return float(int((1.0 - left) * 100)), best_fit_slice(gpus, shape)


class DotProductPolicy(Policy):
    """Tetris-style dot product of free and requested (CPU, GPU) vectors; smaller is better."""

    name = "dotprod"

    def score(self, model, cpu_free, gpus, shape):
        """The paper's integer score 100 x (1 - dot/2) over vectors normalised by the largest
        node."""
        dot = (cpu_free / MAX_SPEC_CPU) * (shape.cpu_milli / MAX_SPEC_CPU)
        dot += (sum(gpus) / MAX_SPEC_GPU) * (shape.total_gpu_milli / MAX_SPEC_GPU)
        return float(int(100 * (1 - dot / 2))), best_fit_slice(gpus, shape)


class PackingPolicy(Policy):
    """GPU packing: shared GPUs first, then idle GPUs on used nodes, then idle nodes."""

    name = "packing"

    def score(self, model, cpu_free, gpus, shape):
        """The paper's three-tier packing score."""
        if shape.gpu_count == 0:
            return 0.0, None
        idle = sum(1 for g in gpus if g >= MILLI)
        if idle == len(gpus):
            return float(max(100 // 3 - idle, idle)), best_fit_slice(gpus, shape)
        used = [g for g in sorted(gpus) if g >= shape.gpu_milli][: shape.gpu_count]
        idle_used = sum(1 for g in used if g >= MILLI)
        if idle_used:
            return float(max(100 // 2 - idle_used, 100 // 3)), best_fit_slice(gpus, shape)
        ratio = sum(g * 100 // MILLI for g in used)
        return float(max(100 - ratio // 10, 100 // 2)), best_fit_slice(gpus, shape)


class FgdPolicy(Policy):
    """Fragmentation gradient descent: the node whose expected fragmentation grows least.

    As in the paper's simulator, the drop in fragmentation (milli-GPU) is squashed by a
    sigmoid into an integer 0-100 score, and a slice goes to the GPU that scores best.
    """

    name = "fgd"
    uses_profile = True
    TYPICAL_COVERAGE = 0.95  # the artifact's run scripts: shapes that make up 95% of tasks

    def __init__(self, profile: WorkloadProfile | None = None):
        super().__init__(profile)
        self.frag = FragmentationModel(
            profile.typical(self.TYPICAL_COVERAGE) if profile is not None else None
        )

    def _quantised(self, drop: float) -> float:
        return float(int(100.0 / (1.0 + math.exp(-drop / 1000.0))))

    def score(self, model, cpu_free, gpus, shape):
        """Integer sigmoid of the fragmentation drop; slices try every fitting GPU."""
        before = self.frag.amount(model, cpu_free, gpus)
        if not shape.shared:
            after = self.frag.amount(model, *after_placement(cpu_free, gpus, shape, None))
            return self._quantised(before - after), None
        best, best_slice = None, None
        for g in slice_candidates(gpus, shape):
            s = self._quantised(
                before - self.frag.amount(model, *after_placement(cpu_free, gpus, shape, g))
            )
            if best is None or s > best:
                best, best_slice = s, g
        return best, best_slice


class FragBalPolicy(Policy):
    """Ours: FGD over fragmented plus CPU-starved GPU share, ties to the tightest fit.

    FGD counts a node's idle GPU share as fragmented only for task shapes that cannot fit
    it right now. On the Alibaba traces much of the GPU share that ends up stranded sits
    on 8-GPU nodes whose CPUs were taken by CPU-hungry tasks while CPU-rich 2-GPU nodes
    kept theirs. So each node state is also charged for the idle GPU share its free CPUs
    cannot feed at the workload's typical GPU-per-CPU ratio (`stranded`); the drop in
    fragmented + stranded share is scored with FGD's bounded integer sigmoid, so that
    near-equal drops tie, and ties go to the node with the least free GPU share left
    (packing, which keeps whole nodes whole for large tasks), then to snapshot order.
    """

    name = "fragbal"
    uses_profile = True
    TYPICAL_COVERAGE = 0.95
    TIE_BREAK = 1e-6  # x free milli-GPU left (at most 8000 per node): always under one score point

    def __init__(self, profile: WorkloadProfile | None = None):
        super().__init__(profile)
        typical = profile.typical(self.TYPICAL_COVERAGE) if profile is not None else None
        self.frag = FragmentationModel(typical)
        gpu = cpu = 0.0
        for s in typical.shapes if typical is not None else ():
            if s.gpu_count:
                gpu += s.weight * s.gpu_milli * s.gpu_count
                cpu += s.weight * s.cpu_milli
        self.gpu_per_cpu = (
            gpu / cpu if cpu else 0.0
        )  # milli-GPU the typical task uses per milli-CPU
        self._memo: dict[tuple, float] = {}

    def unusable(self, model: str, cpu_free: int, gpus: tuple[int, ...]) -> float:
        """Fragmented plus stranded GPU share (milli-GPU) of one node state."""
        key = (model, cpu_free, gpus)
        cached = self._memo.get(key)
        if cached is None:
            stranded = max(0.0, sum(gpus) - cpu_free * self.gpu_per_cpu)
            cached = self._memo[key] = self.frag.amount(model, cpu_free, gpus) + stranded
        return cached

    def _score(self, model, cpu_free, gpus, shape, before, slice_of):
        cpu_after, gpus_after = after_placement(cpu_free, gpus, shape, slice_of)
        drop = before - self.unusable(model, cpu_after, gpus_after)
        return int(100.0 / (1.0 + math.exp(-drop / 1000.0))) - self.TIE_BREAK * sum(gpus_after)

    def score(self, model, cpu_free, gpus, shape):
        """Integer sigmoid of the drop in unusable GPU share; less free share left breaks ties."""
        before = self.unusable(model, cpu_free, gpus)
        if not shape.shared:
            return self._score(model, cpu_free, gpus, shape, before, None), None
        best, best_slice = None, None
        for g in slice_candidates(gpus, shape):
            s = self._score(model, cpu_free, gpus, shape, before, g)
            if best is None or s > best:
                best, best_slice = s, g
        return best, best_slice


POLICIES: dict[str, Callable[[WorkloadProfile | None], Policy]] = {
    RandomPolicy.name: RandomPolicy,
    BestFitPolicy.name: BestFitPolicy,
    PackingPolicy.name: PackingPolicy,
    DotProductPolicy.name: DotProductPolicy,
    FgdPolicy.name: FgdPolicy,
    FragBalPolicy.name: FragBalPolicy,
}
DEFAULT_POLICY = FragBalPolicy.name


def make_policy(name: str | None = None, profile: WorkloadProfile | None = None) -> Policy:
    """A policy by name (the default when None); ValueError names the known ones."""
    name = name or DEFAULT_POLICY
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown placement policy {name!r}; known: {', '.join(POLICIES)}"
        ) from None
    return factory(profile)
