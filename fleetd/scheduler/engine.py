"""The placement engine: a snapshot in, placements out, with no I/O of any kind.

`PlacementEngine` copies a `ClusterSnapshot` into its own mutable accounting, then places
task groups one after another; every placement it returns is reserved in that accounting
so the next one sees it. `schedule()` is the one-shot form the jobs service calls on each
pass; `explain()` says, per node, which filter stage rejects a request and why.

Nodes with identical free resources (same GPU model, free CPU and free GPU shares and, where
their links are known, best free GPU sets that miss aligned by as much for every size: see
`scheduler/topology.py`) form one class; a policy scores a class once per task shape and the
score is remembered, so a decision costs one dictionary look-up per class rather than a policy
call per node. Among equally good nodes the least busy wins, then the one earliest in the
snapshot: a class keeps its members in that order, so the choice is its first member. Busy
counts the tasks a node runs, plus the ones placed on it in this pass in steps of
`PLACEMENT_GROUP`: tasks that take no GPU or CPU leave a node's class unchanged, and without
this they would all land on one host; with it they go round the nodes a few at a time, and a
node's agent gets each few in one acquire rather than one call per task.

Whole GPUs on a node whose links are known go to the set whose weakest link is best and which
leaves the most aligned sets free (`Topology.pick`). A class whose best free set for the task is
worse than the node's aligned class scores `UNALIGNED_PENALTY` less per rank of the gap, more
than any policy's score range: a node with an aligned set free always wins over one without
(the policy then decides among the aligned ones), and a task that requires an aligned set does
not fit such a class at all. A node whose links are unknown is scored and given GPUs as before
(by NUMA node).

A gang (num_nodes > 1) on an engine where some node has a known network place is placed as a
whole: every node that can take a rank is listed best first (the order rank after rank would take
them), and `scheduler/network.py` picks the fewest blocks, then leaves, among them; `same_block`
required makes it wait when no block holds it. Without any known place, gangs go rank by rank.

A GPU in MIG mode (`GpuSnapshot.mig_devices` not None) is never given whole nor as a software
slice: it takes only requests for a MIG profile (`TaskRequest.mig`), each rank `gpus` free MIG
devices of that profile, from the GPUs with the fewest free devices first (so that emptier GPUs
stay whole for later). A node's class also holds its free MIG devices per profile, so nodes with
different slices free are never taken as interchangeable; policies score a MIG request as the
CPU-only task it is to them.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from fleetd.scheduler.model import (
    EXPLAINED_STAGES,
    MILLI,
    MIN_SLICE_MEMORY_BYTES,
    STAGE_CONTAINERS,
    STAGE_CPU,
    STAGE_GANG,
    STAGE_GPU,
    STAGE_GPU_COUNT,
    STAGE_GPU_MEMORY,
    STAGE_GPU_TYPE,
    STAGE_IDENTITY,
    STAGE_IMAGE,
    STAGE_ISOLATION,
    STAGE_MEMORY,
    STAGE_MIG,
    STAGE_MPS,
    STAGE_NETWORK,
    STAGE_PORTS,
    STAGE_SELECTOR,
    STAGE_SLICE_MEMORY,
    STAGE_STATUS,
    STAGE_TOPOLOGY,
    TOPOLOGY_REQUIRED,
    ClusterSnapshot,
    FilterDetail,
    GpuAllocation,
    NodeSnapshot,
    Placement,
    PlacementResult,
    RankPlacement,
    TaskRequest,
    Unschedulable,
    WorkloadProfile,
    image_allowed,
)
from fleetd.scheduler.network import (
    GangPick,
    NetworkMiss,
    choose_nodes,
    miss_reason,
    network_key,
)
from fleetd.scheduler.policies import Policy, Shape, make_policy
from fleetd.scheduler.topology import Topology, describe, valid_links

PLACEMENT_GROUP = (
    4  # tasks one pass places on a node before an equally good, equally busy one gets its turn
)
UNALIGNED_PENALTY = 1000.0  # score per rank a node's best free GPU set is worse than aligned


class _Gpu:
    __slots__ = (
        "uuid",
        "model",
        "memory_total",
        "memory_free",
        "milli_free",
        "numa",
        "usable",
        "holders",
        "mps_owner",
        "mps_holders",
        "mig_free",
        "mig_profile",
    )

    def __init__(self, snap):
        self.uuid = snap.uuid
        self.model = snap.model
        self.memory_total = snap.memory_total_bytes
        self.memory_free = snap.free_memory
        self.numa = snap.numa_node
        # An unhealthy GPU, or one a task holds whole, takes no work at all.
        self.usable = snap.healthy and not snap.exclusive
        # Shares already reserved by tasks outside this engine count as one holder; a GPU
        # that anyone shares has less than a whole GPU of compute share to give.
        self.holders = 0 if snap.idle else 1
        self.milli_free = max(0, min(MILLI if snap.idle else MILLI - 1, snap.compute_free_milli))
        # MPS serves one uid per GPU at a time: slices of other owners' MPS work do not share it.
        self.mps_owner = snap.mps_owner
        self.mps_holders = 1 if snap.mps_owner is not None else 0  # outside holders count as one
        # In MIG mode: profile -> its free MIG devices' uuids, and uuid -> profile of all of them;
        # the GPU itself then takes no other work.
        self.mig_free: dict[str, list[str]] | None = None
        self.mig_profile: dict[str, str] = {}
        if snap.mig_devices is not None:
            self.usable = False
            self.mig_free = {}
            for device in snap.mig_devices:
                self.mig_profile[device.uuid] = device.profile
                if device.free and snap.healthy:
                    self.mig_free.setdefault(device.profile, []).append(device.uuid)

    def takes_mps_of(self, owner: str) -> bool:
        return self.mps_owner is None or self.mps_owner == owner

    @property
    def idle(self) -> bool:
        return self.usable and self.holders == 0

    @property
    def key(self) -> int:
        return self.milli_free


class _Node:
    __slots__ = (
        "index",
        "snap",
        "cpu_free",
        "memory_free",
        "model",
        "gpus",
        "key",
        "cid",
        "placed",
        "owner_ports",
        "topo",
    )

    def __init__(self, index: int, snap: NodeSnapshot, topo: Topology | None = None):
        self.index = index
        self.snap = snap
        self.placed = 0  # tasks this engine reserved here (net of releases)
        self.cpu_free = snap.cpu_free_milli
        self.memory_free = snap.memory_free_bytes
        models = sorted({g.model for g in snap.gpus})
        self.model = "|".join(models)
        self.gpus = [_Gpu(g) for g in snap.gpus]
        self.owner_ports = dict(snap.owner_ports) if snap.owner_ports else {}
        self.key: tuple | None = None  # make_key's, once made
        self.cid = -1
        self.topo = topo  # its links, None when unknown

    def free_mask(self) -> int:
        """Its idle GPUs as a bit mask over the order of its links."""
        mask = 0
        for i, g in enumerate(self.gpus):
            if g.idle:
                mask |= 1 << i
        return mask

    def usable_gpus(self):
        return [g for g in self.gpus if g.usable]

    def mig_counts(self) -> tuple[tuple[str, int], ...]:
        """Its free MIG devices per profile, by profile name."""
        counts: dict[str, int] = {}
        for g in self.gpus:
            for profile, free in (g.mig_free or {}).items():
                if free:
                    counts[profile] = counts.get(profile, 0) + len(free)
        return tuple(sorted(counts.items()))

    def make_key(self):
        self.key = (
            self.model,
            self.cpu_free,
            tuple(sorted((g.key for g in self.gpus if g.usable), reverse=True)),
            None if self.topo is None else self.topo.gaps(self.free_mask()),
            self.mig_counts(),
        )
        return self.key

    @property
    def tasks(self) -> int:
        return self.snap.tasks + self.placed

    @property
    def rank(self) -> tuple[int, int]:
        """Order among equally good nodes: least busy first, then snapshot order."""
        return (self.snap.tasks + self.placed // PLACEMENT_GROUP, self.index)


@dataclass
class _Reservation:
    node: _Node
    cpu: int
    memory: int
    gpus: list  # (gpu, milli, memory)
    owner: str = ""
    host_ports: int = 0
    mps: bool = False
    mig: bool = False  # gpus are (gpu, MIG device uuid) instead


def _mig_free(gpu, uuid: str, sign: int) -> None:
    """Take (sign 1) or give back (-1) one MIG device of a GPU."""
    free = gpu.mig_free.setdefault(gpu.mig_profile[uuid], [])
    if sign > 0:
        free.remove(uuid)
    else:
        free.append(uuid)


def shape_of(request: TaskRequest) -> Shape:
    """The scoring view of one rank of a request."""
    if request.mig is not None:
        return Shape(
            cpu_milli=request.cpu_milli,
            gpu_milli=0,
            gpu_count=0,
            shared=False,
            gpu_types=frozenset(request.gpu_types),
            mig=request.mig,
            mig_count=int(request.gpus),
        )
    return Shape(
        cpu_milli=request.cpu_milli,
        gpu_milli=request.gpu_milli if request.gpu_count else 0,
        gpu_count=request.gpu_count,
        shared=request.shared,
        gpu_types=frozenset(request.gpu_types),
        aligned=request.topology == TOPOLOGY_REQUIRED
        and not request.shared
        and request.gpu_count >= 2,
    )


class PlacementEngine:
    """Mutable accounting over a snapshot plus a policy; places and reserves task groups."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        policy: str | Policy | None = None,
        profile: WorkloadProfile | None = None,
        seed: int | None = 0,
    ):
        self.policy = policy if isinstance(policy, Policy) else make_policy(policy, profile)
        self.rng = random.Random(seed)
        self._topologies: dict[tuple, int] = {}  # links matrix -> topology id
        self._topology_list: list[Topology] = []  # topology id -> its aligned sets, memoised
        self.nodes = [self._node(i, n) for i, n in enumerate(snapshot.nodes)]
        # nodes whose network place is known: gangs go through scheduler/network.py while any is
        self._placed_nodes = sum(1 for n in snapshot.nodes if n.network is not None)
        self._nets: dict[int, tuple] = {}  # node index -> its network_key, made when first asked
        self.by_id = {n.snap.id: n for n in self.nodes}
        if len(self.by_id) != len(self.nodes):
            raise ValueError("node ids in a snapshot must be unique")
        self._class_ids: dict[tuple, int] = {}  # node state -> class id
        self._class_keys: list[tuple] = []  # class id -> node state
        self._members: dict[int, list[_Node]] = {}  # class id -> its nodes, snapshot order
        self._memo: dict[Shape, dict[int, tuple | None]] = {}  # shape -> class id -> (score, slice)
        self._touched: set[str] = set()  # ids of the nodes reserved on since take_touched()
        for node in self.nodes:
            if node.snap.schedulable:
                self._enter(node)

    # ---- kept between passes -------------------------------------------------------------

    def refresh(self, nodes: Iterable[NodeSnapshot]) -> None:
        """Take these snapshots in place of what the engine has of the same nodes (by id; each
        keeps its place in the order). What was reserved on them is forgotten: the snapshot says
        what they hold now. An engine kept between passes is so brought up to date node by node,
        and then decides as one built afresh from the whole snapshot would."""
        for snap in nodes:
            old = self.by_id[snap.id]
            if old.snap.schedulable:
                self._leave(old)
            self._placed_nodes += (snap.network is not None) - (old.snap.network is not None)
            self._nets.pop(old.index, None)
            node = self.nodes[old.index] = self.by_id[snap.id] = self._node(old.index, snap)
            if snap.schedulable:
                self._enter(node)
        if len(self._class_keys) > 4 * len(self._members) + 1024:
            self._renumber_classes()  # states no node is in any more are forgotten

    def extend(self, nodes: Iterable[NodeSnapshot]) -> None:
        """Take these snapshots as nodes after the last, in this order: an engine kept between
        passes takes nodes that joined (their ids sort after every node it has) and then decides
        as one built afresh from the whole snapshot would."""
        for snap in nodes:
            if snap.id in self.by_id:
                raise ValueError(f"node {snap.id} is in the engine already")
            node = self._node(len(self.nodes), snap)
            self.nodes.append(node)
            self.by_id[snap.id] = node
            self._placed_nodes += snap.network is not None
            if snap.schedulable:
                self._enter(node)

    def _node(self, index: int, snap: NodeSnapshot) -> _Node:
        """Its accounting, with the topology of its links (one per distinct matrix, kept)."""
        if not valid_links(snap.links, len(snap.gpus)):
            return _Node(index, snap)
        links = snap.links
        assert links is not None
        tid = self._topologies.get(links)
        if tid is None:
            tid = self._topologies[links] = len(self._topology_list)
            self._topology_list.append(Topology(links))
        return _Node(index, snap, self._topology_list[tid])

    def _renumber_classes(self):
        self._class_ids, self._class_keys, self._members, self._memo = {}, [], {}, {}
        for node in self.nodes:
            if node.snap.schedulable:
                self._enter(node)

    def rescore(self, policy: str | Policy | None, profile: WorkloadProfile | None = None) -> None:
        """Score from now on with this policy and workload profile (a new pass's); reservations
        stay."""
        self.policy = policy if isinstance(policy, Policy) else make_policy(policy, profile)
        self._memo.clear()

    def take_touched(self) -> set[str]:
        """Ids of the nodes something was reserved on (and maybe released) since the last call."""
        touched, self._touched = self._touched, set()
        return touched

    # ---- class bookkeeping -------------------------------------------------------------

    def _enter(self, node: _Node):
        key = node.make_key()
        cid = self._class_ids.get(key)
        if cid is None:
            cid = self._class_ids[key] = len(self._class_keys)
            self._class_keys.append(key)
        node.cid = cid
        members = self._members.setdefault(cid, [])
        rank = node.rank
        if not members or members[-1].rank < rank:
            members.append(node)
        else:
            members.insert(bisect.bisect_left(members, rank, key=lambda member: member.rank), node)

    def _leave(self, node: _Node):
        members = self._members[node.cid]
        members.remove(node)
        if not members:
            del self._members[node.cid]

    # ---- scoring -----------------------------------------------------------------------

    @classmethod
    def _class_fits(cls, key: tuple, shape: Shape) -> bool:
        model, cpu_free, gpus, gaps, mig = key
        if cpu_free < shape.cpu_milli:
            return False
        if shape.mig is not None:
            if shape.gpu_types and not set(model.split("|")) <= shape.gpu_types:
                return False
            return dict(mig).get(shape.mig, 0) >= shape.mig_count
        if shape.gpu_count == 0:
            return True
        if shape.gpu_types and not set(model.split("|")) <= shape.gpu_types:
            return False
        if shape.shared:
            return any(g >= shape.gpu_milli for g in gpus)
        if sum(1 for g in gpus if g >= MILLI) < shape.gpu_count:
            return False
        return not shape.aligned or cls._gap(gaps, shape.gpu_count) == 0

    @staticmethod
    def _gap(gaps: tuple | None, count: int) -> int:
        """Ranks by which a class's best free set of `count` GPUs misses aligned (0 if unknown)."""
        if gaps is None or count < 2 or count - 2 >= len(gaps):
            return 0
        return gaps[count - 2]

    def _scores(self, shape: Shape) -> list[tuple]:
        """(score, -(first node's rank), class id, slice) for every class the shape fits."""
        memo = self._memo.get(shape)
        if memo is None:
            memo = self._memo[shape] = {}
        out = []
        for cid, members in self._members.items():
            if cid in memo:
                res = memo[cid]
            else:
                key = self._class_keys[cid]
                res = (
                    self.policy.score(key[0], key[1], key[2], shape)
                    if self._class_fits(key, shape)
                    else None
                )
                if res is not None and not shape.shared and key[3] is not None:
                    gap = self._gap(key[3], shape.gpu_count)
                    if gap:
                        res = (res[0] - UNALIGNED_PENALTY * gap, res[1])
                memo[cid] = res
            if res is not None:
                busy, index = members[0].rank
                out.append((res[0], (-busy, -index), cid, res[1]))
        return out

    # ---- per-node checks and device choice -----------------------------------------------

    @staticmethod
    def _identity_ok(node: _Node, request: TaskRequest) -> bool:
        accounts = node.snap.accounts
        return accounts is None or not request.account or request.account in accounts

    @staticmethod
    def _selector_ok(node: _Node, request: TaskRequest) -> bool:
        sel = request.node_selector
        return not sel.restricts or sel.matches(node.snap)

    def _devices(self, node: _Node, request: TaskRequest, shape: Shape, slice_of: int | None):
        """GPUs for one rank on this node as [(gpu, milli, memory)] (for a MIG profile [(gpu, MIG
        device uuid)]), or None if none fit."""
        if shape.mig is not None:
            return self._mig_pick(node, shape.mig, shape.mig_count)
        if shape.gpu_count == 0:
            return []
        if shape.shared:
            fitting = [
                g
                for g in node.gpus
                if g.usable
                and g.milli_free >= shape.gpu_milli
                and g.memory_free >= request.gpu_memory_for(g.memory_total)
                and request.gpu_memory_for(g.memory_total) >= MIN_SLICE_MEMORY_BYTES
                and (not request.mps or g.takes_mps_of(request.owner))
            ]
            if not fitting:
                return None
            if self.policy.randomized:
                gpu = self.rng.choice(fitting)
            else:
                preferred = [g for g in fitting if g.key == slice_of]
                gpu = (
                    preferred[0]
                    if preferred
                    else min(fitting, key=lambda g: (g.milli_free, g.memory_free))
                )
            return [(gpu, shape.gpu_milli, request.gpu_memory_for(gpu.memory_total))]
        idle = [g for g in node.gpus if g.idle]
        if len(idle) < shape.gpu_count:
            return None
        if node.topo is not None:
            free = node.free_mask()
            if shape.aligned and node.topo.gap(free, shape.gpu_count):
                return None
            chosen = node.topo.pick(free, shape.gpu_count)
            return [(g, MILLI, g.memory_total) for i, g in enumerate(node.gpus) if chosen >> i & 1]
        return [(g, MILLI, g.memory_total) for g in self._numa_pick(idle, shape.gpu_count)]

    @staticmethod
    def _mig_pick(node: _Node, profile: str, count: int) -> list | None:
        """`count` free MIG devices of the profile, from the GPUs with the fewest free MIG devices
        (of any profile) first, then in GPU order."""
        gpus = [(g, g.mig_free) for g in node.gpus if g.mig_free and g.mig_free.get(profile)]
        gpus.sort(key=lambda pair: sum(len(free) for free in pair[1].values()))
        chosen: list = []
        for g, free in gpus:
            for uuid in free[profile][: count - len(chosen)]:
                chosen.append((g, uuid))
            if len(chosen) == count:
                return chosen
        return None

    @staticmethod
    def _numa_pick(idle: list, count: int) -> list:
        """`count` idle GPUs spanning as few NUMA nodes as possible, tightest group first."""
        groups: dict[int, list] = {}
        for g in idle:
            groups.setdefault(g.numa, []).append(g)
        fitting = [gs for gs in groups.values() if len(gs) >= count]
        if fitting:
            return min(fitting, key=len)[:count]
        chosen: list = []
        for gs in sorted(groups.values(), key=len, reverse=True):
            chosen.extend(gs[: count - len(chosen)])
            if len(chosen) == count:
                break
        return chosen

    @staticmethod
    def _ports_ok(node: _Node, request: TaskRequest) -> bool:
        """False when the request's host ports would take its owner over the per-node cap."""
        if not request.host_ports or request.max_owner_ports is None:
            return True
        return (
            node.owner_ports.get(request.owner, 0) + request.host_ports <= request.max_owner_ports
        )

    def _node_ok(
        self, node: _Node, request: TaskRequest, shape: Shape, slice_of, exclude
    ) -> list | None:
        if (
            node.index in exclude
            or node.memory_free < request.memory_bytes
            or not self._selector_ok(node, request)
            or not self._identity_ok(node, request)
        ):
            return None
        if not self._ports_ok(node, request):
            return None
        return self._devices(node, request, shape, slice_of)

    # ---- choosing a node -----------------------------------------------------------------

    def _choose(self, request: TaskRequest, shape: Shape, exclude: set):
        """Best (node, devices, score) for one rank, or None."""
        cands = self._scores(shape)
        if not cands:
            return None
        if self.policy.randomized:
            return self._choose_random(request, shape, exclude, cands)
        # Fast path: the first node of the best class usually passes the per-node checks.
        score, _, cid, slice_of = max(cands)
        node = self._members[cid][0]
        devices = self._node_ok(node, request, shape, slice_of, exclude)
        if devices is not None:
            return node, devices, score
        # Highest score first; within a score, the least busy node, then the earliest, wins.
        cands.sort(reverse=True)
        best = None  # (score, rank, node, devices)
        for score, neg_rank, cid, slice_of in cands:
            if best is not None and (score < best[0] or (-neg_rank[0], -neg_rank[1]) > best[1]):
                if score < best[0]:
                    break
                continue
            for node in self._members[cid]:
                if best is not None and node.rank > best[1]:
                    break
                devices = self._node_ok(node, request, shape, slice_of, exclude)
                if devices is not None:
                    best = (score, node.rank, node, devices)
                    break
        if best is None:
            return None
        return best[2], best[3], best[0]

    def _choose_random(self, request, shape, exclude, cands):
        """A uniformly random feasible node (rejection sampling over the fitting classes)."""
        pools = [list(self._members[cid]) for _, _, cid, _ in cands]
        sizes = [len(p) for p in pools]
        total = sum(sizes)
        while total:
            r = self.rng.randrange(total)
            for i, size in enumerate(sizes):
                if r < size:
                    break
                r -= size
            node = pools[i][r]
            devices = self._node_ok(node, request, shape, None, exclude)
            if devices is not None:
                return node, devices, 0.0
            pools[i].pop(r)
            sizes[i] -= 1
            total -= 1
        return None

    # ---- reserving -----------------------------------------------------------------------

    def _reserve(self, node: _Node, request: TaskRequest, devices: list) -> _Reservation:
        self._touched.add(node.snap.id)
        if node.snap.schedulable:
            self._leave(node)
        node.cpu_free -= request.cpu_milli
        node.memory_free -= request.memory_bytes
        node.placed += 1
        mig = request.mig is not None
        if mig:
            for gpu, uuid in devices:
                _mig_free(gpu, uuid, 1)
        else:
            for gpu, milli, memory in devices:
                gpu.milli_free -= milli
                gpu.memory_free -= memory
                gpu.holders += 1
        r = _Reservation(
            node,
            request.cpu_milli,
            request.memory_bytes,
            devices,
            request.owner,
            request.host_ports,
            request.mps and request.shared,
            mig,
        )
        self._hold(r, 1)
        if node.snap.schedulable:
            self._enter(node)
        return r

    @staticmethod
    def _hold(r: _Reservation, sign: int):
        """Charge (sign 1) or give back (-1) what a reservation holds for its owner."""
        if r.host_ports:
            left = r.node.owner_ports.get(r.owner, 0) + sign * r.host_ports
            if left > 0:
                r.node.owner_ports[r.owner] = left
            else:
                r.node.owner_ports.pop(r.owner, None)
        if r.mps:
            for gpu, _, _ in r.gpus:
                gpu.mps_holders += sign
                gpu.mps_owner = r.owner if gpu.mps_holders > 0 else None

    def _unreserve(self, r: _Reservation):
        node = r.node
        if node.snap.schedulable:
            self._leave(node)
        node.cpu_free += r.cpu
        node.memory_free += r.memory
        node.placed -= 1
        if r.mig:
            for gpu, uuid in r.gpus:
                _mig_free(gpu, uuid, -1)
        else:
            for gpu, milli, memory in r.gpus:
                gpu.milli_free += milli
                gpu.memory_free += memory
                gpu.holders -= 1
        self._hold(r, -1)
        if node.snap.schedulable:
            self._enter(node)

    # ---- public API ----------------------------------------------------------------------

    def use_policy(
        self, policy: str | Policy | None, profile: WorkloadProfile | None = None
    ) -> None:
        """Score later placements with another policy; what is reserved so far stays reserved."""
        chosen = policy if isinstance(policy, Policy) else make_policy(policy, profile)
        if chosen.name != self.policy.name:
            self.policy = chosen
            self._memo.clear()  # cached scores belong to the previous policy

    def place(self, request: TaskRequest, explain: bool = False) -> PlacementResult:
        """Place every rank of `request` (all or none) and reserve what it takes."""
        shape = shape_of(request)
        if request.num_nodes > 1 and self._placed_nodes and not self.policy.randomized:
            return self._place_gang(request, shape, explain)
        reservations: list[_Reservation] = []
        ranks: list[RankPlacement] = []
        used: set[int] = set()
        total = 0.0
        for rank in range(request.num_nodes):
            choice = self._choose(request, shape, used)
            if choice is None:
                for r in reversed(reservations):
                    self._unreserve(r)
                return self._unschedulable(request, rank, explain)
            node, devices, score = choice
            link_class, link_note = self._link_of(node, devices, shape)
            reservations.append(self._reserve(node, request, devices))
            used.add(node.index)
            total += score
            ranks.append(self._rank(rank, node, devices, request, shape, link_class, link_note))
        return Placement(ranks=tuple(ranks), policy=self.policy.name, score=total)

    def _rank(self, rank, node, devices, request, shape, link_class, link_note, note=""):
        place = node.snap.network
        return RankPlacement(
            rank=rank,
            node_id=node.snap.id,
            gpus=self._allocations(devices, shape),
            cpu_milli=request.cpu_milli,
            memory_bytes=request.memory_bytes,
            owner=request.owner,
            host_ports=request.host_ports,
            mps=request.mps and request.shared,
            link_class=link_class,
            link_note=link_note,
            block=place.block if place is not None else None,
            leaf=place.leaf if place is not None else None,
            network_note=note,
        )

    # ---- gangs across the network --------------------------------------------------------

    def _candidates(self, request: TaskRequest, shape: Shape) -> list[tuple]:
        """(score, slice, node) of every node that can take one rank, best first (score, then the
        least busy, then snapshot order). A class that fits gives whole GPUs to each of its nodes,
        so their devices are chosen only for the nodes a gang takes; a slice's are checked here."""
        by_score: dict[float, list[tuple]] = {}
        for score, _, cid, slice_of in self._scores(shape):
            by_score.setdefault(score, []).append((cid, slice_of))
        # Nothing to check per node when the request asks for no host memory, selector, account or
        # ports (whole GPUs: its class fitting is enough)
        every = not (
            shape.shared
            or request.memory_bytes
            or request.node_selector.restricts
            or request.account
            or request.host_ports
        )
        out: list[tuple] = []
        for score in sorted(by_score, reverse=True):
            group = [
                (score, slice_of, node)
                for cid, slice_of in by_score[score]
                for node in self._members[cid]
                if every
                or (
                    self._rank_ok(node, request)
                    and (
                        not shape.shared
                        or self._devices(node, request, shape, slice_of) is not None
                    )
                )
            ]
            if len(by_score[score]) > 1:  # equal scores: the least busy, then the earliest first
                group.sort(key=lambda c: c[2].rank)
            out += group
        return out

    def _net(self, node: _Node) -> tuple:
        net = self._nets.get(node.index)
        if net is None:
            net = self._nets[node.index] = network_key(node.snap.network, node.snap.id)
        return net

    def _rank_ok(self, node: _Node, request: TaskRequest) -> bool:
        """The per-node checks of `_node_ok` short of choosing devices."""
        return (
            node.memory_free >= request.memory_bytes
            and self._selector_ok(node, request)
            and self._identity_ok(node, request)
            and self._ports_ok(node, request)
        )

    def _place_gang(self, request: TaskRequest, shape: Shape, explain: bool) -> PlacementResult:
        """Every rank of a gang at once, on the fewest network blocks and leaves that hold it."""
        cands = self._candidates(request, shape)
        k = request.num_nodes
        pick = choose_nodes(
            [self._net(node) for _, _, node in cands], k, request.same_block == TOPOLOGY_REQUIRED
        )
        if pick is None:
            return self._unschedulable(request, len(cands), explain)
        if isinstance(pick, NetworkMiss):
            return self._network_miss(request, cands, pick, explain)
        assert isinstance(pick, GangPick)
        ranks: list[RankPlacement] = []
        total = 0.0
        for rank, at in enumerate(pick.picks):
            score, slice_of, node = cands[at]
            devices = self._devices(node, request, shape, slice_of)
            assert devices is not None  # its class fits, and no rank was placed on it yet
            link_class, link_note = self._link_of(node, devices, shape)
            self._reserve(node, request, devices)
            total += score
            ranks.append(
                self._rank(rank, node, devices, request, shape, link_class, link_note, pick.note)
            )
        return Placement(ranks=tuple(ranks), policy=self.policy.name, score=total)

    def _network_miss(self, request, cands, miss: NetworkMiss, explain: bool) -> Unschedulable:
        """A gang that requires one block none holds: why, and the verdict for every node."""
        k = request.num_nodes
        reason = miss_reason(miss, k)
        detail: list[FilterDetail] = []
        if explain:
            fits = {node.snap.id: node.snap.network for _, _, node in cands}
            detail = [d for d in self.explain(request) if d.node_id not in fits]
            for node_id, place in fits.items():
                block = network_key(place, node_id)[0]
                if place is None or not (place.block or place.leaf):
                    why = "node fits one rank, but has no known network place (a block of its own)"
                else:
                    why = (
                        f"node fits one rank, but its block {block} has {miss.counts.get(block, 0)}"
                        f" such node(s); the gang requires one block of {k}"
                    )
                detail.append(FilterDetail(node_id, STAGE_NETWORK, why))
        return Unschedulable(reason=reason, filter_detail=tuple(detail), placed_ranks=0)

    @staticmethod
    def _allocations(devices: list, shape: Shape) -> tuple[GpuAllocation, ...]:
        """One rank's devices as the placement gives them (a MIG device whole: no limits)."""
        if shape.mig is not None:
            return tuple(GpuAllocation(g.uuid, 0, 0, True, mig_device=uuid) for g, uuid in devices)
        return tuple(
            GpuAllocation(
                uuid=g.uuid,
                memory_limit_bytes=mem,
                compute_milli=milli,
                exclusive=not shape.shared,
            )
            for g, milli, mem in devices
        )

    @staticmethod
    def _link_of(node: _Node, devices: list, shape: Shape) -> tuple[str | None, str]:
        """(link class, why these GPUs) of one rank's devices, before they are reserved."""
        if node.topo is None or not devices or shape.mig is not None:
            return None, ""
        index = {id(g): i for i, g in enumerate(node.gpus)}
        chosen = 0
        for g, _, _ in devices:
            chosen |= 1 << index[id(g)]
        if shape.shared:
            return node.topo.weakest_class(chosen), ""
        note = describe(node.topo, chosen, node.free_mask(), shape.gpu_count, shape.aligned)
        return node.topo.weakest_class(chosen), note

    def simulate(self, request: TaskRequest, explain: bool = True) -> PlacementResult:
        """Like `place`, but reserves nothing."""
        result = self.place(request, explain=explain)
        if isinstance(result, Placement):
            self.release(result)
        return result

    def release(self, placement: Placement) -> None:
        """Give back everything a placement reserved (a task ended or a gang was undone)."""
        for rank in placement.ranks:
            node = self.by_id[rank.node_id]
            uuids = {g.uuid: g for g in node.gpus}
            mig = any(a.mig_device for a in rank.gpus)
            devices = [
                (uuids[a.uuid], a.mig_device)
                if mig
                else (uuids[a.uuid], a.compute_milli, a.memory_limit_bytes)
                for a in rank.gpus
            ]
            self._unreserve(
                _Reservation(
                    node,
                    rank.cpu_milli,
                    rank.memory_bytes,
                    devices,
                    rank.owner,
                    rank.host_ports,
                    rank.mps,
                    mig,
                )
            )

    def snapshot(self) -> ClusterSnapshot:
        """The engine's accounting now, as a snapshot (what is left after its placements)."""
        nodes = []
        for node in self.nodes:
            gpus = tuple(
                replace(
                    g0,
                    compute_free_milli=g.milli_free,
                    memory_free_bytes=g.memory_free,
                    mps_owner=g.mps_owner,
                    mig_devices=None
                    if g0.mig_devices is None
                    else tuple(
                        replace(d, free=d.uuid in (g.mig_free or {}).get(d.profile, ()))
                        for d in g0.mig_devices
                    ),
                )
                for g0, g in zip(node.snap.gpus, node.gpus)
            )
            nodes.append(
                replace(
                    node.snap,
                    gpus=gpus,
                    cpu_free_milli=node.cpu_free,
                    memory_free_bytes=node.memory_free,
                    tasks=node.tasks,
                    owner_ports=dict(node.owner_ports),
                )
            )
        return ClusterSnapshot(tuple(nodes))

    def explain(self, request: TaskRequest) -> tuple[FilterDetail, ...]:
        """For every node, the first filter stage that rejects one rank of `request`, and why."""
        shape = shape_of(request)
        out = []
        for node in self.nodes:
            verdict = self._verdict(node, request, shape)
            if verdict is not None:
                out.append(FilterDetail(node.snap.id, *verdict))
        return tuple(out)

    def _verdict(self, node: _Node, request: TaskRequest, shape: Shape):
        snap = node.snap
        if not snap.schedulable:
            if snap.block_reason:
                return STAGE_ISOLATION, snap.block_reason
            return STAGE_STATUS, f"node is {snap.status}, not taking new work"
        if not self._selector_ok(node, request):
            sel = request.node_selector
            if sel.fleet is not None and snap.fleet != sel.fleet:
                return (
                    STAGE_SELECTOR,
                    f"node is in fleet {snap.fleet!r}, job asks for {sel.fleet!r}",
                )
            if sel.node_id is not None and snap.id != sel.node_id:
                return STAGE_SELECTOR, f"the instance's volume is on node {sel.node_id}"
            if sel.container and not snap.containers_ready:
                if snap.containers is not None:
                    return (
                        STAGE_CONTAINERS,
                        f"node cannot run the image: containers {snap.containers}",
                    )
                return (
                    STAGE_SELECTOR,
                    "node has no container runtime (podman or docker) for the image",
                )
            if sel.image is not None and not image_allowed(sel.image, tuple(snap.allowed_images)):
                return STAGE_IMAGE, (
                    f"node's fleet {snap.fleet!r} does not allow image {sel.image!r} "
                    f"(allowed_images: {', '.join(snap.allowed_images) or 'none'})"
                )
            missing = sorted(k for k, v in sel.labels.items() if snap.labels.get(k) != v)
            return STAGE_SELECTOR, "node lacks label(s) " + ", ".join(
                f"{k}={sel.labels[k]}" for k in missing
            )
        if not self._identity_ok(node, request):
            return STAGE_IDENTITY, (
                "the owner's account does not resolve on this node, or the node has not looked "
                "it up yet (its fleet runs tasks as their owners' own accounts: task_identity nss)"
            )
        if shape.mig is not None:
            verdict = self._mig_verdict(node, shape)
            if verdict is not None:
                return verdict
        if shape.gpu_count:
            models = set(node.model.split("|")) if node.model else set()
            if shape.gpu_types and not (models and models <= shape.gpu_types):
                have = node.model or "no GPUs"
                return (
                    STAGE_GPU_TYPE,
                    f"node has {have}, job accepts {', '.join(sorted(shape.gpu_types))}",
                )
            usable = node.usable_gpus()
            if len(usable) < shape.gpu_count:
                bad = len(node.gpus) - len(usable)
                extra = f" ({bad} unhealthy or held)" if bad else ""
                return (
                    STAGE_GPU_COUNT,
                    f"node has {len(usable)} usable GPU(s){extra}, job needs {shape.gpu_count}",
                )
        if node.cpu_free < request.cpu_milli:
            return (
                STAGE_CPU,
                f"{node.cpu_free / MILLI:g} CPUs free, job needs {request.cpu_milli / MILLI:g}",
            )
        if node.memory_free < request.memory_bytes:
            return (
                STAGE_MEMORY,
                f"{node.memory_free} bytes of memory free, job needs {request.memory_bytes}",
            )
        if not self._ports_ok(node, request):
            held = node.owner_ports.get(request.owner, 0)
            return STAGE_PORTS, (
                f"its owner's instances hold {held} host port(s) on this node, the cap per owner "
                f"and node is {request.max_owner_ports}, this instance declares "
                f"{request.host_ports}"
            )
        if shape.gpu_count:
            if shape.shared:
                fit = [g for g in node.gpus if g.usable and g.milli_free >= shape.gpu_milli]
                if not fit:
                    best = max((g.milli_free for g in node.gpus if g.usable), default=0)
                    need = shape.gpu_milli / MILLI
                    return (
                        STAGE_GPU,
                        f"largest free GPU share is {best / MILLI:.3f}, job needs {need:.3f}",
                    )
                if not any(
                    request.gpu_memory_for(g.memory_total) >= MIN_SLICE_MEMORY_BYTES for g in fit
                ):
                    return STAGE_SLICE_MEMORY, (
                        f"a slice's memory share of each GPU with enough free share is "
                        f"under {MIN_SLICE_MEMORY_BYTES // 1024**2} MiB"
                    )
                if request.mps and not any(g.takes_mps_of(request.owner) for g in fit):
                    return (
                        STAGE_MPS,
                        "each GPU with enough free share serves another owner's MPS work",
                    )
                if not any(g.memory_free >= request.gpu_memory_for(g.memory_total) for g in fit):
                    return STAGE_GPU_MEMORY, "no GPU with enough free share has enough free memory"
            else:
                idle = sum(1 for g in node.gpus if g.idle)
                if idle < shape.gpu_count:
                    return STAGE_GPU, f"{idle} GPU(s) free, job needs {shape.gpu_count} whole"
                topo, k = node.topo, shape.gpu_count
                if shape.aligned and topo is not None and topo.gap(node.free_mask(), k):
                    best = topo.class_of_rank(topo.best_full[k])
                    free = topo.class_of_rank(topo.best_ranks(node.free_mask())[k])
                    return STAGE_TOPOLOGY, (
                        f"{idle} GPU(s) free, but no {k} of them are linked by {best} (this "
                        f"node's best for {k} GPUs; the free ones reach {free}): the job requires "
                        "an aligned set (topology required)"
                    )
        return None

    @staticmethod
    def _mig_verdict(node: _Node, shape: Shape):
        """Why the node takes no rank of a MIG request (gpu type or too few free devices)."""
        models = set(node.model.split("|")) if node.model else set()
        if shape.gpu_types and not (models and models <= shape.gpu_types):
            have = node.model or "no GPUs"
            return (
                STAGE_GPU_TYPE,
                f"node has {have}, job accepts {', '.join(sorted(shape.gpu_types))}",
            )
        free = dict(node.mig_counts()).get(shape.mig or "", 0)
        if free < shape.mig_count:
            if not any(g.mig_free is not None for g in node.gpus):
                return (
                    STAGE_MIG,
                    f"node has no GPU in MIG mode taking work, job asks for {shape.mig}",
                )
            return STAGE_MIG, (
                f"{free} free MIG device(s) of profile {shape.mig}, job needs {shape.mig_count}"
            )
        return None

    def _unschedulable(self, request: TaskRequest, placed: int, explain: bool) -> Unschedulable:
        detail: tuple[FilterDetail, ...] = ()
        if explain:
            detail = self.explain(request)
        if request.num_nodes > 1:
            reason = f"only {placed} of {request.num_nodes} nodes can take a rank now"
            if explain:
                rejected = {d.node_id for d in detail}
                detail = detail + tuple(
                    FilterDetail(
                        n.snap.id,
                        STAGE_GANG,
                        "node fits one rank, but the gang needs more such nodes",
                    )
                    for n in self.nodes
                    if n.snap.id not in rejected
                )
        else:
            reason = "no node can take the task now"
        if detail:
            counts: dict[str, int] = {}
            quoted: dict[str, str] = {}
            for d in detail:
                counts[d.stage] = counts.get(d.stage, 0) + 1
                if d.stage in EXPLAINED_STAGES:
                    quoted.setdefault(d.stage, d.reason)
            reason += (
                " ("
                + ", ".join(
                    f"{stage}: {n} node(s)" + (f": {quoted[stage]}" if stage in quoted else "")
                    for stage, n in counts.items()
                )
                + ")"
            )
        return Unschedulable(reason=reason, filter_detail=detail, placed_ranks=placed)


def schedule(
    snapshot: ClusterSnapshot,
    requests: Iterable[TaskRequest],
    policy: str | Policy | None = None,
    profile: WorkloadProfile | None = None,
    explain: bool = True,
    seed: int | None = 0,
) -> list[PlacementResult]:
    """Place `requests` in order (highest priority first is the caller's job); one result each."""
    engine = PlacementEngine(snapshot, policy=policy, profile=profile, seed=seed)
    return [engine.place(r, explain=explain) for r in requests]


def profile_from_requests(
    requests: Sequence[TaskRequest], coverage: float = 1.0
) -> WorkloadProfile:
    """A workload profile from recent or queued requests (one count per rank)."""
    counts: dict[tuple, float] = {}
    for r in requests:
        s = shape_of(r)
        key = (s.cpu_milli, s.gpu_milli, s.gpu_count, tuple(sorted(s.gpu_types)))
        counts[key] = counts.get(key, 0) + r.num_nodes
    return WorkloadProfile.from_counts(counts, coverage)
