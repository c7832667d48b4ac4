"""The inventory the scheduler reads: nodes, GPUs and fleets as of one version, patched node by node
from the changes since the last read (the GPU holds of active tasks: task_holds.py)."""

import dataclasses
import functools
import re
import threading
import time
import typing

from fleetd import scheduler
from fleetd.db import database, writing
from fleetd.models import (
    Fleet,
    Gpu,
    InventoryChange,
    InventoryVersion,
    Node,
    NodeStatus,
)
from fleetd.services.placement.network import carried_places
from fleetd.sql import Statement
from fleetwire.topology import Topology

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
    "isolation_required": (
        "fleet requires isolation; the node's agent cannot run tasks as other users"
    ),
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


_FLEETS = Statement(lambda v: Fleet.select())
_NODES = Statement(
    lambda v: Node.select().where(Node.status != NodeStatus.REVOKED.value).order_by(Node.id)
)


def _gpu_columns():
    return Gpu.select(
        Gpu.node,
        Gpu.uuid,
        Gpu.index,
        Gpu.model,
        Gpu.memory_total_bytes,
        Gpu.numa_node,
        Gpu.healthy,
        Gpu.health_reason,
        Gpu.mig_mode,
        Gpu.mig_devices,
        Gpu.mig_target,
        Gpu.mig_blocked,
    )


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
    # In MIG mode, its MIG devices that have a profile (all free: tasks' holds are not in the
    # inventory); None outside MIG mode
    mig: tuple[scheduler.MigSlice, ...] | None = None


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
    # reasons.never_fits answers about this inventory by request shape: a deep queue of alike
    # submits costs one look at the nodes, not one per submit (any thread may add one)
    answers: dict | None = None
    # node id -> its GPUs' link matrix (node_links), made when a snapshot first asks for it and
    # kept by the inventories patched from this one for the nodes that did not change
    links: dict | None = None
    # node id -> its NetworkPlace, and fleet name -> (its topology file, the file parsed): made when
    # first asked for, kept as links are (services.placement.network)
    places: dict | None = None
    network_files: dict | None = None


_INVENTORY_VERSION = Statement(
    lambda v: InventoryVersion.select(InventoryVersion.version).where(InventoryVersion.id == 1)
)


_CHANGED_SINCE = Statement(
    lambda v: InventoryChange.select(InventoryChange.node_id).where(
        InventoryChange.version > v("version")
    )
)
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
                chunk = changed[at : at + _CHUNK]
                node_rows += raw_rows(
                    Node.select().where(
                        Node.id.in_(chunk) & (Node.status != NodeStatus.REVOKED.value)
                    )
                )
                gpu_rows += raw_rows(
                    _gpu_columns().where(Gpu.node.in_(chunk)).order_by(Gpu.node, Gpu.index)
                )
                if pause is not None:
                    pause()
            return offload(
                _patched, previous, version, fleets, frozenset(changed), node_rows, gpu_rows
            )
    return offload(
        _inventory, version, fleets, _NODES.raw_tuples(pause=pause), _GPUS.raw_tuples(pause=pause)
    )


def raw_rows(query):
    """A query's rows as the driver returns them (as Statement.raw_tuples: converted later)."""
    return database.execute_sql(*query.sql()).fetchall()


def _gpu_rows(rows):
    gpus: dict[str, list[GpuRow]] = {}
    for row in rows:
        gpu = GpuRow(
            row[0], row[1], row[2], row[3], row[4], row[5], bool(row[6]), row[7] or "", _mig(row)
        )
        gpus.setdefault(gpu.node_id, []).append(gpu)
    return gpus


def _mig(row):
    """A GPU row's MIG devices that fleetd can place (those with a profile), or None outside MIG
    mode; none while a dynamic MIG change is pending there (its slices are about to go) or after
    one failed (blocked until an operator clears it)."""
    if row[8] != "enabled":
        return None
    if row[10] is not None or row[11]:
        return ()
    devices = Gpu.mig_devices.python_value(row[9]) or []
    return tuple(scheduler.MigSlice(d["uuid"], d["profile"]) for d in devices if d.get("profile"))


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
    history = previous.history[-(HISTORY - 1) :] + ((previous.version, changed),)
    links = {
        node_id: matrix
        for node_id, matrix in dict(previous.links or {}).items()
        if node_id in by_id and node_id not in changed
    }
    files, places = carried_places(previous, fleets, by_id, changed)
    return _assemble(version, fleets, nodes, gpus, models)._replace(
        history=history, links=links, places=places, network_files=files
    )


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
    return Inventory(
        version,
        fleets,
        nodes,
        gpus,
        by_fleet,
        models,
        {node.id: node.fleet_id for node in nodes},
        frozenset().union(*models.values()),
        {node.id: node for node in nodes},
        answers={},
        links={},
        places={},
        network_files={},
    )


def node_links(inventory, node):
    """The link matrix of the node's GPUs in the order of its GPU rows (what NodeSnapshot.links
    holds), or None when it has no topology or the topology is not of its GPUs; made once per
    change of the node, not at every pass."""
    cache = inventory.links
    if cache is not None and node.id in cache:
        return cache[node.id]
    matrix = topology_links(node.topology, [gpu.uuid for gpu in inventory.gpus.get(node.id, ())])
    if cache is not None:
        cache[node.id] = matrix
    return matrix


def topology_links(topology, uuids):
    """A stored topology's link matrix in the order of `uuids`, or None (none stored, not valid, or
    not exactly these GPUs: one was replaced or lost since the registration)."""
    if not topology or not uuids:
        return None
    try:
        return Topology.from_wire(topology).links_for(uuids)
    except ValueError:
        return None


def _holds(inventory, version):
    """True when `inventory` is at `version` or newer (read by a caller whose transaction began
    later)."""
    return (
        inventory is not None
        and None not in (version, inventory.version)
        and inventory.version >= version
    )


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
    TRUSTED_AGE = 30.0  # seconds a read answers may_hold_mig()
    AGE_FACTOR = 3

    def __init__(self, offload=call, throttle=False, monotonic=time.monotonic):
        self._monotonic = monotonic
        self._current = None
        self._loaded_at = 0.0
        self._cost = 0.0
        self.offload = offload
        self.throttle = throttle  # fleetd serve: bound the reload rate (else: always the latest)
        self.stale_for = 0.0  # after get(): seconds until the view it gave may be reloaded
        self.after_full_read = (
            None  # fleetd serve: fn() called once an inventory read in full is in place
        )
        self.pause = (
            None  # fleetd serve: fn() that gives the event loop away, called between fetched chunks
        )
        # One read at a time: under fleetd serve a read yields the loop while its rows become
        # objects, and every request arriving meanwhile would otherwise start the same read (and
        # hold its own copy). Callers that arrive during a read wait for it and take what it read.
        self._reading = threading.Lock()

    def may_hold_mig(self, node_id):
        """False when the inventory last read (no read here), less than TRUSTED_AGE seconds ago,
        has every GPU of this node outside MIG mode: no target layout can be pending for it (the
        planner reads the inventory, and plans only GPUs in MIG mode). True when it does not know
        the node, or has no recent read (a replica that does not lead reads it seldom)."""
        current = self._current
        if (
            current is None
            or node_id not in current.gpus
            or self._monotonic() - self._loaded_at > self.TRUSTED_AGE
        ):
            return True
        return any(gpu.mig is not None for gpu in current.gpus[node_id])

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
        current = self._current = load_inventory(
            version, self.offload, previous=current, pause=pause
        )
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
