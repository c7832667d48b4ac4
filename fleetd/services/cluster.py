"""The cluster as the scheduler and the capacity views see it: one load, one set of rules.

Every GPU of an enrolled (not revoked) node is exactly one of used (held by a task), free
(its node takes work and it is healthy) or blocked (with a code saying why). The scheduler's
snapshot and the capacity views are built from the same `ClusterState`, so they agree.
"""

import dataclasses
import functools
import re
import threading
import time
import typing

from fleetd import scheduler, windows
from fleetd.clock import isoformat
from fleetd.credentials import ADMIN
from fleetd.db import database, writing
from fleetd.errors import NotFound
from fleetd.models import (
    Fleet,
    Gpu,
    GpuType,
    Instance,
    InventoryChange,
    InventoryVersion,
    Job,
    JobState,
    Node,
    NodeStatus,
    Task,
)
from fleetd.services.lifecycle import ACTIVE_TASK_STATES
from fleetd.services.terms import JobTerms, TermsCache
from fleetd.sql import Statement

BLOCK_TEXT = {
    "pending": "node enrolled, waiting for its first heartbeat",
    "validating": "node validating: it takes work once its GPUs pass the checks",
    "failed_validation": "node failed validation",
    "cordoned": "node cordoned by an admin",
    "draining": "node draining",
    "drained": "node drained for maintenance",
    "lost": "node lost: no heartbeats",
    "unresponsive": "heartbeats overdue",
    "outside_window": "fleet outside its availability window",
    "unhealthy": "GPU unhealthy",
    "isolation_required": "fleet requires isolation; the node's agent cannot run tasks as other users",
}



def call(fn, *args):
    """Run fn here (the default offload: fleetd serve hands CPU-heavy work to its thread pool)."""
    return fn(*args)


@functools.lru_cache(maxsize=1024)  # a handful of models, asked for once per GPU of the fleet
def series_id(model):
    """A stable id for a GPU model: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "unknown"


@dataclasses.dataclass
class NodeBlock:
    code: str
    text: str
    next_open_at: object = None


class Hold(typing.NamedTuple):
    """A task that holds capacity (active, or ended here but still reported running by its node).

    A tuple, not a model: a scheduling pass reads every active task, and with a deep backlog
    that is thousands of rows per pass.
    """

    id: str
    job_id: str
    rank: int
    node_id: str
    epoch: int
    state: str
    gpus: list
    job: JobTerms
    run_as: str | None = None  # as stored (JSON text): only the allocation view reads it


def _hold_columns():
    return Task.select(Task.id, Task.job, Task.rank, Task.node, Task.epoch, Task.state, Task.gpus, Task.run_as)


_ACTIVE_HOLDS = Statement(lambda v: _hold_columns().where(Task.state.in_(ACTIVE_TASK_STATES)))
_FLEETS = Statement(lambda v: Fleet.select())
_NODES = Statement(lambda v: Node.select().where(Node.status != NodeStatus.REVOKED.value).order_by(Node.id))


def _gpu_columns():
    return Gpu.select(Gpu.node, Gpu.uuid, Gpu.index, Gpu.model, Gpu.memory_total_bytes, Gpu.numa_node, Gpu.healthy,
                      Gpu.health_reason)


_GPUS = Statement(lambda v: _gpu_columns().order_by(Gpu.node, Gpu.index))


class GpuRow(typing.NamedTuple):
    """What capacity needs of a GPU: a tuple, not a model (a pass reads every GPU of the fleet)."""

    node_id: str
    uuid: str
    index: int  # type: ignore[assignment]  # the GPU's index shadows tuple.index, which nothing calls on a row
    model: str
    memory_total_bytes: int
    numa_node: int | None
    healthy: bool
    health_reason: str


_ENDED_CHUNK = 32  # task ids per statement that reads ended tasks by id: 32 shapes at most


def _ended_holds_statement(count):
    return Statement(lambda v: _hold_columns().where(
        Task.id.in_([v(f"id{i}") for i in range(count)]) & Task.state.not_in(ACTIVE_TASK_STATES)))


_ENDED_HOLDS = {n: _ended_holds_statement(n) for n in range(1, _ENDED_CHUNK + 1)}


def load_holds(terms_cache, ended=None):
    """Hold rows of the active tasks, or of those of the task ids in `ended` that are no longer
    active: narrow queries compiled once, job terms from `terms_cache` (rt.terms)."""
    if ended is None:
        rows = _ACTIVE_HOLDS.raw_tuples()
    else:
        rows = []
        for start in range(0, len(ended), _ENDED_CHUNK):
            chunk = ended[start:start + _ENDED_CHUNK]
            rows += _ENDED_HOLDS[len(chunk)].raw_tuples(**{f"id{i}": task_id for i, task_id in enumerate(chunk)})
    terms = terms_cache.get_many(list({row[1] for row in rows}))
    gpus_value = Task.gpus.python_value
    return [Hold(task_id, job_id, rank, node_id, epoch, state, gpus_value(gpus) or [], terms[job_id], run_as)
            for task_id, job_id, rank, node_id, epoch, state, gpus, run_as in rows if job_id in terms]


class Inventory(typing.NamedTuple):
    """Fleets, nodes and GPUs as placement reads them, at one inventory version."""

    version: int
    fleets: dict
    nodes: list
    gpus: dict  # node id -> [GpuRow]
    by_fleet: dict  # fleet name -> [node]
    models: dict  # node id -> frozenset of its GPU models
    node_fleet: dict  # node id -> fleet name
    all_models: frozenset  # every GPU model in the fleet
    by_id: dict  # node id -> node
    # ((version, ids of the nodes changed after it), ...): how this inventory was patched from
    # earlier ones, the last few reads at most; () when it was read in full.
    history: tuple = ()
    # scheduling.never_fits answers about this inventory by request shape: a deep queue of alike
    # submits costs one look at the nodes, not one per submit (any thread may add one)
    answers: dict | None = None


_INVENTORY_VERSION = Statement(lambda v: InventoryVersion.select(InventoryVersion.version)
                               .where(InventoryVersion.id == 1))


_CHANGED_SINCE = Statement(lambda v: InventoryChange.select(InventoryChange.node_id)
                           .where(InventoryChange.version > v("version")))
HISTORY = 8  # patches an inventory remembers (changed_since)
FULL_READ_SHARE = 0.25  # more of the fleet changed than this: one scan of every row costs less
_CHUNK = 500  # node ids per IN (...) list


def load_inventory(version=None, offload=call, previous=None, pause=None):
    """The inventory from the tables (read inside the caller's transaction). The rows are fetched
    here, a chunk at a time with pause() between chunks when given (fleetd serve: the event loop
    answers heartbeats meanwhile; a full read at 100,000 nodes fetches 900,000 rows); turning
    them into objects (most of the cost) goes through `offload`.

    With `previous` (an inventory read earlier), only the nodes the triggers noted as changed
    since its version are read, and the rest of `previous` is kept as it is."""
    fleets = {f.name: f for f in _FLEETS.rows()}
    if previous is not None and previous.version is not None and version is not None:
        changed = [row[0] for row in _CHANGED_SINCE.raw_tuples(version=previous.version)]
        if len(changed) <= max(64, FULL_READ_SHARE * len(previous.nodes)):
            node_rows, gpu_rows = [], []
            for at in range(0, len(changed), _CHUNK):
                chunk = changed[at:at + _CHUNK]
                node_rows += raw_rows(Node.select().where(Node.id.in_(chunk) & (Node.status != NodeStatus.REVOKED.value)))
                gpu_rows += raw_rows(_gpu_columns().where(Gpu.node.in_(chunk)).order_by(Gpu.node, Gpu.index))
                if pause is not None:
                    pause()
            return offload(_patched, previous, version, fleets, frozenset(changed), node_rows, gpu_rows)
    return offload(_inventory, version, fleets, _NODES.raw_tuples(pause=pause), _GPUS.raw_tuples(pause=pause))


def raw_rows(query):
    """A query's rows as the driver returns them (as Statement.raw_tuples: converted later)."""
    return database.execute_sql(*query.sql()).fetchall()


def _gpu_rows(rows):
    gpus: dict[str, list[GpuRow]] = {}
    for row in rows:
        gpu = GpuRow(row[0], row[1], row[2], row[3], row[4], row[5], bool(row[6]), row[7] or "")
        gpus.setdefault(gpu.node_id, []).append(gpu)
    return gpus


def _inventory(version, fleets, node_rows, gpu_rows):
    gpus = _gpu_rows(gpu_rows)
    nodes = _NODES.instances(node_rows)
    models = {node_id: frozenset(g.model for g in rows) for node_id, rows in gpus.items()}
    return _assemble(version, fleets, nodes, gpus, models)


def _patched(previous, version, fleets, changed, node_rows, gpu_rows):
    """`previous` with the rows of the `changed` nodes read anew (a node not among the rows was
    deleted or revoked). Unchanged nodes keep their objects."""
    by_id = {node_id: node for node_id, node in previous.by_id.items() if node_id not in changed}
    for node in _NODES.instances(node_rows):
        by_id[node.id] = node
    fresh = _gpu_rows(gpu_rows)
    gpus = {node_id: rows for node_id, rows in previous.gpus.items() if node_id not in changed}
    gpus.update(fresh)
    models = {node_id: m for node_id, m in previous.models.items() if node_id not in changed}
    models.update({node_id: frozenset(g.model for g in rows) for node_id, rows in fresh.items()})
    nodes = sorted(by_id.values(), key=_node_id)  # the order a full read gives (ORDER BY id)
    history = previous.history[-(HISTORY - 1):] + ((previous.version, changed),)
    return _assemble(version, fleets, nodes, gpus, models)._replace(history=history)


def changed_since(inventory, version):
    """Ids of the nodes whose rows or GPUs changed between inventory `version` and this one, or
    None when that is not known (read in full since, or too long ago)."""
    if version == inventory.version:
        return frozenset()
    out = set()
    for since, changed in reversed(inventory.history):
        out |= changed
        if since == version:
            return out
    return None


def _node_id(node):
    return node.id


def _assemble(version, fleets, nodes, gpus, models):
    by_fleet: dict[str, list[Node]] = {}
    for node in nodes:
        by_fleet.setdefault(node.fleet_id, []).append(node)
    return Inventory(version, fleets, nodes, gpus, by_fleet, models, {node.id: node.fleet_id for node in nodes},
                     frozenset().union(*models.values()), {node.id: node for node in nodes}, answers={})


def _holds(inventory, version):
    """True when `inventory` is at `version` or newer (read by a caller whose transaction began later)."""
    return inventory is not None and None not in (version, inventory.version) and inventory.version >= version


class InventoryCache:
    """The inventory kept in memory, read again only when the database's inventory version moved.

    Triggers (migration 0006) bump the version on every change placement reads (a node enrolled,
    its status, labels or resources changed, its GPUs reported anew, a fleet's window changed),
    whoever made it, so a pass at 10,000 nodes reads one row instead of every node and GPU; and
    when it moved, only the nodes the triggers noted as changed since (migration 0013) are read.
    The rows are shared: read them, never change them.
    """

    # While nodes enrol by the thousand every pass would read them all again: a reload waits
    # until the last one is this many of its own durations old (at least MIN_AGE seconds). Work
    # placed on the older view is safe: the pass's write phase checks each node still takes work.
    MIN_AGE = 1.0
    AGE_FACTOR = 3

    def __init__(self, offload=call, throttle=False, monotonic=time.monotonic):
        self._monotonic = monotonic
        self._current = None
        self._loaded_at = 0.0
        self._cost = 0.0
        self.offload = offload
        self.throttle = throttle  # fleetd serve: bound the reload rate (else: always the latest)
        self.stale_for = 0.0  # after get(): seconds until the view it gave may be reloaded
        self.after_full_read = None  # fleetd serve: fn() called once an inventory read in full is in place
        self.pause = None  # fleetd serve: fn() that gives the event loop away, called between fetched chunks
        # One read at a time: under fleetd serve a read yields the loop while its rows become
        # objects, and every request arriving meanwhile would otherwise start the same read (and
        # hold its own copy). Callers that arrive during a read wait for it and take what it read.
        self._reading = threading.Lock()

    def get(self):
        """The inventory at the database's version (call inside the pass's read transaction) or a
        newer one another caller just read, or, throttled, a view at most a few seconds old while
        reloads would come faster than that."""
        rows = _INVENTORY_VERSION.raw_tuples()
        version = rows[0][0] if rows else None
        self.stale_for = 0.0
        current = self._current
        if _holds(current, version):
            return current
        with self._reading:
            return self._read(version)

    def _read(self, version):
        current = self._current
        if _holds(current, version):  # another caller read it while this one waited
            return current
        now = self._monotonic()
        wait = max(self.MIN_AGE, self.AGE_FACTOR * self._cost) - (now - self._loaded_at)
        if current is not None and self.throttle and wait > 0:
            self.stale_for = wait
            return current
        # Never inside a write transaction: a writer that gives the loop away stalls every other.
        pause = None if writing() else self.pause
        current = self._current = load_inventory(version, self.offload, previous=current, pause=pause)
        self._loaded_at, self._cost = now, self._monotonic() - now
        if not current.history and self.after_full_read is not None:
            self.after_full_read()
        return current

    def node_of(self, node_id):
        """(node, its GPU models, its GPU count) as last read; None when not known yet."""
        current = self._current
        if current is None:
            return None
        node = current.by_id.get(node_id)
        if node is None:
            return None
        return node, current.models.get(node_id, frozenset()), len(current.gpus.get(node_id, ()))


def current_state(rt):
    """The ClusterState of this moment, over the inventory kept in memory (for the API's views);
    liveness is frozen into it, so its pure parts may run off the event loop."""
    return ClusterState(rt.terms, rt.clock.now(), rt.liveness.overdue_view(), rt.liveness.reported_running(),
                        rt.inventory.get())


class ClusterState:
    """Nodes, GPUs, fleets and active tasks, loaded once (inside a transaction when it matters)."""

    def __init__(self, terms: TermsCache, now, silent=lambda node_id: False, reported=None, inventory=None):
        """`terms`: the runtime's job terms; `reported`: {task id: (node id, epoch)} that nodes last
        said are still running; `inventory`: fleets, nodes and GPUs when the caller has them (else
        read now)."""
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
            self.stopping = [t for t in load_holds(terms, ended)
                             if reported[t.id] == (t.node_id, t.epoch) and t.gpus]
        # (node id, uuid) -> [compute milli, memory bytes, exclusive, [task ids]]; node id -> [cpu milli, memory]
        self.held, self.node_use = self._reservations()
        self._silent = silent
        self.owner_ports: dict = {}  # node id -> {owner: host ports its instances hold there}; see load_owner_ports
        self.mps_owners = self._mps_owners()  # (node id, uuid) -> the owner whose MPS slices share it
        self._blocks: dict = {}  # node id -> NodeBlock or None, made when first asked
        self._closed: dict = {}  # fleet name -> NodeBlock while outside its window, else None
        self._held_by_node: dict[str, tuple] | None = None

    def overdue_ids(self, node_ids=None):
        """Ids of the nodes (of these) whose heartbeats are overdue."""
        silent = self._silent
        return {node_id for node_id in (self.inventory.by_id if node_ids is None else node_ids) if silent(node_id)}

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
            return NodeBlock("isolation_required", f"fleet {fleet.name} requires isolation; the node reports "
                                                   f"isolation: {node.isolation}" + (f" ({why})" if why else ""))
        if node.fleet_id not in self._closed:
            fleet = self.fleets.get(node.fleet_id)
            availability = fleet.availability if fleet is not None else None
            self._closed[node.fleet_id] = None if windows.is_open(availability, self.now) else NodeBlock(
                "outside_window", BLOCK_TEXT["outside_window"], windows.next_open_at(availability, self.now))
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
            for gpu in self.gpus.get(node.id, ()):
                h = held.get((node.id, gpu.uuid), (0, 0, False, ()))
                gpus.append(scheduler.GpuSnapshot(
                    uuid=gpu.uuid, model=gpu.model, memory_total_bytes=gpu.memory_total_bytes,
                    memory_free_bytes=max(0, gpu.memory_total_bytes - h[1]),
                    compute_free_milli=max(0, scheduler.MILLI - h[0]), numa_node=gpu.numa_node or 0,
                    healthy=gpu.healthy, exclusive=h[2], mps_owner=self.mps_owners.get((node.id, gpu.uuid))))
            cpu_used, mem_used, tasks = node_use.get(node.id, (0, 0, 0))
            fleet = self.fleets.get(node.fleet_id)
            out.append(scheduler.NodeSnapshot(
                id=node.id, gpus=tuple(gpus), fleet=node.fleet_id, labels=node.labels or {},
                schedulable=block is None, status=block.code if block else node.status,
                cpu_free_milli=max(0, node.cpu_count * scheduler.MILLI - cpu_used),
                memory_free_bytes=max(0, node.memory_bytes - mem_used), tasks=tasks,
                container_runtime=node.container_runtime, containers=node.containers,
                allowed_images=tuple(fleet.allowed_images) if fleet is not None else ("*",),
                owner_ports=self.owner_ports.get(node.id, {}),
                block_reason=block.text if block is not None and block.code == "isolation_required" else ""))
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
        declares, on the node that keeps its volume, until it is deleted (call inside the pass's read
        transaction; only a pass that places a new instance with ports needs it)."""
        rows = _INSTANCE_PORTS.raw_tuples()
        out: dict[str, dict[str, int]] = {}
        spec_value = Instance.spec.python_value
        for owner, node_id, spec in rows:
            declared = len((spec_value(spec) or {}).get("ports") or ())
            if declared:
                per_node = out.setdefault(node_id, {})
                per_node[owner] = per_node.get(owner, 0) + declared
        self.owner_ports = out

    def _reservations(self):
        """What active and still-stopping tasks hold, per GPU and per node (with their count)."""
        held: dict[tuple[str, str], list] = {}  # (node id, uuid) -> [milli, memory, exclusive, task ids]
        node_use: dict[str, list[int]] = {}  # node id -> [cpu milli, memory bytes, tasks]
        for task in self.tasks + self.stopping:
            req = task.job.request
            use = node_use.setdefault(task.node_id, [0, 0, 0])
            use[0] += req.cpu_milli
            use[1] += req.memory_bytes
            use[2] += 1
            for alloc in task.gpus:
                h = held.setdefault((task.node_id, alloc["uuid"]), [0, 0, False, []])
                h[0] += alloc.get("compute_milli", scheduler.MILLI)
                h[1] += alloc.get("memory_limit_bytes") or 0
                h[2] = h[2] or alloc.get("exclusive", False)
                h[3].append(task.id)
        return held, node_use

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
                row = {"uuid": gpu.uuid, "node_id": node.id, "hostname": node.hostname, "fleet": node.fleet_id,
                       "index": gpu.index, "model": gpu.model, "series": series_id(gpu.model),
                       "memory_total_bytes": gpu.memory_total_bytes, "healthy": gpu.healthy,
                       "memory_reserved_bytes": (gpu.memory_total_bytes if gsnap.exclusive
                                                 else gpu.memory_total_bytes - gsnap.free_memory),
                       "compute_reserved_percent": (scheduler.MILLI - gsnap.compute_free_milli) / 10,
                       "tasks": list(h[3]) if h else []}
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

    def running_tasks(self):
        """Active tasks as the engine's RunningTask (for preemption plans)."""
        out = []
        for task in self.tasks:
            req = task.job.request
            out.append(scheduler.RunningTask(
                task_id=task.id, job_id=task.job_id, node_id=task.node_id,
                gpus=tuple(scheduler.GpuAllocation(uuid=g["uuid"], memory_limit_bytes=g.get("memory_limit_bytes") or 0,
                                                   compute_milli=g.get("compute_milli", scheduler.MILLI),
                                                   exclusive=g.get("exclusive", False)) for g in task.gpus),
                cpu_milli=req.cpu_milli, memory_bytes=req.memory_bytes,
                priority_class=task.job.priority_class, bid=task.job.bid))
        return out

    def queued_demand(self):
        """{series or None: GPUs asked for by queued jobs} (None: any series), from the terms cache."""
        ids = [row[0] for row in _QUEUED_IDS.raw_tuples()]
        demand: dict[str | None, float] = {}
        for terms in self.terms.get_each(ids)[0].values():
            request = terms.request
            gpus = float(request.gpus or 0) * request.num_nodes
            if not gpus:
                continue
            types = request.gpu_types or (None,)
            key = series_id(types[0]) if len(types) == 1 and types[0] else None
            demand[key] = demand.get(key, 0) + gpus
        return demand


_INSTANCE_PORTS = Statement(lambda v: Instance.select(Instance.owner_token_id, Instance.node_id, Instance.spec).where(
    Instance.node_id.is_null(False) & (Instance.state != "deleted")))
_QUEUED_IDS = Statement(lambda v: Job.select(Job.id).where(Job.state == JobState.QUEUED.value))


def cluster_status(state, principal=None, storage=None, offload=call):
    """GET /api/v1/cluster/status: total = used + free + blocked, overall and per series.

    Running jobs (`active_jobs`) and instances whose run holds capacity (`active_instances`,
    named as instances: never by their internal runs) are listed in full to admins (and to fleetd
    itself: no principal); anyone else sees its own, and the others only as counts (their names,
    owners and teams are not theirs to read, as GET /jobs/{id} says). `offload` runs the per-GPU
    part (rt.offload: off the event loop; at 10,000 nodes that is 80,000 GPUs).
    """
    demand = state.queued_demand()
    gpu = offload(gpu_summary, state, demand)
    # A cancelling job still holds its GPUs until its processes have stopped.
    active_query = (Job.select().where(Job.state.in_([JobState.RUNNING.value, JobState.CANCELLING.value]))
                    .order_by(Job.id))
    tasks_by_job: dict[str, list] = {}
    for task in state.tasks:
        tasks_by_job.setdefault(task.job_id, []).append(task)
    active = list(active_query)
    runs = [j.instance_id for j in active if j.instance_id is not None]
    instances = {i.id: i for i in Instance.select().where(Instance.id.in_(runs))} if runs else {}
    listed: dict[str, list[dict]] = {"jobs": [], "instances": []}
    others = {"jobs": {"count": 0, "gpus": 0}, "instances": {"count": 0, "gpus": 0}}
    for j in active:
        kind = "jobs" if j.instance_id is None else "instances"
        gpus = sum(_gpus_held(t.gpus) for t in tasks_by_job.get(j.id, []))
        if principal is not None and principal.role != ADMIN and j.owner_token_id != principal.id:
            others[kind]["count"] += 1
            others[kind]["gpus"] += gpus
            continue
        nodes = sorted({t.node_id for t in tasks_by_job.get(j.id, [])})
        if j.instance_id is None:  # kind "jobs"
            listed[kind].append({"id": j.id, "name": j.name, "owner": j.owner, "team": j.team, "state": j.state,
                                 "started_at": isoformat(j.started_at), "gpus": gpus, "nodes": nodes,
                                 **job_row_times(j, state.now), **retry_view(j)})
            continue
        inst = instances.get(j.instance_id)
        listed[kind].append({"id": j.instance_id, "name": j.name, "owner": j.owner, "team": j.team,
                             "state": inst.state if inst is not None else "deleted",
                             "started_at": isoformat(inst.started_at if inst is not None else j.started_at),
                             "gpus": gpus, "nodes": nodes})
    return {"gpu": gpu, "storage": storage or {}, "active_count": len(active),
            "active_jobs": listed["jobs"], "other_active_jobs": others["jobs"],
            "active_instances": listed["instances"], "other_active_instances": others["instances"],
            "profiles": profiles(state), "nodes": _node_counts(state)}


def job_row_times(job, now):
    """When a job was submitted, started and ended, and how long it has run (or ran) in seconds."""
    end = job.ended_at or now
    return {"submitted_at": isoformat(job.submitted_at), "ended_at": isoformat(job.ended_at),
            "duration_seconds": round(max(0.0, (end - job.started_at).total_seconds()), 3) if job.started_at else None}


def retry_view(job):
    """How often a job was retried and whether one more retry is possible (its retry policy and
    attempts left), with the reason when it is not."""
    on = ((job.spec or {}).get("retry") or {}).get("on") or []
    if job.max_attempts <= 1 or not on:
        blocker = "its spec has no retry policy"
    elif job.attempt >= job.max_attempts:
        blocker = f"no attempts left ({job.attempt} of {job.max_attempts} used)"
    else:
        blocker = ""
    return {"retry_count": max(0, job.attempt - 1), "can_retry": not blocker, "retry_blocker": blocker,
            "retry_on": list(on)}


def _gpus_held(allocations):
    """GPUs a task holds: whole ones count 1, a shared slice its fraction (0.25 for a quarter)."""
    return sum(1 if g.get("exclusive", True) else round(g.get("compute_milli", scheduler.MILLI) / scheduler.MILLI, 3)
               for g in allocations)


def gpu_summary(state, demand):
    """The `gpu` part of cluster status: counts overall and per series, and why GPUs are blocked.
    Pure (no database, no locks): it may run in a worker thread.

    Each GPU is classified as `scheduler.gpu_state` would classify it in `state.gpu_rows()`, but
    counted straight from the inventory and the holds: no row or snapshot is built per GPU (at
    80,000 GPUs that took about a second of CPU for every scrape of /metrics)."""
    held = state.held
    series_of: dict[str, str] = {}  # model -> its series
    overall = {"total": 0, "used": 0, "free": 0, "blocked": 0}
    series: dict[str, dict[str, int]] = {}
    labels: dict[str, str] = {}
    notes: dict[tuple[str, str], dict] = {}
    for node in state.nodes:
        gpus = state.gpus.get(node.id, ())
        if not gpus:
            continue
        block = state.block(node)
        for gpu in gpus:
            sid = series_of.get(gpu.model)
            if sid is None:
                sid = series_of[gpu.model] = series_id(gpu.model)
            counts = series.get(sid)
            if counts is None:
                counts = series[sid] = {"total": 0, "used": 0, "free": 0, "blocked": 0}
                labels[sid] = gpu.model
            h = held.get((node.id, gpu.uuid))
            if h is not None and (h[2] or h[0] > 0 or (h[1] > 0 and gpu.memory_total_bytes > 0)):
                kind = "used"
            elif block is not None or not gpu.healthy:
                kind = "blocked"
                code = block.code if block is not None else "unhealthy"
                note = notes.get((code, sid))
                if note is None:
                    note = notes[(code, sid)] = {"code": code, "series": sid, "count": 0,
                                                 "reason": BLOCK_TEXT.get(code, code)}
                note["count"] += 1
                if block is not None and block.next_open_at:
                    note["next_open_at"] = isoformat(block.next_open_at)
            else:
                kind = "free"
            counts["total"] += 1
            counts[kind] += 1
            overall["total"] += 1
            overall[kind] += 1
    rows = [dict(id=sid, label=labels[sid], **counts, queued=round(demand.get(sid, 0), 3),
                 note=_series_note(notes, sid)) for sid, counts in sorted(series.items())]
    # Demand no series row holds (a job that takes any model or one of several, or a model no node
    # has) is a row of its own, so that the rows' queued add up to the card's.
    elsewhere = round(sum(gpus for sid, gpus in demand.items() if sid not in series), 3)
    if elsewhere:
        rows.append(dict(id=ANY_SERIES, label=ANY_SERIES_LABEL, total=0, used=0, free=0, blocked=0, queued=elsewhere,
                         note=None))
    return dict(overall, queued=round(sum(demand.values()), 3), blocked_reason=blocked_sentence(notes.values(), labels),
                blocked_notes=list(notes.values()), series=rows)


ANY_SERIES = "any"
ANY_SERIES_LABEL = "any GPU model"  # work that takes any model, one of several, or one that no node has


def _series_note(notes, sid):
    """The note that blocks most of a series' GPUs ({code, series, next_open_at?}), or None."""
    mine = [note for (code, series), note in notes.items() if series == sid]
    if not mine:
        return None
    top = max(mine, key=lambda note: note["count"])
    return {k: top[k] for k in ("code", "series", "next_open_at") if k in top}


def blocked_sentence(notes, labels):
    """Why GPUs are blocked, in one sentence ('' when none is): the most blocked first."""
    parts = []
    for note in sorted(notes, key=lambda n: (-n["count"], n["series"], n["code"])):
        until = f" until {note['next_open_at']}" if note.get("next_open_at") else ""
        gpus = "GPU" if note["count"] == 1 else "GPUs"
        parts.append(f"{note['count']} {labels.get(note['series'], note['series'])} {gpus}: {note['reason']}{until}")
    return "; ".join(parts) + ("." if parts else "")


def _node_counts(state):
    counts: dict[str, int] = {}
    for node in state.nodes:
        counts[node.status] = counts.get(node.status, 0) + 1
    return counts


def profiles(state):
    """Shapes that exist: for each series and GPUs-per-node, how many nodes have it, with a `label`
    to show (seed 003's profile summary)."""
    shapes: dict[tuple[str, int], int] = {}  # (series, GPUs per node) -> nodes
    models: dict[str, str] = {}  # series -> a model of it
    for node in state.nodes:
        by_series: dict[str, list[GpuRow]] = {}
        for gpu in state.gpus.get(node.id, ()):
            by_series.setdefault(series_id(gpu.model), []).append(gpu)
            models.setdefault(series_id(gpu.model), gpu.model)
        for sid, gpus in by_series.items():
            shapes[(sid, len(gpus))] = shapes.get((sid, len(gpus)), 0) + 1
    return [{"name": f"{count}x{per}x{sid}", "label": profile_label(models[sid], per, count), "series": sid,
             "num_nodes": count, "gpus_per_node": per}
            for (sid, per), count in sorted(shapes.items())]


def profile_label(model, per_node, nodes):
    """A profile as people read it: "8 x NVIDIA H100 80GB HBM3 per node, 2 nodes"."""
    return f"{per_node} x {model} per node, {nodes} node{'' if nodes == 1 else 's'}"


def cluster_allocation(state, node_id=None):
    """GET /api/v1/cluster/allocation: every GPU, node and task allocation (of one node, with
    `node_id`). Pure: it may run off the event loop."""
    chosen = state.nodes if node_id is None else [n for n in state.nodes if n.id == node_id]
    rows = state.gpu_rows(chosen)
    for row in rows:
        row["next_open_at"] = isoformat(row.get("next_open_at"))
    nodes = {}
    for node in chosen:
        cpu, mem, _ = state.node_use.get(node.id, (0, 0, 0))
        block = state.block(node)
        nodes[node.id] = {"hostname": node.hostname, "fleet": node.fleet_id, "status": node.status,
                          "schedulable": block is None, "blocked_reason": block.text if block else None,
                          "cpu_count": node.cpu_count, "cpus_reserved": cpu / scheduler.MILLI,
                          "memory_bytes": node.memory_bytes, "memory_reserved_bytes": mem}
    allocations = [{"task_id": t.id, "job_id": t.job_id, "rank": t.rank, "node_id": t.node_id, "state": t.state,
                    "workload": t.job.workload.as_dict(), "run_as": Task.run_as.python_value(t.run_as),
                    "gpus": [{k: v for k, v in g.items()} for g in t.gpus]} for t in state.tasks
                   if node_id is None or t.node_id == node_id]
    gpu_to_tasks = {row["uuid"]: row["tasks"] for row in rows if row["tasks"]}
    return {"gpus": rows, "nodes": nodes, "allocations": allocations, "gpu_to_tasks": gpu_to_tasks}


def _gpu_type_entry(model, memory_bytes=None):
    manufacturer, display = display_name(model)
    return {"model": model, "display_name": display, "manufacturer": manufacturer, "memory_bytes": memory_bytes,
            "total": 0, "available": 0, "max_per_node": 0, "price_per_hour": None, "spot_min_bid": None}


def gpu_types(state):
    """GET /api/v1/gpu-types: every model in the fleet (or priced by an admin) with capacity and prices."""
    prices = {t.model: t for t in GpuType.select()}
    out: dict[str, dict] = {}
    per_node: dict[tuple[str, str], int] = {}
    for row in state.gpu_rows():
        entry = out.get(row["model"])
        if entry is None:
            entry = out[row["model"]] = _gpu_type_entry(row["model"], row["memory_total_bytes"])
        entry["total"] += 1
        entry["available"] += row["state"] == "free"
        per_node[row["model"], row["node_id"]] = count = per_node.get((row["model"], row["node_id"]), 0) + 1
        entry["max_per_node"] = max(entry["max_per_node"], count)
    for model, priced in prices.items():
        entry = out.setdefault(model, _gpu_type_entry(model))
        entry["price_per_hour"] = priced.price_per_hour
        entry["spot_min_bid"] = priced.spot_min_bid
    return sorted(out.values(), key=lambda e: e["model"])


def models_on_nodes_with(state, labels):
    """The GPU models on enrolled nodes that carry all of `labels` (every node's for no labels)."""
    wanted = dict(labels).items()
    return {gpu.model for node in state.nodes if wanted <= (node.labels or {}).items()
            for gpu in state.gpus.get(node.id, ())}


def get_gpu_type(state, model, gpu_count=None):
    """GET /api/v1/gpu-types/{model}: one model as the list has it (NotFound when neither a node has it nor
    an admin priced it), with its lowest prices for `gpu_count` GPUs when asked."""
    entry = next((e for e in gpu_types(state) if e["model"] == model), None)
    if entry is None:
        raise NotFound(f"GPU type {model!r} not found: no node has it and no price is set for it")
    if gpu_count is not None:
        entry["lowest_price"] = lowest_price(entry, gpu_count)
    return entry


def lowest_price(entry, gpu_count):
    """The lowest prices per GPU-hour of `gpu_count` GPUs of a model on one node: the on-demand price and
    the spot minimum bid set by an admin (null when none is set, or when no node has that many)."""
    available = 0 < gpu_count <= entry["max_per_node"]
    return {"gpu_count": gpu_count, "available": available,
            "minimum_bid_price": entry["spot_min_bid"] if available else None,
            "uninterruptable_price": entry["price_per_hour"] if available else None}


_VENDORS = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}
_BRANDS = ("GeForce ", "Radeon ", "Tesla ", "Quadro ")


def display_name(model):
    """(manufacturer or None, the model's short name): 'NVIDIA GeForce RTX 3090' -> ('NVIDIA', 'RTX 3090'),
    'NVIDIA H100 80GB HBM3' -> ('NVIDIA', 'H100 80GB HBM3'), as GPU clouds show them."""
    first, _, rest = model.partition(" ")
    manufacturer = _VENDORS.get(first.lower())
    if manufacturer is None or not rest:
        return manufacturer, model
    for brand in _BRANDS:
        if rest.startswith(brand) and len(rest) > len(brand):
            rest = rest[len(brand):]
    return manufacturer, rest
