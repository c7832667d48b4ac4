"""Registration on the wire, defined once (docs/api.md "Agent protocol"): what fleet-agent sends
with a join token (Registration) and what fleetd answers (Registered). Each side builds its own
message as one of these and reads the other's with `from_wire` (ValueError names the bad field);
fleetd's API schema checks the request's values first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fleetwire.checks import is_int
from fleetwire.topology import Topology


def _text(data: dict[str, Any], name: str, required: bool = True) -> str:
    value = data.get(name)
    if not isinstance(value, str) or (required and not value):
        raise ValueError(f"{name} must be a{' non-empty' if required else ''} string")
    return value


def _count(data: dict[str, Any], name: str) -> int:
    value = data.get(name)
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer")
    return value


@dataclasses.dataclass(frozen=True)
class Resources:
    """What the host has besides its GPUs."""

    cpu_count: int
    memory_bytes: int
    container_runtime: str | None = None  # podman | docker | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "cpu_count": self.cpu_count,
            "memory_bytes": self.memory_bytes,
            "container_runtime": self.container_runtime,
        }

    @classmethod
    def from_wire(cls, data: Any) -> Resources:
        if not isinstance(data, dict):
            raise ValueError("resources must be an object")
        runtime = data.get("container_runtime")
        if runtime is not None and not isinstance(runtime, str):
            raise ValueError("resources.container_runtime must be a string or null")
        return cls(
            cpu_count=_count(data, "cpu_count"),
            memory_bytes=_count(data, "memory_bytes"),
            container_runtime=runtime,
        )


@dataclasses.dataclass(frozen=True)
class Registration:
    """A host asking to enrol (or to enrol again: the same machine_id gets its old node)."""

    hostname: str
    machine_id: str
    agent_version: str
    address: str
    resources: Resources
    gpus: tuple[dict[str, Any], ...]  # as the heartbeat reports them
    labels: dict[str, str] = dataclasses.field(
        default_factory=dict
    )  # the agent's own (its config file)
    capabilities: dict[str, Any] | None = None  # as in heartbeats
    # How its GPUs and NICs connect (None: the agent could not read it, or is older); it changes
    # only with the hardware, so heartbeats do not carry it: a registration again updates it.
    topology: Topology | None = None

    def to_wire(self) -> dict[str, Any]:
        out = {
            "hostname": self.hostname,
            "machine_id": self.machine_id,
            "agent_version": self.agent_version,
            "address": self.address,
            "labels": dict(self.labels),
            "resources": self.resources.to_wire(),
            "gpus": list(self.gpus),
        }
        if self.capabilities is not None:
            out["capabilities"] = self.capabilities
        if self.topology is not None:
            out["topology"] = self.topology.to_wire()
        return out

    @classmethod
    def from_wire(cls, data: Any) -> Registration:
        if not isinstance(data, dict):
            raise ValueError("a registration must be an object")
        gpus = data.get("gpus")
        if not isinstance(gpus, list) or not all(isinstance(gpu, dict) for gpu in gpus):
            raise ValueError("gpus must be a list of objects")
        labels = data.get("labels") or {}
        if not isinstance(labels, dict):
            raise ValueError("labels must be an object")
        capabilities = data.get("capabilities")
        if capabilities is not None and not isinstance(capabilities, dict):
            raise ValueError("capabilities must be an object or null")
        topology = data.get("topology")
        return cls(
            hostname=_text(data, "hostname"),
            machine_id=_text(data, "machine_id"),
            agent_version=_text(data, "agent_version", required=False),
            address=_text(data, "address", required=False),
            resources=Resources.from_wire(data.get("resources")),
            gpus=tuple(gpus),
            labels=dict(labels),
            capabilities=capabilities,
            topology=None
            if topology is None
            else Topology.from_wire(topology, [str(gpu.get("uuid")) for gpu in gpus]),
        )


@dataclasses.dataclass(frozen=True)
class Registered:
    """fleetd's answer to a registration: the node and its session (the secret, shown only here)."""

    node_id: str
    fleet: str
    session_token: str
    heartbeat_interval_seconds: float

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, data: Any) -> Registered:
        if not isinstance(data, dict):
            raise ValueError("a registration's answer must be an object")
        interval = data.get("heartbeat_interval_seconds")
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or interval <= 0:
            raise ValueError("heartbeat_interval_seconds must be a positive number")
        return cls(
            node_id=_text(data, "node_id"),
            fleet=_text(data, "fleet"),
            session_token=_text(data, "session_token"),
            heartbeat_interval_seconds=interval,
        )
