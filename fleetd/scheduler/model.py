"""Plain data the placement engine reads and returns: a cluster snapshot, task requests, results.

Nothing here knows about Flask, Peewee or the rest of fleetd: the jobs service builds a
`ClusterSnapshot` from its tables, asks the engine, and writes the `Placement` back.
Units: CPUs in milli-CPU, memory in bytes, GPU compute share in milli-GPU (1000 = one GPU).
"""

from __future__ import annotations

import fnmatch
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal

MILLI = 1000
MIN_SLICE_MEMORY_BYTES = (
    256 * 1024**2
)  # a GPU whose memory share for a slice would be smaller is no fit
READY = "ready"  # a node's containers when its runtime can run images
# How two GPUs of a node reach each other (their best path), best first; a pair with itself is
# SELF_LINK. An aligned set of GPUs is one whose weakest pair is as good as the node allows.
LINK_CLASSES = ("nvlink", "nvswitch", "pcie_switch", "host_bridge", "numa", "system")
SELF_LINK = "self"
TOPOLOGY_PREFERRED = "preferred"
TOPOLOGY_REQUIRED = "required"
TOPOLOGY_MODES = (TOPOLOGY_PREFERRED, TOPOLOGY_REQUIRED)
# A node's place in the network across nodes, from its labels (or its fleet's topology file)
NETWORK_LABELS = ("topology.fleetd/block", "topology.fleetd/leaf", "topology.fleetd/spine")


@functools.lru_cache(maxsize=4096)
def image_allowed(image: str, patterns: tuple[str, ...]) -> bool:
    """True when the image reference matches one of the glob patterns (fnmatch, case-sensitive)."""
    return any(fnmatch.fnmatchcase(image, pattern) for pattern in patterns)


@dataclass(frozen=True)
class MigSlice:
    """A MIG device of a GPU: its uuid (MIG-...), its profile (fleetwire.mig) and whether a task
    holds it."""

    uuid: str
    profile: str
    free: bool = True


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU as the scheduler accounts for it (reservations, not measured use)."""

    uuid: str
    model: str
    memory_total_bytes: int
    memory_free_bytes: int | None = None  # None: nothing reserved, all of memory_total_bytes
    compute_free_milli: int = MILLI  # share of compute not reserved by tasks, 0..1000
    numa_node: int = 0
    healthy: bool = True
    exclusive: bool = False  # held whole by a task
    mps_owner: str | None = (
        None  # the owner whose MPS slices share it (MPS serves one uid per GPU at a time)
    )
    # In MIG mode: the MIG devices that may take MIG work (none where its fleet's MIG mode is off);
    # such a GPU is never given whole nor as a software slice. None: not in MIG mode.
    mig_devices: tuple[MigSlice, ...] | None = None

    @property
    def free_memory(self) -> int:
        """Reservable memory in bytes."""
        return self.memory_total_bytes if self.memory_free_bytes is None else self.memory_free_bytes

    @property
    def idle(self) -> bool:
        """True when no task holds or shares this GPU, so it can be given away whole."""
        return (
            self.healthy
            and not self.exclusive
            and self.compute_free_milli >= MILLI
            and self.free_memory >= self.memory_total_bytes
        )


@dataclass(frozen=True)
class NetworkPlace:
    """Where a node sits in the network across nodes: its block (nodes that talk fastest to each
    other, as one NVL72 rack or the nodes under one leaf switch's group), its leaf switch and its
    spine; each None when not known. A gang prefers the fewest blocks, then the fewest leaves."""

    block: str | None = None
    leaf: str | None = None
    spine: str | None = None

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> NetworkPlace | None:
        """The place the `topology.fleetd/block|leaf|spine` labels give, or None without any."""
        block, leaf, spine = (labels.get(key) or None for key in NETWORK_LABELS)
        if block is None and leaf is None and spine is None:
            return None
        return cls(block, leaf, spine)

    def to_dict(self) -> dict[str, str]:
        """The node view's `network`: the parts that are known."""
        return {
            k: v
            for k, v in (("block", self.block), ("leaf", self.leaf), ("spine", self.spine))
            if v is not None
        }


@dataclass(frozen=True)
class NodeSnapshot:
    """One host: where it belongs, whether it may take work, and what is still free on it."""

    id: str
    gpus: tuple[GpuSnapshot, ...] = ()
    fleet: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    # False for cordoned, draining, drained, lost, revoked, pending, validating and
    # failed_validation nodes
    schedulable: bool = True
    status: str = "ready"
    cpu_free_milli: int = 0
    memory_free_bytes: int = 0
    tasks: int = 0  # tasks active on it: among equally good nodes, the least busy one wins
    container_runtime: str | None = None  # podman or docker when the host can run images
    # "ready" or "unavailable: <reason>" as its agent reported; None (an older agent): ready when it
    # reported a container runtime
    containers: str | None = None
    allowed_images: tuple[str, ...] = ("*",)  # its fleet's patterns for instance images
    owner_ports: Mapping[str, int] = field(
        default_factory=dict
    )  # owner -> host ports its instances hold here
    block_reason: str = ""  # why it takes no work, when not schedulable (else its status says)
    # Where its fleet runs tasks as their owners' own accounts (task_identity nss): the owners whose
    # account resolves on this node (None: any owner's work may run here).
    accounts: frozenset[str] | None = None
    # Its GPUs' links: links[i][j] is the LINK_CLASSES class of the pair gpus[i], gpus[j] (in the
    # order of `gpus`; SELF_LINK on the diagonal); None when its agent reported none (an older
    # agent), and placement then groups GPUs by numa_node only.
    links: tuple[tuple[str, ...], ...] | None = None
    # Its place in the network (labels, else its fleet's topology file); None when not known: a
    # gang then counts it as a block of its own.
    network: NetworkPlace | None = None

    @property
    def containers_ready(self) -> bool:
        """True when the node can run container images."""
        if self.containers is None:
            return bool(self.container_runtime)
        return self.containers == READY


@dataclass(frozen=True)
class ClusterSnapshot:
    """Every node the scheduler may consider, in a stable order (after the number of active
    tasks, the order breaks score ties)."""

    nodes: tuple[NodeSnapshot, ...]


@dataclass(frozen=True)
class NodeSelector:
    """Restricts a task group to one fleet and/or to nodes carrying all of these labels; an
    instance's run may also be held to one node (where its volume is) and to nodes that can run
    container images."""

    fleet: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    node_id: str | None = None
    container: bool = False
    image: str | None = None  # an instance's image: only nodes whose fleet allows it

    @property
    def restricts(self) -> bool:
        return (
            self.fleet is not None
            or bool(self.labels)
            or self.node_id is not None
            or self.container
            or self.image is not None
        )

    def matches(self, node: NodeSnapshot) -> bool:
        """True when the node is in the fleet (if given), has every label, is the node asked for,
        can run images when that is asked for and its fleet allows the image."""
        if self.fleet is not None and node.fleet != self.fleet:
            return False
        if self.node_id is not None and node.id != self.node_id:
            return False
        if self.container and not node.containers_ready:
            return False
        if self.image is not None and not image_allowed(self.image, tuple(node.allowed_images)):
            return False
        return all(node.labels.get(k) == v for k, v in self.labels.items())


@dataclass(frozen=True)
class TaskRequest:
    """A task group of a job: `num_nodes` identical tasks (ranks), one per distinct node.

    `gpus` is an integer >= 0 (whole GPUs, held exclusively) or a fraction 0 < x < 1 of one
    GPU. A request for one GPU with `gpu_memory_bytes` or `gpu_compute_percent` is also a
    shared slice of one GPU. A slice's compute share is `gpu_compute_percent` if given,
    else the fraction (1 milli-GPU for a memory-only slice); its memory is
    `gpu_memory_bytes` if given, else the same fraction of the chosen GPU's memory.
    """

    gpus: float = 0
    num_nodes: int = 1
    gpu_memory_bytes: int | None = None
    gpu_compute_percent: float | None = None
    gpu_types: tuple[str, ...] = ()
    cpus: float = 0  # CPUs (1.5 = 1500 milli-CPU)
    memory_bytes: int = 0
    node_selector: NodeSelector = field(default_factory=NodeSelector)
    priority_class: str = "on-demand"
    bid: float | None = None
    name: str = ""
    # Set where an answer depends on who asks: the owner (an API token id), the host ports a new
    # instance declares (held on its node for as long as its volume is there) and the most an owner
    # may hold on one node, and whether its slices use MPS (one owner per GPU).
    owner: str = ""
    host_ports: int = 0
    max_owner_ports: int | None = None
    mps: bool = False
    # The login of the owner whose own account must resolve on a node whose `accounts` are known
    # ("": no account to resolve, as a service account's work).
    account: str = ""
    # "preferred": whole GPUs go to an aligned set (scheduler/topology.py) where a fitting node has
    # one free, else to the best set free; "required": only to an aligned set, else the task waits.
    # Either way a node whose links are unknown (links None) is taken as today.
    topology: str = TOPOLOGY_PREFERRED
    # For a gang (num_nodes > 1): "preferred", its ranks go to the fewest network blocks, then the
    # fewest leaves (scheduler/network.py); "required", to one block, else the gang waits.
    same_block: str = TOPOLOGY_PREFERRED
    # A MIG profile (fleetwire.mig, as "1g.10gb"): each rank takes `gpus` MIG devices of it, whole
    # (hardware isolation: no software memory or compute limit), and never a GPU outside MIG mode.
    mig: str | None = None

    def __post_init__(self):
        if self.num_nodes < 1:
            raise ValueError("num_nodes must be at least 1")
        if self.gpus < 0 or (self.gpus >= 1 and self.gpus != int(self.gpus)):
            raise ValueError("gpus must be an integer >= 0 or a fraction 0 < x < 1")
        if self.gpu_compute_percent is not None and not 0 < self.gpu_compute_percent <= 100:
            raise ValueError("gpu_compute_percent must be in (0, 100]")
        if self.gpu_memory_bytes is not None and self.gpu_memory_bytes <= 0:
            raise ValueError("gpu_memory_bytes must be positive")
        if self.cpus < 0 or self.memory_bytes < 0:
            raise ValueError("cpus and memory_bytes must be >= 0")
        if self.shared and self.gpus > 1:
            raise ValueError("gpu_memory_bytes and gpu_compute_percent apply to one shared GPU")
        if self.topology not in TOPOLOGY_MODES:
            raise ValueError(f"topology must be one of {', '.join(TOPOLOGY_MODES)}")
        if self.same_block not in TOPOLOGY_MODES:
            raise ValueError(f"same_block must be one of {', '.join(TOPOLOGY_MODES)}")
        if self.mig is not None and self.gpus == 0:  # one MIG device unless it says how many
            object.__setattr__(self, "gpus", 1)
        if self.mig is not None and (
            self.gpus < 1
            or self.gpus != int(self.gpus)
            or self.gpu_memory_bytes is not None
            or self.gpu_compute_percent is not None
        ):
            raise ValueError(
                "mig takes whole MIG devices: gpus is their number (1 or more), without "
                "gpu_memory_bytes or gpu_compute_percent"
            )

    @property
    def shared(self) -> bool:
        """True when each rank takes a slice of one GPU rather than whole GPUs."""
        if self.mig is not None:
            return False
        if 0 < self.gpus < 1:
            return True
        return self.gpus >= 1 and (
            self.gpu_memory_bytes is not None or self.gpu_compute_percent is not None
        )

    @property
    def gpu_count(self) -> int:
        """GPUs each rank touches: whole GPUs, or 1 for a slice."""
        return 1 if self.shared else int(self.gpus)

    @property
    def gpu_milli(self) -> int:
        """Compute share per GPU in milli-GPU (1000 for whole GPUs)."""
        if not self.shared:
            return MILLI if self.gpus >= 1 else 0
        if self.gpu_compute_percent is not None:
            return max(1, round(self.gpu_compute_percent * 10))
        if 0 < self.gpus < 1:
            return max(1, round(self.gpus * MILLI))
        return 1  # a memory-only slice reserves the smallest share: the GPU is no longer free

    @property
    def cpu_milli(self) -> int:
        """CPU request in milli-CPU."""
        return int(math.ceil(self.cpus * MILLI - 1e-9))

    def gpu_memory_for(self, gpu_memory_total: int) -> int:
        """Memory a slice reserves on a GPU with this much memory (0 for whole GPUs)."""
        if not self.shared:
            return 0
        if self.gpu_memory_bytes is not None:
            return self.gpu_memory_bytes
        fraction = self.gpus if 0 < self.gpus < 1 else self.gpu_milli / MILLI
        return int(gpu_memory_total * fraction)


@dataclass(frozen=True)
class GpuAllocation:
    """A GPU given to one rank, with the limits the agent must enforce on it."""

    uuid: str
    memory_limit_bytes: int
    compute_milli: int
    exclusive: bool
    # The MIG device of GPU `uuid` the rank holds (whole: no software limit applies), else None.
    mig_device: str | None = None


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank runs."""

    rank: int
    node_id: str
    gpus: tuple[GpuAllocation, ...]
    cpu_milli: int
    memory_bytes: int
    owner: str = ""  # as the request's, so that a release gives back what the placement took
    host_ports: int = 0
    mps: bool = False
    # The weakest link among its GPUs (a LINK_CLASSES class; SELF_LINK for one GPU or a slice);
    # None when it has no GPU or its node's links are unknown. `link_note` says why these GPUs.
    link_class: str | None = None
    link_note: str = ""
    # For a gang's rank on a node with a known place: the node's block and leaf, and why the gang
    # went there (scheduler/network.py)
    block: str | None = None
    leaf: str | None = None
    network_note: str = ""


@dataclass(frozen=True)
class Placement:
    """A schedulable answer: one entry per rank, rank 0 first."""

    ranks: tuple[RankPlacement, ...]
    policy: str
    score: float = 0.0

    schedulable: ClassVar[Literal[True]] = True

    @property
    def node_ids(self) -> tuple[str, ...]:
        """Node of every rank, by rank."""
        return tuple(r.node_id for r in self.ranks)


@dataclass(frozen=True)
class FilterDetail:
    """Why one node cannot take a rank: the filter stage that rejected it and a plain reason."""

    node_id: str
    stage: str
    reason: str


# Filter stages, in the order the engine applies them.
STAGE_STATUS = "status"
STAGE_ISOLATION = "isolation"
STAGE_SELECTOR = "selector"
STAGE_IDENTITY = "identity"
STAGE_CONTAINERS = "containers"
STAGE_IMAGE = "image"
STAGE_GPU_TYPE = "gpu_type"
STAGE_GPU_COUNT = "gpu_count"
STAGE_CPU = "cpu"
STAGE_MEMORY = "memory"
STAGE_GPU = "gpu"
STAGE_TOPOLOGY = "topology"
STAGE_GPU_MEMORY = "gpu_memory"
STAGE_PORTS = "ports"
STAGE_MPS = "mps"
STAGE_SLICE_MEMORY = "slice_memory"
STAGE_GANG = "gang"
STAGE_NETWORK = "network"
STAGE_MIG = "mig"
STAGES = (
    STAGE_STATUS,
    STAGE_ISOLATION,
    STAGE_SELECTOR,
    STAGE_IDENTITY,
    STAGE_CONTAINERS,
    STAGE_IMAGE,
    STAGE_GPU_TYPE,
    STAGE_GPU_COUNT,
    STAGE_CPU,
    STAGE_MEMORY,
    STAGE_PORTS,
    STAGE_GPU,
    STAGE_TOPOLOGY,
    STAGE_SLICE_MEMORY,
    STAGE_MPS,
    STAGE_GPU_MEMORY,
    STAGE_MIG,
    STAGE_GANG,
    STAGE_NETWORK,
)
# Stages whose reason a pending job's one-line reason quotes (one node's verdict), not only counts:
# what an owner can act on, or must know to understand the wait.
EXPLAINED_STAGES = frozenset(
    {
        STAGE_ISOLATION,
        STAGE_IDENTITY,
        STAGE_CONTAINERS,
        STAGE_IMAGE,
        STAGE_PORTS,
        STAGE_MPS,
        STAGE_SLICE_MEMORY,
        STAGE_TOPOLOGY,
        STAGE_NETWORK,
        STAGE_MIG,
    }
)


@dataclass(frozen=True)
class Unschedulable:
    """No placement: a one-line reason and, when asked for, the verdict for every node."""

    reason: str
    filter_detail: tuple[FilterDetail, ...] = ()
    placed_ranks: int = 0  # for gangs: ranks that fitted before the group was given up

    schedulable: ClassVar[Literal[False]] = False


PlacementResult = Placement | Unschedulable


@dataclass(frozen=True)
class TaskShape:
    """A typical task shape of the workload, with its share of tasks (FGD's target workload)."""

    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for CPU-only tasks
    gpu_count: int
    gpu_types: tuple[str, ...] = ()
    weight: float = 1.0


@dataclass(frozen=True)
class WorkloadProfile:
    """The task shapes expected to arrive, most popular first, weights summing to 1."""

    shapes: tuple[TaskShape, ...]

    @classmethod
    def from_counts(cls, counts: Mapping[tuple, float], coverage: float = 1.0) -> WorkloadProfile:
        """Shapes from counts, keeping the most popular ones that make up `coverage` of all tasks.

        `counts` maps (cpu_milli, gpu_milli, gpu_count, gpu_types) to how many tasks had it.
        """
        total = float(sum(counts.values()))
        if total <= 0:
            return cls(())
        ordered = sorted(
            counts.items(),
            key=lambda kv: (kv[1], kv[0][0], kv[0][1], kv[0][2], kv[0][3]),
            reverse=True,
        )
        return cls(
            tuple(TaskShape(k[0], k[1], k[2], tuple(k[3]), c / total) for k, c in ordered)
        ).typical(coverage)

    def typical(self, coverage: float) -> WorkloadProfile:
        """The most popular shapes that together make up `coverage` of tasks, weights renormalised.

        The FGD paper measures fragmentation against such "typical" shapes; its artifact
        keeps the shapes covering 95% of tasks.
        """
        chosen, cum = [], 0.0
        for shape in self.shapes:
            if cum >= coverage - 1e-12:
                break
            chosen.append(shape)
            cum += shape.weight
        if not chosen:
            return WorkloadProfile(())
        return WorkloadProfile(tuple(replace(s, weight=s.weight / cum) for s in chosen))


@dataclass(frozen=True)
class RunningTask:
    """A task that holds resources now (its share is already out of the snapshot's free figures)."""

    task_id: str
    job_id: str
    node_id: str
    gpus: tuple[GpuAllocation, ...] = ()
    cpu_milli: int = 0
    memory_bytes: int = 0
    priority_class: str = "on-demand"
    bid: float | None = None


@dataclass(frozen=True)
class PreemptionPlan:
    """Where a request runs once the victim jobs are stopped (no victims: it fits as things are)."""

    placement: Placement
    victim_jobs: tuple[str, ...]
    victim_tasks: tuple[str, ...]

    schedulable: ClassVar[Literal[True]] = True
