"""Pure placement engine: a cluster snapshot in, placements (or reasons) out.

Imports nothing from Flask, Peewee or the rest of fleetd. See `engine.PlacementEngine`
and `engine.schedule` for the entry points, `model` for the data, `policies` for scoring.
"""

from fleetd.scheduler.capacity import GpuCounts, gpu_capacity, gpu_state
from fleetd.scheduler.engine import (
    PLACEMENT_GROUP,
    PlacementEngine,
    profile_from_requests,
    schedule,
    shape_of,
)
from fleetd.scheduler.model import (
    MILLI,
    MIN_SLICE_MEMORY_BYTES,
    READY,
    STAGES,
    ClusterSnapshot,
    FilterDetail,
    GpuAllocation,
    GpuSnapshot,
    NodeSelector,
    NodeSnapshot,
    Placement,
    PlacementResult,
    PreemptionPlan,
    RankPlacement,
    RunningTask,
    TaskRequest,
    TaskShape,
    Unschedulable,
    WorkloadProfile,
    image_allowed,
)
from fleetd.scheduler.policies import (
    DEFAULT_POLICY,
    POLICIES,
    FragmentationModel,
    Policy,
    Shape,
    make_policy,
)
from fleetd.scheduler.preemption import freed, plan_preemption

__all__ = [
    "DEFAULT_POLICY",
    "MILLI",
    "MIN_SLICE_MEMORY_BYTES",
    "READY",
    "PLACEMENT_GROUP",
    "POLICIES",
    "STAGES",
    "ClusterSnapshot",
    "FilterDetail",
    "FragmentationModel",
    "GpuAllocation",
    "GpuCounts",
    "GpuSnapshot",
    "NodeSelector",
    "NodeSnapshot",
    "Placement",
    "PlacementEngine",
    "PlacementResult",
    "Policy",
    "PreemptionPlan",
    "RankPlacement",
    "RunningTask",
    "Shape",
    "TaskRequest",
    "TaskShape",
    "Unschedulable",
    "WorkloadProfile",
    "freed",
    "gpu_capacity",
    "gpu_state",
    "image_allowed",
    "make_policy",
    "plan_preemption",
    "profile_from_requests",
    "schedule",
    "shape_of",
]
