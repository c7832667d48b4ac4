"""The heartbeat on the wire, defined once (docs/api.md "Heartbeat"): what fleet-agent sends every
interval (Heartbeat) and what fleetd answers (HeartbeatReply). Each side builds its own message as
one of these and reads the other's with `from_wire`, which checks the shape and names the bad field
(ValueError). fleetd's API schema checks the request's values first (sizes, patterns) and describes
it; a test holds its fields to these.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from fleetwire.checks import is_int
from fleetwire.mig import (
    MAX_MIG_EVENTS,
    MAX_MIG_LAYOUTS,
    MigEvent,
    MigLayout,
    mig_list_from_wire,
)
from fleetwire.topology import Topology

MAX_ACCOUNTS = 10_000  # owners' accounts a node keeps looked up for fleetd (task_identity nss)


class TaskReport(NamedTuple):
    """A task the node holds, as its heartbeat lists it."""

    id: str
    epoch: int
    state: str

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "epoch": self.epoch, "state": self.state}


def _optional(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(name)
    if value is not None and not isinstance(value, kind):
        raise ValueError(
            f"{name} must be {getattr(kind, '__name__', 'a value of its kind')} or absent"
        )
    return value


def _list_of(data: dict[str, Any], name: str, kind: type, what: str) -> tuple[Any, ...] | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, kind) for item in value):
        raise ValueError(f"{name} must be a list of {what}")
    return tuple(value)


def _strings(data: dict[str, Any], name: str) -> tuple[str, ...] | None:
    return _list_of(data, name, str, "strings")


def _objects(data: dict[str, Any], name: str) -> tuple[dict[str, Any], ...] | None:
    return _list_of(data, name, dict, "objects")


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """One heartbeat of a node. None: the agent says nothing of that field this time (fleetd keeps
    what it knows); the agent sends its GPUs, capabilities and what it is (version, bundle, labels)
    when they changed or fleetd has not taken them yet."""

    tasks: tuple[TaskReport, ...] = ()
    metrics: dict[str, Any] | None = None  # node metrics: GPU readings, foreign processes, limits
    volumes: tuple[str, ...] | None = None  # the instance volumes the node keeps
    instances: tuple[dict[str, Any], ...] = ()  # the runtime figures of its instance runs
    gpus: tuple[dict[str, Any], ...] | None = None  # its GPUs, as registration reports them
    capabilities: dict[str, Any] | None = None  # container runtime, isolation, host uids
    draining: bool | None = None  # the agent asks for no new work (fleet-agent drain)
    agent_version: str | None = None
    bundle_sha256: str | None = None
    labels: dict[str, str] | None = None  # the agent's own labels (its config file)
    # Its GPUs' topology, with gpus only: an agent enrolled before it reported one (or whose
    # hardware changed) keeps its node's topology current without enrolling again.
    topology: Topology | None = None
    # What came of the MIG target layouts fleetd asked for (dynamic MIG), sent until answered.
    mig_events: tuple[MigEvent, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        """The request body: absent fields left out."""
        out: dict[str, Any] = {"tasks": [task.to_wire() for task in self.tasks]}
        for name in (
            "metrics",
            "capabilities",
            "draining",
            "agent_version",
            "bundle_sha256",
            "labels",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.volumes is not None:
            out["volumes"] = list(self.volumes)
        if self.instances:
            out["instances"] = list(self.instances)
        if self.gpus is not None:
            out["gpus"] = list(self.gpus)
        if self.topology is not None:
            out["topology"] = self.topology.to_wire()
        if self.mig_events:
            out["mig_events"] = [event.to_wire() for event in self.mig_events]
        return out

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> Heartbeat:
        """Read a heartbeat's body (an empty one is a bare liveness signal)."""
        data = data or {}
        if not isinstance(data, dict):
            raise ValueError("a heartbeat must be an object")
        tasks = []
        for item in data.get("tasks") or ():
            if (
                not isinstance(item, dict)
                or not isinstance(item.get("id"), str)
                or not is_int(item.get("epoch"))
                or not isinstance(item.get("state"), str)
            ):
                raise ValueError("tasks must be [{id, epoch, state}]")
            tasks.append(TaskReport(item["id"], item["epoch"], item["state"]))
        gpus, topology = _objects(data, "gpus"), data.get("topology")
        if topology is not None and gpus is None:
            raise ValueError("topology comes with gpus: the uuids it links are theirs")
        return cls(
            tasks=tuple(tasks),
            metrics=_optional(data, "metrics", dict),
            volumes=_strings(data, "volumes"),
            instances=_objects(data, "instances") or (),
            gpus=gpus,
            capabilities=_optional(data, "capabilities", dict),
            draining=_optional(data, "draining", bool),
            agent_version=_optional(data, "agent_version", str),
            bundle_sha256=_optional(data, "bundle_sha256", str),
            labels=_optional(data, "labels", dict),
            topology=None
            if topology is None
            else Topology.from_wire(topology, [str(gpu.get("uuid")) for gpu in gpus or ()]),
            mig_events=mig_list_from_wire(
                data.get("mig_events"), "mig_events", MigEvent, MAX_MIG_EVENTS
            ),
        )


@dataclasses.dataclass(frozen=True)
class HeartbeatReply:
    """fleetd's answer to a heartbeat."""

    status: str  # the node's status
    heartbeat_interval_seconds: float
    revoked: bool = False  # the node was revoked: the agent stops all work and exits
    cancel: tuple[str, ...] = ()  # task ids the node must stop
    drain: dict[str, Any] | None = None  # the drain in progress, if any
    delete_volumes: tuple[str, ...] = ()  # volumes of deleted instances the node may remove
    lease_seconds: float | None = None  # job tasks stop this long after the last answered heartbeat
    validation: dict[str, Any] | None = None  # the suite to run while the node validates
    # Logins whose host accounts the node resolves and reports (capabilities.accounts): owners with
    # work queued for its fleet, which runs tasks as their own accounts (task_identity nss).
    lookup_accounts: tuple[str, ...] = ()
    # Dynamic MIG: target layouts for the node's GPUs whose slices are all idle (agent/mig.py).
    mig_layouts: tuple[MigLayout, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status,
            "drain": self.drain,
            "revoked": self.revoked,
            "cancel": list(self.cancel),
            "delete_volumes": list(self.delete_volumes),
            "heartbeat_interval_seconds": self.heartbeat_interval_seconds,
        }
        if self.lease_seconds is not None:
            out["lease_seconds"] = self.lease_seconds
        if self.validation is not None:
            out["validation"] = self.validation
        if self.lookup_accounts:
            out["lookup_accounts"] = list(self.lookup_accounts)
        if self.mig_layouts:
            out["mig_layouts"] = [layout.to_wire() for layout in self.mig_layouts]
        return out

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> HeartbeatReply:
        if not isinstance(data, dict) or not isinstance(data.get("status"), str):
            raise ValueError("a heartbeat's answer must be an object with a status")
        interval = data.get("heartbeat_interval_seconds")
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or interval <= 0:
            raise ValueError("heartbeat_interval_seconds must be a positive number")
        lease = data.get("lease_seconds")
        if lease is not None and (
            not isinstance(lease, (int, float)) or isinstance(lease, bool) or lease <= 0
        ):
            raise ValueError("lease_seconds must be a positive number")
        revoked = data.get("revoked", False)
        if not isinstance(revoked, bool):
            raise ValueError("revoked must be true or false")
        return cls(
            status=data["status"],
            heartbeat_interval_seconds=interval,
            revoked=revoked,
            cancel=_strings(data, "cancel") or (),
            drain=_optional(data, "drain", dict),
            delete_volumes=_strings(data, "delete_volumes") or (),
            lease_seconds=lease,
            validation=_optional(data, "validation", dict),
            lookup_accounts=_strings(data, "lookup_accounts") or (),
            mig_layouts=mig_list_from_wire(
                data.get("mig_layouts"), "mig_layouts", MigLayout, MAX_MIG_LAYOUTS
            ),
        )
