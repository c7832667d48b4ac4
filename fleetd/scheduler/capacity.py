"""Capacity truth: every GPU is used, free or blocked (with a reason code), never two of them.

Used means held by at least one task, whole or in part (fractional use counts as used).
Blocked means idle but not placeable: its node is not taking work (the node's status is the
code: cordoned, draining, drained, lost, ...), the GPU is unhealthy, or its fleet is
outside an availability window. Free is everything else. So total = used + free + blocked
for the cluster and for every GPU series (model), always.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from fleetd.scheduler.model import MILLI, ClusterSnapshot

UNHEALTHY = "unhealthy"
OUTSIDE_WINDOW = "outside_window"


@dataclass
class GpuCounts:
    """GPU counts for the cluster or one series; `blocked_by` maps a reason code to a count."""

    series: str
    total: int = 0
    used: int = 0
    free: int = 0
    blocked: int = 0
    blocked_by: dict[str, int] = field(default_factory=dict)


def gpu_state(node, gpu, closed_fleets: Collection[str] = ()) -> tuple[str, str | None]:
    """("used" | "free" | "blocked", reason code or None) for one GPU of one node."""
    if gpu.exclusive or gpu.compute_free_milli < MILLI or gpu.free_memory < gpu.memory_total_bytes:
        return "used", None
    if not node.schedulable:
        return "blocked", node.status
    if not gpu.healthy:
        return "blocked", UNHEALTHY
    if node.fleet in closed_fleets:
        return "blocked", OUTSIDE_WINDOW
    return "free", None


def gpu_capacity(
    snapshot: ClusterSnapshot, closed_fleets: Collection[str] = ()
) -> tuple[GpuCounts, dict[str, GpuCounts]]:
    """Cluster-wide counts and counts per GPU model; `closed_fleets` are outside their window."""
    cluster = GpuCounts(series="all")
    per_series: dict[str, GpuCounts] = {}
    for node in snapshot.nodes:
        for gpu in node.gpus:
            series = per_series.setdefault(gpu.model, GpuCounts(series=gpu.model))
            state, code = gpu_state(node, gpu, closed_fleets)
            for counts in (cluster, series):
                counts.total += 1
                setattr(counts, state, getattr(counts, state) + 1)
                if code is not None:
                    counts.blocked_by[code] = counts.blocked_by.get(code, 0) + 1
    return cluster, per_series
