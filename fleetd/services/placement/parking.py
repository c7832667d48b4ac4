"""Parked groups: groups of equivalent queued jobs found not to fit, and the events that wake
them (as the Kubernetes scheduler's unschedulable queue and its queueing hints).

A group is parked by what kept it out: the nodes (`CAPACITY`: no node could take it) or its
team's allowance (`ALLOWANCE`: the team is at its quota, or its budget holds its work back).
An event says what changed (a `Capacity`) and wakes only the parked groups it could let fit:
capacity on a node of another fleet, without the labels a group selects, with GPU models it
does not accept or fewer GPUs than one of its ranks needs wakes nothing; a team's quota,
budget or ended task wakes only that team's groups held back by their allowance. When an event
does not say what changed, every group is woken. What no event announces (an availability
window opening) is seen by the periodic pass, which looks at every group.
"""

import collections
import datetime as dt
import json
import math
import threading
import typing
import zlib

from fleetd.models import Gpu

CAPACITY = "capacity"  # parked because no node could take it
ALLOWANCE = "allowance"  # parked because its team may not hold more now (quota or budget)

WIRE_MAX = 4000  # characters of a Capacity on the replicas' bus (whose messages hold 7,000)
LOG_EVENTS = (
    10_000  # events remembered for the pass in flight (more since it began: it parks nothing)
)


class Capacity(typing.NamedTuple):
    """What an event changed, for waking parked groups. A field left None is not known and
    matches every group.

    `node`: capacity on nodes changed (a node joined, came back, was uncordoned or undrained,
    passed validation, its labels or GPUs changed, a task on it ended); the nodes are those of
    `node_id`, `fleet`, `labels` ((key, value) pairs), GPU `models` and `gpus` (its GPU count).
    `allowance`: what `team` may hold changed (its quota or budget, or one of its tasks ended)."""

    node: bool = False
    node_id: str | None = None
    fleet: str | None = None
    labels: tuple | None = None
    models: frozenset | None = None
    gpus: int | None = None
    allowance: bool = False
    team: str | None = None

    def to_wire(self):
        """A JSON-able form, for the replicas' bus; None (every group wakes) when it would be too
        long for one message (a node with many long labels)."""
        out = self._asdict()
        out["labels"] = None if self.labels is None else [list(pair) for pair in self.labels]
        out["models"] = None if self.models is None else sorted(self.models)
        return out if len(json.dumps(out)) <= WIRE_MAX else None

    @classmethod
    def from_wire(cls, data):
        """The Capacity of to_wire(); None (wake everything) for what is not one: a fleet name, as
        a replica of an earlier version sends, wakes the groups that fleet's nodes could serve."""
        if isinstance(data, str):
            return cls(node=True, fleet=data)
        if not isinstance(data, dict):
            return None
        try:
            labels, models = data.get("labels"), data.get("models")
            return cls(
                node=bool(data.get("node")),
                node_id=data.get("node_id"),
                fleet=data.get("fleet"),
                labels=None if labels is None else tuple((str(k), str(v)) for k, v in labels),
                models=None if models is None else frozenset(models),
                gpus=data.get("gpus"),
                allowance=bool(data.get("allowance")),
                team=data.get("team"),
            )
        except (TypeError, ValueError):
            return None


def node_capacity(
    node_id=None, fleet=None, labels=None, models=None, gpus=None, team=None, ended=False
):
    """The Capacity of a change on one node; `ended`: a task of `team` ended there (None: of a
    team not known), which frees that team's allowance too."""
    return Capacity(
        node=True,
        node_id=node_id,
        fleet=fleet,
        labels=None if labels is None else tuple(sorted((labels or {}).items())),
        models=None if models is None else frozenset(models),
        gpus=gpus,
        allowance=ended,
        team=team if ended else None,
    )


def team_allowance(team):
    """The Capacity of a change to what a team may hold (its quota or its budget)."""
    return Capacity(allowance=True, team=team or "")


def wakes(event, key, kind):
    """True when `event` (a Capacity, None: anything) could let the group `key` (parked for
    `kind`) fit."""
    if event is None:
        return True
    if kind == ALLOWANCE:
        return event.allowance and (event.team is None or event.team == key.team)
    if not event.node:
        return False
    if None not in (key.node_id, event.node_id) and key.node_id != event.node_id:
        return False
    if None not in (key.fleet, event.fleet) and key.fleet != event.fleet:
        return False
    if key.labels and event.labels is not None:
        labels = dict(event.labels)
        if any(labels.get(k) != v for k, v in key.labels):
            return False
    if (
        key.gpus
        and key.gpu_types
        and event.models is not None
        and not event.models <= set(key.gpu_types)
    ):
        return False  # the engine takes a node only when it accepts every model the node has
    return not (key.gpus and event.gpus is not None and math.ceil(key.gpus) > event.gpus)


def _spread(key):
    """A fraction in [0, 1) fixed for a group: where in the window its periodic look falls."""
    return zlib.crc32(repr(key).encode()) / 2**32


def _place_keys(key):
    """Where a group parked for capacity is indexed: (its fleet or None, each GPU type it accepts,
    or None when it accepts any or needs no GPU)."""
    types = key.gpu_types if key.gpus and key.gpu_types else (None,)
    return [(key.fleet, model) for model in types]


class ParkedGroups:
    """The parked groups, indexed by what they need: groups parked for capacity by (fleet, GPU
    type), those held back by their allowance by team; an event looks only at the groups its
    fleet and GPU models could serve, or at its team's."""

    def __init__(self):
        self._seq = 0  # events so far
        self._log: collections.deque[tuple[int, Capacity | None]] = collections.deque(
            maxlen=LOG_EVENTS
        )  # (seq, ...)
        self._groups = {}  # key -> (reason, kind)
        self._by_place = {}  # (fleet or None, GPU type or None) -> {key}
        self._by_team = {}  # team -> {key}
        self._parked_at: dict = {}  # key -> when (fleetd's clock) it was last found not to fit
        self._view = (
            None,
            0,
        )  # (inventory version a pass last read fresh, the events before that pass)
        self._lock = threading.Lock()

    def bump(self, event=None):
        """Something changed (`event`, a Capacity; None: not known what): wake the parked groups
        it could let fit."""
        with self._lock:
            self._seq += 1
            self._log.append((self._seq, event))
            for key in [k for k in self._candidates(event) if wakes(event, k, self._groups[k][1])]:
                self._drop(key)

    def _candidates(self, event):
        if event is None:
            return list(self._groups)
        out = set()
        if event.node:
            for (fleet, model), keys in self._by_place.items():
                if (event.fleet is None or fleet in (None, event.fleet)) and (
                    event.models is None or model is None or model in event.models
                ):
                    out |= keys
        if event.allowance:
            if event.team is None:
                for keys in self._by_team.values():
                    out |= keys
            else:
                out |= self._by_team.get(event.team, set())
        return out

    def _drop(self, key):
        reason, kind = self._groups.pop(key)
        self._parked_at.pop(key, None)
        index = self._by_team if kind == ALLOWANCE else self._by_place
        for where in [key.team] if kind == ALLOWANCE else _place_keys(key):
            keys = index.get(where)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[where]

    def _add(self, key, reason, kind, at=None):
        if key in self._groups:
            self._drop(key)
        self._groups[key] = (reason, kind)
        self._parked_at[key] = at
        if kind == ALLOWANCE:
            self._by_team.setdefault(key.team, set()).add(key)
        else:
            for where in _place_keys(key):
                self._by_place.setdefault(where, set()).add(key)

    def stamps(self):
        """The state to hand a pass: what it parks is checked against the events after it."""
        with self._lock:
            return self._seq

    def view_since(self, version, since, stale):
        """From which event on a pass that began at `since` (stamps()) checks what it parks: its
        start; or, on a throttled inventory (`stale`) read before it began, the start of the last
        pass that read that inventory (`version`) fresh, since the events after may concern nodes
        it does not show; None when that is not known (the pass parks nothing)."""
        with self._lock:
            if not stale:
                self._view = (version, since)
                return since
            return self._view[1] if version is not None and self._view[0] == version else None

    def due(self, age, now, opened=lambda at, fleet: False):
        """The parked groups a periodic pass asks again at `now`: those found not to fit `age`
        seconds ago or more (what no event announces: a budget's new month, spot work an
        on-demand group could preempt), those for which `opened(at, fleet)` says an availability
        window opened since (of that fleet; any fleet for None), and those parked at a time not
        known. Groups parked by one pass fall due over the half of `age` before it, each at its
        own offset, so that one periodic pass does not ask them all again at once."""
        with self._lock:
            return {
                key
                for key, at in self._parked_at.items()
                if at is None
                or at <= now - dt.timedelta(seconds=age * (1 - _spread(key) / 2))
                or opened(at, key.fleet)
            }

    def parked(self):
        """{key: reason} of the groups parked now (a copy, for the compute phase)."""
        with self._lock:
            return {key: reason for key, (reason, _) in self._groups.items()}

    def update(self, parked, since, looked=(), now=None):
        """Record what a pass that began at `since` (stamps()) found: `parked` {key: (reason,
        kind)} of the groups that did not fit, `looked` the groups it asked (those that fit are
        parked no more), `now` when it read the cluster. A group an event since could have let
        fit is not parked; nor is any when more events came since than are remembered, or when
        `since` is None (not known)."""
        with self._lock:
            for key in looked:
                if key in self._groups:
                    self._drop(key)
            if since is None:
                return
            missed = [event for seq, event in self._log if seq > since]
            if self._seq - since > len(missed):
                return  # the log no longer reaches back to the pass's start: wake rather than guess
            for key, (reason, kind) in parked.items():
                if not any(wakes(event, key, kind) for event in missed):
                    self._add(key, reason, kind, now)

    def clear(self):
        with self._lock:
            self._groups.clear()
            self._by_place.clear()
            self._by_team.clear()
            self._parked_at.clear()


def ended_on(rt, node_id, job_id):
    """The Capacity of a task of job `job_id` ending on node `node_id`: that node as the
    inventory last saw it (any node, when that is not known) and the job's team (any team)."""
    team = None
    if job_id is not None:
        found, _ = rt.terms.get_each([job_id])  # cached for a job that ran
        team = found[job_id].team if job_id in found else None
    known = rt.inventory.node_of(node_id) if node_id is not None else None
    if known is None:
        return node_capacity(team=team, ended=True)
    node, models, gpus = known
    return node_capacity(
        node.id, node.fleet_id, node.labels or {}, models, gpus, team=team, ended=True
    )


def freed_on(rt, node_id):
    """The Capacity of what a process that stopped on node `node_id` held (no team's allowance
    changes: its task had ended in fleetd before)."""
    known = rt.inventory.node_of(node_id)
    if known is None:
        return node_capacity()
    node, models, gpus = known
    return node_capacity(node.id, node.fleet_id, node.labels or {}, models, gpus)


def node_changed(node):
    """The Capacity of a change to a node (a row as just written: it joined, came back, was
    uncordoned, passed validation, its labels or GPUs changed), with its GPUs as stored."""
    models = [
        model for (model,) in Gpu.select(Gpu.model).where(Gpu.node == node.id).tuples().execute()
    ]
    return node_capacity(node.id, node.fleet_id, node.labels or {}, models, len(models))


def fleet_changed(fleet):
    """The Capacity of a change to a fleet (its windows, labels or rules): any node of it."""
    return node_capacity(fleet=fleet)
