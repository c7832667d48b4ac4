"""The scheduler's cluster state kept between passes: placement engines brought up to date node by
node, instead of built from every node and GPU on every pass.

A pass still reads what holds capacity (the active tasks) and the inventory version. What it no
longer does is turn each of 10,000 nodes into a snapshot and then into the engine's accounting,
about a second at that size, for a queue that asks for one GPU. Each kept engine remembers, per
node, the view it was built from: the node's row and GPUs as placement reads them, why it takes
no work, what its tasks hold. A pass rebuilds only the nodes whose view differs now: nodes whose
tasks started or ended, that stopped or resumed taking work, that the last pass reserved on, and,
when the inventory was read again, those whose row or GPUs changed (the ones the database's
triggers noted; every candidate when the inventory was read in full). Nodes that joined are added
at the end (node ids sort by creation time): a registration storm no longer rebuilds every engine
at every pass, which held the interpreter lock for seconds at 100,000 nodes. An engine is built
afresh only when a node left or one joined among the others. Views are compared, never trusted:
whatever wrote the change (this replica or another), a kept engine decides as one built afresh
would. Kubernetes' scheduler keeps its node snapshot the same way, by generation.
"""

import collections
import dataclasses

from fleetd import scheduler, windows
from fleetd.services.placement.inventory import changed_since
from fleetd.services.placement.mig import mig_setting

READY = "ready"


@dataclasses.dataclass
class _Kept:
    version: object  # the inventory version the engine's nodes come from (no rows are kept: an
    # engine must not hold an old inventory in memory)
    ids: tuple  # the candidate node ids, in inventory order
    every_node: bool  # the candidates are every node (a request names no fleet)
    engine: scheduler.PlacementEngine
    views: dict  # node id -> the view its accounting was built from
    special: set  # ids whose view had a block or holds: looked at again next pass


class Engines:
    """Placement engines by candidate set (what a pass's queued work could use), the most
    recently used `size` of them."""

    def __init__(self, size=4):
        self.size = size
        self._kept = collections.OrderedDict()  # wants -> _Kept
        # (inventory, {node id: static view} as asked, ids not ready)
        self._static: tuple[object, dict, frozenset[str]] = (None, {}, frozenset())
        self.built = 0  # engines built afresh (for tests and the benchmark)
        self.after_build = None  # fleetd serve: fn() called once an engine built afresh is kept
        self.refreshed = 0  # nodes brought up to date in a kept engine
        self.extended = 0  # nodes that joined, added to a kept engine

    def engine(self, state, requests, policy=None, profile=None):
        """(engine, candidate nodes or None for all) for these requests, as `state` sees the
        cluster now, scoring with `policy` and `profile`. Call from one pass at a time."""
        wants = _wants(requests)
        inventory = state.inventory
        kept = self._kept.pop(wants, None)
        nodes = None
        if kept is not None and kept.version != inventory.version:
            nodes = _candidates(inventory, wants)
            ids = tuple(n.id for n in (inventory.nodes if nodes is None else nodes))
            if ids != kept.ids and ids[: len(kept.ids)] == kept.ids:
                self._extend(state, kept, ids)  # nodes joined (ids sort by time): at the end
            if ids != kept.ids:
                kept = None  # nodes left, or joined among the others: built afresh, in order
            else:
                # The triggers noted which nodes changed: only those (and the usual suspects) are
                # looked at; with no such note, every candidate is.
                changed = changed_since(inventory, kept.version)
                kept.version = inventory.version
                self._bring_up_to_date(
                    state, kept, everything=changed is None, also=changed or frozenset()
                )
        elif kept is not None:
            self._bring_up_to_date(state, kept, everything=False)
            nodes = None if kept.every_node else [inventory.by_id[node_id] for node_id in kept.ids]
        if kept is None:
            nodes = _candidates(inventory, wants)
            kept = self._build(state, nodes)
            if self.after_build is not None:
                self.after_build()
        self._kept[wants] = kept
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)
        kept.engine.rescore(policy, profile)
        return kept.engine, nodes

    def _build(self, state, nodes):
        self.built += 1
        rows = state.inventory.nodes if nodes is None else nodes
        ids = tuple(node.id for node in rows)
        static, special = self._views_now(state, set(ids))
        engine = scheduler.PlacementEngine(state.snapshot(rows))
        views = {node_id: self._view(state, node_id, static) for node_id in ids}
        return _Kept(state.inventory.version, ids, nodes is None, engine, views, special)

    def _extend(self, state, kept, ids):
        """Add to a kept engine the nodes of `ids` after those it has (nodes that joined: their
        ids, which sort by creation time, come after the others')."""
        new = ids[len(kept.ids) :]
        static, special = self._views_now(state, set(new))
        rows = state.inventory.by_id
        kept.engine.extend(state.snapshot([rows[node_id] for node_id in new]).nodes)
        for node_id in new:
            kept.views[node_id] = self._view(state, node_id, static)
        kept.ids = ids
        kept.special |= special
        self.extended += len(new)

    def _bring_up_to_date(self, state, kept, everything, also=frozenset()):
        static, special = self._views_now(state, kept.views.keys())
        touched = (
            kept.engine.take_touched()
        )  # reserved on by the last pass: its accounting is not its view's
        ids = (
            kept.views.keys()
            if everything
            else (kept.special | special | touched | also) & kept.views.keys()
        )
        changed = []
        for node_id in ids:
            view = self._view(state, node_id, static)
            if view != kept.views[node_id] or node_id in touched:
                kept.views[node_id] = view
                changed.append(node_id)
        if changed:
            rows = state.inventory.by_id
            kept.engine.refresh(state.snapshot([rows[node_id] for node_id in changed]).nodes)
            self.refreshed += len(changed)
        kept.special = special

    def _views_now(self, state, ids):
        """(a memo of static views, the ids among `ids` that may take no work or hold something
        now)."""
        inventory = state.inventory
        if self._static[0] is not inventory:
            self._static = (
                inventory,
                {},
                frozenset(n.id for n in inventory.nodes if n.status != READY),
            )
        _, static, not_ready = self._static
        special = (
            not_ready | state.node_use.keys() | state.overdue_ids(ids) | state.owner_ports.keys()
        ) & ids
        for fleet, nodes in inventory.by_fleet.items():
            row = inventory.fleets.get(fleet)
            availability = getattr(row, "availability", None)
            # A fleet's rules change no node's row: its nodes are looked at while it has any (and,
            # being special then, once more after they are lifted).
            restricted = row is not None and (
                row.require_isolation
                or list(row.allowed_images) != ["*"]
                or mig_setting(row)["mode"] == "off"
            )
            if restricted or (availability and not windows.is_open(availability, state.now)):
                special.update(n.id for n in nodes if n.id in ids)
        return static, special

    @staticmethod
    def _view(state, node_id, static):
        """What a node's accounting in an engine is made of (equal views: equal accounting)."""
        node = state.inventory.by_id[node_id]
        fixed = static.get(node_id)
        if fixed is None:  # the node's row and GPUs as placement reads them, once per inventory
            fleet = state.inventory.fleets.get(node.fleet_id)
            fixed = static[node_id] = (
                node.status,
                node.fleet_id,
                node.labels,
                node.cpu_count,
                node.memory_bytes,
                node.container_runtime,
                node.capabilities,
                tuple(fleet.allowed_images) if fleet is not None else None,
                mig_setting(fleet)["mode"],  # off: its GPUs' MIG devices take no work
                tuple(state.inventory.gpus.get(node_id, ())),
            )
        block = state.block(node)
        return (
            fixed,
            block.code if block else None,
            state.node_use.get(node_id),
            state.held_by_node().get(node_id),
            state.owner_ports.get(node_id),
        )


def _wants(requests):
    """What decides the candidate nodes of these requests: {(fleet, accepted GPU models or None)},
    or None when one of them names no fleet (every node is a candidate)."""
    wants = set()
    for request in requests:
        fleet = request.node_selector.fleet
        if fleet is None:
            return None
        wants.add(
            (fleet, frozenset(request.gpu_types) if request.gpus and request.gpu_types else None)
        )
    return frozenset(wants)


def _candidates(inventory, wants):
    """The nodes any request of `wants` could use: of its fleet and, for GPU work that names GPU
    types, with only GPUs of those types; None (every node) when `wants` is None."""
    if wants is None:
        return None
    out = []
    for fleet in sorted({fleet for fleet, _ in wants}):
        accepted = [types for f, types in wants if f == fleet]
        for node in inventory.by_fleet.get(fleet, ()):
            models = inventory.models.get(node.id, frozenset())
            if None in accepted or any(models <= types for types in accepted):
                out.append(node)
    return out
