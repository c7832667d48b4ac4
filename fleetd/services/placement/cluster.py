"""The cluster as the scheduler and the capacity views see it: one load, one set of rules.

Every GPU of an enrolled (not revoked) node is exactly one of used (held by a task), free
(its node takes work and it is healthy) or blocked (with a code saying why). The scheduler's
snapshot and the capacity views are built from the same `ClusterState`, so they agree.
"""

from peewee import SQL, fn

from fleetd import scheduler, windows
from fleetd.models import (
    Instance,
    Job,
    JobState,
    NodeStatus,
)
from fleetd.services.nodes import accounts
from fleetd.services.placement.inventory import (
    BLOCK_TEXT,
    NodeBlock,
    load_inventory,
    node_links,
    series_id,
)
from fleetd.services.placement.mig import mig_slices
from fleetd.services.placement.network import node_place
from fleetd.services.placement.reservations import compute
from fleetd.services.placement.task_holds import load_holds
from fleetd.services.placement.terms import TermsCache
from fleetd.sql import Statement

_INSTANCE_PORTS = Statement(
    lambda v: Instance.select(Instance.owner_token_id, Instance.node_id, Instance.spec).where(
        Instance.node_id.is_null(False) & (Instance.state != "deleted")
    )
)
# The queue by group: (group key, how many jobs, the first of them), from the (state, group_key, id)
# index; the jobs stored before groups had keys, one by one.
_QUEUED_GROUPS = Statement(
    lambda v: (
        Job.select(Job.group_key, fn.COUNT(SQL("*")), fn.MIN(Job.id))
        .where((Job.state == JobState.QUEUED.value) & Job.group_key.is_null(False))
        .group_by(Job.group_key)
    )
)
_QUEUED_UNGROUPED = Statement(
    lambda v: Job.select(Job.id).where(
        (Job.state == JobState.QUEUED.value) & Job.group_key.is_null()
    )
)


def current_state(rt):
    """The ClusterState of this moment, over the inventory kept in memory (for the API's views);
    liveness is frozen into it, so its pure parts may run off the event loop."""
    return ClusterState(
        rt.terms,
        rt.clock.now(),
        rt.liveness.overdue_view(),
        rt.liveness.reported_running(),
        rt.inventory.get(),
        rt.reservations,
    )


class ClusterState:
    """Nodes, GPUs, fleets and active tasks, loaded once (inside a transaction when it matters)."""

    def __init__(
        self,
        terms: TermsCache,
        now,
        silent=lambda node_id: False,
        reported=None,
        inventory=None,
        reservations=None,
    ):
        """`terms`: the runtime's job terms; `reported`: {task id: (node id, epoch)} that nodes last
        said are still running; `inventory`: fleets, nodes and GPUs when the caller has them (else
        read now); `reservations`: the runtime's sums of what tasks hold (else summed now)."""
        self.terms = terms
        self.now = now
        self.inventory = inventory = inventory or load_inventory()
        self.fleets, self.nodes, self.gpus = inventory.fleets, inventory.nodes, inventory.gpus
        self.tasks = load_holds(terms)
        # Tasks the control plane ended (cancelled, preempted, requeued) whose process still runs:
        # their GPUs are not free until the node stops reporting them.
        # Only tasks that are not active can be stopping: most of what nodes report is active, and
        # then there is nothing to read.
        active = {t.id for t in self.tasks}
        ended = [task_id for task_id in (reported or ()) if task_id not in active]
        self.stopping = []
        if ended:
            self.stopping = [
                t
                for t in load_holds(terms, ended)
                if reported[t.id] == (t.node_id, t.epoch) and t.gpus
            ]
        # (node id, uuid) -> [compute milli, memory bytes, exclusive, [task ids]]; node id -> [cpu
        # milli, memory]
        # (team, priority class) -> GPUs its active jobs hold (what quotas count)
        self.held, self.node_use, self.usage = (
            reservations.of if reservations is not None else compute
        )(self.tasks + self.stopping)
        self._silent = silent
        # node id -> {owner: host ports its instances hold there}; see load_owner_ports
        self.owner_ports: dict = {}
        self.mps_owners = (
            self._mps_owners()
        )  # (node id, uuid) -> the owner whose MPS slices share it
        self._blocks: dict = {}  # node id -> NodeBlock or None, made when first asked
        self._closed: dict = {}  # fleet name -> NodeBlock while outside its window, else None
        self._held_by_node: dict[str, tuple] | None = None
        self._spot: list | None = None  # spot_tasks(), made once

    def overdue_ids(self, node_ids=None):
        """Ids of the nodes (of these) whose heartbeats are overdue."""
        silent = self._silent
        return {
            node_id
            for node_id in (self.inventory.by_id if node_ids is None else node_ids)
            if silent(node_id)
        }

    def held_by_node(self):
        """{node id: ((uuid, compute milli, memory bytes, exclusive, task ids), ...)} of the GPUs
        that tasks hold, in uuid order; nodes whose GPUs nobody holds are not there."""
        if self._held_by_node is None:
            out: dict[str, list[tuple]] = {}
            for (node_id, uuid), (milli, memory, exclusive, tasks) in sorted(self.held.items()):
                out.setdefault(node_id, []).append((uuid, milli, memory, exclusive, tuple(tasks)))
            self._held_by_node = {node_id: tuple(gpus) for node_id, gpus in out.items()}
        return self._held_by_node

    def block(self, node):
        """Why the node takes no new work (a NodeBlock), or None."""
        try:
            return self._blocks[node.id]
        except KeyError:
            block = self._blocks[node.id] = self._block(node)
            return block

    def _block(self, node):
        status = NodeStatus(node.status)
        if not status.is_schedulable():
            return NodeBlock(status.value, BLOCK_TEXT.get(status.value, status.value))
        if self._silent(node.id):
            return NodeBlock("unresponsive", BLOCK_TEXT["unresponsive"])
        fleet = self.fleets.get(node.fleet_id)
        if fleet is not None and fleet.require_isolation and node.isolation != "uid":
            why = (node.capabilities or {}).get("isolation_reason")
            return NodeBlock(
                "isolation_required",
                f"fleet {fleet.name} requires isolation; the node reports "
                f"isolation: {node.isolation}" + (f" ({why})" if why else ""),
            )
        if node.fleet_id not in self._closed:
            fleet = self.fleets.get(node.fleet_id)
            availability = fleet.availability if fleet is not None else None
            self._closed[node.fleet_id] = (
                None
                if windows.is_open(availability, self.now)
                else NodeBlock(
                    "outside_window",
                    BLOCK_TEXT["outside_window"],
                    windows.next_open_at(availability, self.now),
                )
            )
        return self._closed[node.fleet_id]

    # ------------------------------------------------------------ the scheduler's view

    def snapshot(self, nodes=None):
        """The engine's ClusterSnapshot: what every node (or these of them) has free, net of what
        tasks hold."""
        held, node_use = self.held, self.node_use
        out = []
        for node in self.nodes if nodes is None else nodes:
            block = self.block(node)
            gpus = []
            fleet = self.fleets.get(node.fleet_id)
            for gpu in self.gpus.get(node.id, ()):
                h = held.get((node.id, gpu.uuid), (0, 0, False, ()))
                gpus.append(
                    scheduler.GpuSnapshot(
                        uuid=gpu.uuid,
                        model=gpu.model,
                        memory_total_bytes=gpu.memory_total_bytes,
                        memory_free_bytes=max(0, gpu.memory_total_bytes - h[1]),
                        compute_free_milli=max(0, scheduler.MILLI - h[0]),
                        numa_node=gpu.numa_node or 0,
                        healthy=gpu.healthy,
                        exclusive=h[2],
                        mps_owner=self.mps_owners.get((node.id, gpu.uuid)),
                        mig_devices=mig_slices(gpu.mig, fleet, node.id, held),
                    )
                )
            cpu_used, mem_used, tasks = node_use.get(node.id, (0, 0, 0))
            out.append(
                scheduler.NodeSnapshot(
                    id=node.id,
                    gpus=tuple(gpus),
                    fleet=node.fleet_id,
                    labels=node.labels or {},
                    schedulable=block is None,
                    status=block.code if block else node.status,
                    cpu_free_milli=max(0, node.cpu_count * scheduler.MILLI - cpu_used),
                    memory_free_bytes=max(0, node.memory_bytes - mem_used),
                    tasks=tasks,
                    container_runtime=node.container_runtime,
                    containers=node.containers,
                    allowed_images=tuple(fleet.allowed_images) if fleet is not None else ("*",),
                    owner_ports=self.owner_ports.get(node.id, {}),
                    accounts=accounts.resolved(node, fleet),
                    block_reason=block.text
                    if block is not None and block.code == "isolation_required"
                    else "",
                    links=node_links(self.inventory, node),
                    network=node_place(self.inventory, node),
                )
            )
        return scheduler.ClusterSnapshot(nodes=tuple(out))

    def _mps_owners(self):
        """(node id, uuid) -> owner, of the GPUs that MPS slices hold (one owner per GPU)."""
        out = {}
        for task in self.tasks + self.stopping:
            if task.job.request.mps:
                for alloc in task.gpus:
                    out[(task.node_id, alloc["uuid"])] = task.job.request.owner
        return out

    def load_owner_ports(self):
        """Read which host ports each owner's instances hold on each node: all the ports an instance
        declares, on the node that keeps its volume, until it is deleted (call inside the pass's
        read transaction; only a pass that places a new instance with ports needs it)."""
        rows = _INSTANCE_PORTS.raw_tuples()
        out: dict[str, dict[str, int]] = {}
        spec_value = Instance.spec.python_value
        for owner, node_id, spec in rows:
            declared = len((spec_value(spec) or {}).get("ports") or ())
            if declared:
                per_node = out.setdefault(node_id, {})
                per_node[owner] = per_node.get(owner, 0) + declared
        self.owner_ports = out

    # ------------------------------------------------------------ capacity views

    def gpu_rows(self, nodes=None):
        """Every GPU (of these nodes) with its state (used, free or blocked, and why), classified
        by the pure `scheduler.gpu_state` over the same snapshot the scheduler places on."""
        rows = []
        nodes = self.nodes if nodes is None else nodes
        snapshot = self.snapshot(nodes)
        for node, snap in zip(nodes, snapshot.nodes):
            block = self.block(node)
            for gpu, gsnap in zip(self.gpus.get(node.id, ()), snap.gpus):
                h = self.held.get((node.id, gpu.uuid))
                row = {
                    "uuid": gpu.uuid,
                    "node_id": node.id,
                    "hostname": node.hostname,
                    "fleet": node.fleet_id,
                    "index": gpu.index,
                    "model": gpu.model,
                    "series": series_id(gpu.model),
                    "memory_total_bytes": gpu.memory_total_bytes,
                    "healthy": gpu.healthy,
                    "memory_reserved_bytes": (
                        gpu.memory_total_bytes
                        if gsnap.exclusive
                        else gpu.memory_total_bytes - gsnap.free_memory
                    ),
                    "compute_reserved_percent": (scheduler.MILLI - gsnap.compute_free_milli) / 10,
                    "tasks": list(h[3]) if h else [],
                }
                state, code = scheduler.gpu_state(snap, gsnap)
                row["state"] = state
                if state == "blocked":
                    row["blocked_code"] = code
                    if code == "unhealthy":
                        row["blocked_reason"] = gpu.health_reason or BLOCK_TEXT["unhealthy"]
                    else:
                        row["blocked_reason"] = block.text
                        row["next_open_at"] = block.next_open_at
                rows.append(row)
        return rows

    def running_tasks(self, priority_class=None):
        """Active tasks (of that priority class) as the engine's RunningTask (for preemption
        plans)."""
        out = []
        for task in self.tasks:
            if priority_class is not None and task.job.priority_class != priority_class:
                continue
            req = task.job.request
            out.append(
                scheduler.RunningTask(
                    task_id=task.id,
                    job_id=task.job_id,
                    node_id=task.node_id,
                    gpus=tuple(
                        scheduler.GpuAllocation(
                            uuid=g["uuid"],
                            memory_limit_bytes=g.get("memory_limit_bytes") or 0,
                            compute_milli=g.get("compute_milli", scheduler.MILLI),
                            exclusive=g.get("exclusive", False),
                            mig_device=g.get("mig_device"),
                        )
                        for g in task.gpus
                    ),
                    cpu_milli=req.cpu_milli,
                    memory_bytes=req.memory_bytes,
                    priority_class=task.job.priority_class,
                    bid=task.job.bid,
                )
            )
        return out

    def spot_tasks(self):
        """The active spot tasks as RunningTask, made once per state: the only tasks a preemption
        plan may stop, asked for by every on-demand group that does not fit."""
        if self._spot is None:
            self._spot = self.running_tasks("spot")
        return self._spot

    def queued_mig_demand(self):
        """{fleet or None: {MIG profile: MIG devices asked for by queued jobs}} (None: jobs that
        name no fleet), which dynamic MIG plans from; read as queued_demand reads: one job per
        group, times its count."""
        counts = {first: count for _, count, first in _QUEUED_GROUPS.raw_tuples()}
        counts.update((row[0], 1) for row in _QUEUED_UNGROUPED.raw_tuples())
        demand: dict[str | None, dict[str, int]] = {}
        for job_id, terms in self.terms.get_each(list(counts))[0].items():
            request = terms.request
            if request.mig is not None:
                slices = int(request.gpus or 1) * request.num_nodes * counts[job_id]
                of_fleet = demand.setdefault(request.node_selector.fleet, {})
                of_fleet[request.mig] = of_fleet.get(request.mig, 0) + slices
        return demand

    def queued_demand(self):
        """{series or None: GPUs asked for by queued jobs} (None: any series), from the terms
        cache: the jobs of a group ask alike, so one job of each group is read, times its count
        (a queue of 100,000 jobs in a few hundred groups reads a few hundred terms)."""
        counts = {first: count for _, count, first in _QUEUED_GROUPS.raw_tuples()}
        counts.update((row[0], 1) for row in _QUEUED_UNGROUPED.raw_tuples())
        demand: dict[str | None, float] = {}
        for job_id, terms in self.terms.get_each(list(counts))[0].items():
            request = terms.request
            gpus = float(request.gpus or 0) * request.num_nodes * counts[job_id]
            if not gpus:
                continue
            types = request.gpu_types or (None,)
            key = series_id(types[0]) if len(types) == 1 and types[0] else None
            demand[key] = demand.get(key, 0) + gpus
        return demand
