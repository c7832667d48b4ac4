"""Pure placement engine: a cluster snapshot in, placements (or reasons) out.

Imports nothing from Flask, Peewee or the rest of fleetd. See `engine.PlacementEngine`
and `engine.schedule` for the entry points, `model` for the data, `policies` for scoring.
"""

from fleetd.scheduler.engine import PlacementEngine, profile_from_requests, schedule, shape_of
from fleetd.scheduler.model import (
    MILLI,
    STAGES,
    ClusterSnapshot,
    FilterDetail,
    GpuAllocation,
    GpuSnapshot,
    NodeSelector,
    NodeSnapshot,
    Placement,
    PlacementResult,
    RankPlacement,
    TaskRequest,
    TaskShape,
    Unschedulable,
    WorkloadProfile,
)
from fleetd.scheduler.policies import DEFAULT_POLICY, POLICIES, FragmentationModel, Policy, Shape, make_policy

__all__ = [
    "DEFAULT_POLICY",
    "MILLI",
    "POLICIES",
    "STAGES",
    "ClusterSnapshot",
    "FilterDetail",
    "FragmentationModel",
    "GpuAllocation",
    "GpuSnapshot",
    "NodeSelector",
    "NodeSnapshot",
    "Placement",
    "PlacementEngine",
    "PlacementResult",
    "Policy",
    "RankPlacement",
    "Shape",
    "TaskRequest",
    "TaskShape",
    "Unschedulable",
    "WorkloadProfile",
    "make_policy",
    "profile_from_requests",
    "schedule",
    "shape_of",
]
