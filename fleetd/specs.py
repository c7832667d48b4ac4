"""Typed specs: what a submitter asks for, as frozen dataclasses.

The schema layer (fleetd.schemas) validates a request body and makes one of these; everything
below it reads attributes, never a dict. A spec is stored as its JSON form (`to_dict()`, the shape
docs/api.md shows) and read back with `from_dict()`.

A job's group key (jobs whose requests are equal get one answer from the scheduler) is computed
here from named fields with a version, so a new field or a change of representation elsewhere
never changes a stored key by accident.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from fleetd import scheduler

RETRY_ON = ("node_lost", "preempted", "failed")
DEFAULT_MOUNT = "/workspace"
# Bump when the fields below change meaning: keys stored before then stop matching, so their jobs
# are read by every pass (as jobs without a key are) until they leave the queue.
GROUP_KEY_VERSION = 5  # 2: owner, host_ports, mps and image; 3: topology; 4: same_block; 5: mig


def _plain(mapping: Mapping[str, str] | None) -> dict[str, str]:
    """A copy as a plain dict (what a spec holds and stores)."""
    return dict(mapping or {})


@dataclasses.dataclass(frozen=True)
class Resources:
    """What each rank (or an instance's run) holds: GPUs (whole, or a fraction of one), a slice's
    memory and compute, GPU models accepted, host CPUs and memory."""

    gpus: float = 0
    gpu_memory_bytes: int | None = None
    gpu_compute_percent: float | None = None
    gpu_types: tuple[str, ...] = ()
    cpus: float = 0
    memory_bytes: int = 0
    pids: int | None = (
        None  # the most processes and threads (None: the fleet's task_pids_max); not reserved
    )
    # "required" or "preferred" (an aligned GPU set, scheduler/topology.py); None: not given, which
    # is preferred
    topology: str | None = None
    mig: str | None = None  # a MIG profile (fleetwire.mig): gpus is then its MIG devices

    @property
    def topology_mode(self) -> str:
        """The topology mode in force (preferred when none was given)."""
        return self.topology or scheduler.TOPOLOGY_PREFERRED

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Resources:
        data = data or {}
        return cls(
            gpus=data.get("gpus") or 0,
            gpu_memory_bytes=data.get("gpu_memory_bytes"),
            gpu_compute_percent=data.get("gpu_compute_percent"),
            gpu_types=tuple(data.get("gpu_types") or ()),
            cpus=data.get("cpus") or 0,
            memory_bytes=data.get("memory_bytes") or 0,
            pids=data.get("pids"),
            topology=data.get("topology"),
            mig=data.get("mig"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gpus": self.gpus,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "gpu_compute_percent": self.gpu_compute_percent,
            "gpu_types": list(self.gpu_types),
            "cpus": self.cpus,
            "memory_bytes": self.memory_bytes,
        }
        if self.pids is not None:  # optional (docs/api.md): specs stored before it read as before
            out["pids"] = self.pids
        if self.topology is not None:  # optional, as pids
            out["topology"] = self.topology
        if self.mig is not None:
            out["mig"] = self.mig
        return out


def _selector_from_dict(data: Mapping[str, Any] | None) -> scheduler.NodeSelector:
    data = data or {}
    return scheduler.NodeSelector(
        fleet=data.get("fleet"),
        labels=_plain(data.get("labels")),
        node_id=data.get("node_id"),
        container=bool(data.get("container")),
        image=data.get("image"),
    )


def _selector_to_dict(selector: scheduler.NodeSelector) -> dict[str, Any]:
    out: dict[str, Any] = {"fleet": selector.fleet, "labels": dict(selector.labels)}
    if selector.node_id is not None:
        out["node_id"] = selector.node_id
    if selector.container:
        out["container"] = True
    if selector.image is not None:
        out["image"] = selector.image
    return out


@dataclasses.dataclass(frozen=True)
class Retry:
    """How often a job runs again, and after which kinds of end."""

    max_attempts: int
    on: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Retry:
        return cls(max_attempts=data["max_attempts"], on=tuple(data.get("on") or ()))

    def to_dict(self) -> dict[str, Any]:
        return {"max_attempts": self.max_attempts, "on": list(self.on)}


DEFAULT_RETRY = Retry(max_attempts=3, on=("node_lost", "preempted"))
NO_RETRY = Retry(max_attempts=1, on=())


@dataclasses.dataclass(frozen=True)
class ArtifactRef:
    """An uploaded artifact (by its sha256) placed at a relative path of the task's directory."""

    sha256: str
    path: str

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "path": self.path}


@dataclasses.dataclass(frozen=True)
class Port:
    """A port an instance's process listens on, and how clients speak to it."""

    port: int
    protocol: str = "http"

    def to_dict(self) -> dict[str, Any]:
        return {"port": self.port, "protocol": self.protocol}


@dataclasses.dataclass(frozen=True)
class IdleStop:
    """Stop an instance whose GPU utilisation stayed under a threshold for a while."""

    gpu_util_below_percent: float
    for_seconds: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_util_below_percent": self.gpu_util_below_percent,
            "for_seconds": self.for_seconds,
        }


def _idle_stop(data: Mapping[str, Any] | None) -> IdleStop | None:
    return IdleStop(data["gpu_util_below_percent"], data["for_seconds"]) if data else None


@dataclasses.dataclass(frozen=True)
class RunOfInstance:
    """What the agent needs to supervise one run of an instance (the Assignment's `instance`)."""

    restart: str = "on-failure"
    ports: tuple[Port, ...] = ()
    volume_bytes: int = 0
    volume_mount_path: str = DEFAULT_MOUNT
    image: str | None = None
    idle_stop: IdleStop | None = None
    scratch_bytes: int = 0  # the most its scratch space may hold (0: no limit)
    runtime_args: tuple[str, ...] = ()  # extra container runtime arguments (fleetwire's allow-list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunOfInstance:
        return cls(
            restart=data.get("restart") or "on-failure",
            ports=tuple(
                Port(p["port"], p.get("protocol", "http")) for p in data.get("ports") or ()
            ),
            volume_bytes=data.get("volume_bytes") or 0,
            volume_mount_path=data.get("volume_mount_path") or DEFAULT_MOUNT,
            image=data.get("image"),
            idle_stop=_idle_stop(data.get("idle_stop")),
            scratch_bytes=data.get("scratch_bytes") or 0,
            runtime_args=tuple(data.get("runtime_args") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "restart": self.restart,
            "ports": [p.to_dict() for p in self.ports],
            "volume_bytes": self.volume_bytes,
            "volume_mount_path": self.volume_mount_path,
            "image": self.image,
            "idle_stop": self.idle_stop.to_dict() if self.idle_stop else None,
            "scratch_bytes": self.scratch_bytes,
            "runtime_args": list(self.runtime_args),
        }


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A job as submitted (POST /api/v1/jobs), or one run of an instance (`instance` set)."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    workdir: str | None = None
    num_nodes: int = 1
    resources: Resources = Resources()
    isolation: str | None = None
    priority_class: str = "on-demand"
    bid: float | None = None
    team: str | None = None
    project: str | None = None  # its project's key (None: the submitter's default project)
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    node_selector: scheduler.NodeSelector = scheduler.NodeSelector()
    max_runtime_seconds: int | None = None
    retry: Retry | None = None
    artifacts: tuple[ArtifactRef, ...] = ()
    instance: RunOfInstance | None = None
    output_cap_bytes: int | None = None  # None: its fleet's output_cap_bytes
    # `network.same_block`: "required" or "preferred" for a gang (scheduler/network.py); None: not
    # given, which is preferred
    same_block: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec of a validated body, or of a stored row."""
        retry = data.get("retry")
        instance = data.get("instance")
        return cls(
            name=data["name"],
            command=tuple(data.get("command") or ()),
            env=_plain(data.get("env")),
            workdir=data.get("workdir"),
            num_nodes=data.get("num_nodes") or 1,
            resources=Resources.from_dict(data.get("resources")),
            isolation=data.get("isolation"),
            priority_class=data.get("priority_class") or "on-demand",
            bid=data.get("bid"),
            team=data.get("team"),
            project=data.get("project"),
            labels=_plain(data.get("labels")),
            node_selector=_selector_from_dict(data.get("node_selector")),
            max_runtime_seconds=data.get("max_runtime_seconds"),
            retry=Retry.from_dict(retry) if retry else None,
            artifacts=tuple(
                ArtifactRef(a["sha256"], a["path"]) for a in data.get("artifacts") or ()
            ),
            instance=RunOfInstance.from_dict(instance) if instance is not None else None,
            output_cap_bytes=data.get("output_cap_bytes"),
            same_block=(data.get("network") or {}).get("same_block"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: stored with the job and shown as its `spec`."""
        out = {
            "name": self.name,
            "command": list(self.command),
            "env": dict(self.env),
            "workdir": self.workdir,
            "num_nodes": self.num_nodes,
            "resources": self.resources.to_dict(),
            "isolation": self.isolation,
            "priority_class": self.priority_class,
            "bid": self.bid,
            "team": self.team,
            "labels": dict(self.labels),
            "node_selector": _selector_to_dict(self.node_selector),
            "max_runtime_seconds": self.max_runtime_seconds,
            "retry": self.retry.to_dict() if self.retry else None,
            "artifacts": [a.to_dict() for a in self.artifacts],
        }
        if self.project is not None:  # as the body named it; the job's `project` is where it landed
            out["project"] = self.project
        if self.instance is not None:
            out["instance"] = self.instance.to_dict()
        if self.output_cap_bytes is not None:  # stored specs without it stay as they were
            out["output_cap_bytes"] = self.output_cap_bytes
        if self.same_block is not None:  # optional, as output_cap_bytes
            out["network"] = {"same_block": self.same_block}
        return out

    @property
    def retry_policy(self) -> Retry:
        """The retry rule in force: the spec's, else the default."""
        return self.retry or DEFAULT_RETRY

    def task_request(self, owner: str = "", account: str = "") -> scheduler.TaskRequest:
        """The engine's request (as `owner`'s, where the answer depends on who asks: the host ports
        a new instance takes, MPS slices; `account`: the owner's login, where a fleet runs tasks as
        their owners' own accounts); ValueError when the engine cannot evaluate it."""
        res = self.resources
        request = scheduler.TaskRequest(
            gpus=res.gpus,
            num_nodes=self.num_nodes,
            gpu_memory_bytes=res.gpu_memory_bytes,
            gpu_compute_percent=res.gpu_compute_percent,
            gpu_types=res.gpu_types,
            cpus=res.cpus,
            memory_bytes=res.memory_bytes,
            node_selector=self.node_selector,
            priority_class=self.priority_class,
            bid=self.bid,
            name=self.name,
            topology=res.topology_mode,
            same_block=self.same_block or scheduler.TOPOLOGY_PREFERRED,
            mig=res.mig,
        )
        # A resumed run's ports are already held on the node that keeps its volume.
        ports = (
            len(self.instance.ports)
            if self.instance is not None and self.node_selector.node_id is None
            else 0
        )
        mps = self.isolation == "mps" and request.shared
        if ports or mps:
            request = dataclasses.replace(request, owner=owner, host_ports=ports, mps=mps)
        if account:
            request = dataclasses.replace(request, account=account)
        return request


@dataclasses.dataclass(frozen=True)
class InstanceSpec:
    """An instance as created (POST /api/v1/instances); `team` is its token's."""

    name: str
    command: tuple[str, ...] = ()
    image: str | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    resources: Resources = Resources()
    volume_bytes: int = 0
    volume_mount_path: str = DEFAULT_MOUNT
    ports: tuple[Port, ...] = ()
    priority_class: str = "on-demand"
    bid: float | None = None
    node_selector: scheduler.NodeSelector = scheduler.NodeSelector()
    restart: str = "on-failure"
    idle_stop: IdleStop | None = None
    team: str | None = None
    scratch_bytes: int = 0
    runtime_args: tuple[str, ...] = ()
    project: str | None = None  # its project's key (None: the creator's default project)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InstanceSpec:
        """The spec of a validated body, or of a stored row."""
        return cls(
            name=data["name"],
            command=tuple(data.get("command") or ()),
            image=data.get("image"),
            env=_plain(data.get("env")),
            resources=Resources.from_dict(data.get("resources")),
            volume_bytes=data.get("volume_bytes") or 0,
            volume_mount_path=data.get("volume_mount_path") or DEFAULT_MOUNT,
            ports=tuple(
                Port(p["port"], p.get("protocol", "http")) for p in data.get("ports") or ()
            ),
            priority_class=data.get("priority_class") or "on-demand",
            bid=data.get("bid"),
            node_selector=_selector_from_dict(data.get("node_selector")),
            restart=data.get("restart") or "on-failure",
            idle_stop=_idle_stop(data.get("idle_stop")),
            team=data.get("team"),
            scratch_bytes=data.get("scratch_bytes") or 0,
            runtime_args=tuple(data.get("runtime_args") or ()),
            project=data.get("project"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: stored with the instance and shown as its `spec`."""
        res = self.resources
        return {
            "name": self.name,
            "command": list(self.command),
            "image": self.image,
            "env": dict(self.env),
            "resources": {
                "gpus": res.gpus,
                "gpu_types": list(res.gpu_types),
                "cpus": res.cpus,
                "memory_bytes": res.memory_bytes,
                **({"pids": res.pids} if res.pids is not None else {}),
                **({"topology": res.topology} if res.topology is not None else {}),
                **({"mig": res.mig} if res.mig is not None else {}),
                # optional, as pids: specs stored before it read as before
                **(
                    {"gpu_memory_bytes": res.gpu_memory_bytes}
                    if res.gpu_memory_bytes is not None
                    else {}
                ),
            },
            "volume_bytes": self.volume_bytes,
            "volume_mount_path": self.volume_mount_path,
            "ports": [p.to_dict() for p in self.ports],
            "priority_class": self.priority_class,
            "bid": self.bid,
            "node_selector": _selector_to_dict(self.node_selector),
            "restart": self.restart,
            "idle_stop": self.idle_stop.to_dict() if self.idle_stop else None,
            "team": self.team,
            "scratch_bytes": self.scratch_bytes,
            "runtime_args": list(self.runtime_args),
            **({"project": self.project} if self.project is not None else {}),
        }

    def run(self, node_id: str | None) -> JobSpec:
        """The spec of one run (held to `node_id`, the node that keeps its volume, when set)."""
        selector = dataclasses.replace(
            self.node_selector,
            node_id=node_id,
            container=bool(self.image) or self.node_selector.container,
            image=self.image or None,
        )
        res = self.resources
        return JobSpec(
            name=self.name,
            command=self.command,
            env=self.env,
            num_nodes=1,
            team=self.team,
            resources=Resources(
                gpus=res.gpus,
                gpu_types=res.gpu_types,
                cpus=res.cpus,
                memory_bytes=res.memory_bytes,
                pids=res.pids,
                gpu_memory_bytes=res.gpu_memory_bytes,
                topology=res.topology,
                mig=res.mig,
            ),
            priority_class=self.priority_class,
            bid=self.bid,
            node_selector=selector,
            retry=NO_RETRY,
            instance=RunOfInstance(
                restart=self.restart,
                ports=self.ports,
                volume_bytes=self.volume_bytes,
                volume_mount_path=self.volume_mount_path,
                image=self.image,
                idle_stop=self.idle_stop,
                scratch_bytes=self.scratch_bytes,
                runtime_args=self.runtime_args,
            ),
        )


class Group(NamedTuple):
    """The fields that decide what the scheduler answers for a job: jobs with equal groups get the
    same answer from the scheduling rules and the engine."""

    gpus: float
    num_nodes: int
    gpu_memory_bytes: int | None
    gpu_compute_percent: float | None
    gpu_types: tuple[str, ...]
    cpus: float
    memory_bytes: int
    fleet: str | None
    labels: tuple[tuple[str, str], ...]
    node_id: str | None
    container: bool
    team: str
    priority_class: str
    bid: float | None
    image: str | None
    owner: str  # "" unless the answer depends on who asks
    host_ports: int
    mps: bool
    topology: str
    same_block: str
    mig: str | None = None  # a MIG profile (group key version 5)


def group_of(
    request: scheduler.TaskRequest, team: str | None, priority_class: str, bid: float | None
) -> Group:
    """The group of a job with this request, team, class and bid."""
    selector = request.node_selector
    return Group(
        gpus=request.gpus,
        num_nodes=request.num_nodes,
        gpu_memory_bytes=request.gpu_memory_bytes,
        gpu_compute_percent=request.gpu_compute_percent,
        gpu_types=tuple(request.gpu_types),
        cpus=request.cpus,
        memory_bytes=request.memory_bytes,
        fleet=selector.fleet,
        labels=tuple(sorted(selector.labels.items())),
        node_id=selector.node_id,
        container=selector.container,
        team=team or "",
        priority_class=priority_class,
        bid=bid,
        image=selector.image,
        owner=request.owner or request.account,
        host_ports=request.host_ports,
        mps=request.mps,
        topology=request.topology,
        same_block=request.same_block,
        mig=request.mig,
    )


def group_key(group: Group) -> str:
    """A group as a short text stored on the job (Job.group_key): a hash of its named fields and
    GROUP_KEY_VERSION in canonical JSON, so equal groups have equal keys in every process."""
    text = json.dumps(
        {"version": GROUP_KEY_VERSION, **group._asdict()}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()
