"""The assignment on the wire: its validation, and the environment and paths a task gets from it."""

import dataclasses
import os
import re
import socket

from agent.task.errors import TaskError

TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GPU_UUID_RE = re.compile(r"^[A-Za-z0-9._:/-]+$")
INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
RESTART_POLICIES = ("always", "on-failure", "never")
PORT_PROTOCOLS = ("http", "tcp")
MAX_INSTANCE_PORTS = 32
# What a task inherits from the agent's own environment; nothing else (no FLEET_AGENT_* secrets).
PASSTHROUGH_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "HOME", "USER", "LOGNAME", "SHELL")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class InstanceSpec:
    """The `instance` of an instance run's assignment (a long-running reserved workload)."""

    id: str
    name: str
    restart: str  # always | on-failure | never
    ports: tuple  # ((port, protocol), ...)
    volume_bytes: int
    volume_mount_path: str
    image: str | None
    idle_below_percent: float | None  # idle_stop.gpu_util_below_percent
    idle_for_seconds: float | None  # idle_stop.for_seconds

    @classmethod
    def from_wire(cls, data):
        """Validate an assignment's `instance` object; ValueError names the bad field."""
        if not isinstance(data, dict):
            raise ValueError("instance must be an object")
        instance_id = data.get("id")
        if not isinstance(instance_id, str) or not INSTANCE_ID_RE.match(instance_id) or instance_id in (".", ".."):
            raise ValueError("instance.id must be 1-128 letters, digits or ._:- (not . or ..)")
        restart = data.get("restart") or "on-failure"
        if restart not in RESTART_POLICIES:
            raise ValueError("instance.restart must be always, on-failure or never")
        ports = cls._ports(data.get("ports") or [])
        volume_bytes = data.get("volume_bytes") or 0
        if not _is_int(volume_bytes) or volume_bytes < 0:
            raise ValueError("instance.volume_bytes must be a non-negative integer")
        mount = data.get("volume_mount_path") or "/workspace"
        if not isinstance(mount, str) or not mount.startswith("/") or any(c in mount for c in ":,\0\n"):
            raise ValueError("instance.volume_mount_path must be an absolute path without ':' or ','")
        image = data.get("image")
        if image is not None and (not isinstance(image, str) or not image.strip() or image.startswith("-")
                                  or any(c.isspace() or c == "\0" for c in image)):
            raise ValueError("instance.image must be an image reference")
        below, for_seconds = cls._idle_stop(data.get("idle_stop"))
        return cls(id=instance_id, name=str(data.get("name") or instance_id)[:128], restart=restart, ports=ports,
                   volume_bytes=volume_bytes, volume_mount_path=mount, image=image or None,
                   idle_below_percent=below, idle_for_seconds=for_seconds)

    @staticmethod
    def _ports(ports):
        if not isinstance(ports, list) or len(ports) > MAX_INSTANCE_PORTS:
            raise ValueError(f"instance.ports must be a list of at most {MAX_INSTANCE_PORTS}")
        out = []
        for item in ports:
            port = item.get("port") if isinstance(item, dict) else None
            protocol = (item.get("protocol") or "tcp") if isinstance(item, dict) else None
            if not _is_int(port) or not 1 <= port <= 65535 or protocol not in PORT_PROTOCOLS:
                raise ValueError("instance.ports must be [{port (1-65535), protocol (http or tcp)}]")
            out.append((port, protocol))
        if len({port for port, _ in out}) != len(out):
            raise ValueError("instance.ports must not declare a port twice")
        return tuple(out)

    @staticmethod
    def _idle_stop(idle):
        if idle is None:
            return None, None
        below = idle.get("gpu_util_below_percent") if isinstance(idle, dict) else None
        for_seconds = idle.get("for_seconds") if isinstance(idle, dict) else None
        if not _is_number(below) or not 0 < below <= 100 or not _is_number(for_seconds) or for_seconds <= 0:
            raise ValueError("instance.idle_stop must be {gpu_util_below_percent (0-100], for_seconds (> 0)}")
        return float(below), float(for_seconds)


@dataclasses.dataclass
class Assignment:
    """An Assignment (docs/api.md "Assignment"), validated."""

    task_id: str
    job_id: str
    epoch: int
    rank: int
    num_nodes: int
    command: list
    env: dict
    workdir: str
    gpus: list
    isolation: str
    max_runtime_seconds: float
    artifacts: list
    priority_class: str = "on-demand"
    bid: float | None = None
    cpus: float | None = None  # host CPU limit (cgroup v2 cpu.max) from the JobSpec
    memory_bytes: int | None = None  # host memory limit (cgroup v2 memory.max) from the JobSpec
    instance: InstanceSpec | None = None  # an instance run's extra terms; None for a batch task

    @classmethod
    def from_wire(cls, data):
        """Validate an Assignment dict; ValueError names the bad field."""
        if not isinstance(data, dict):
            raise ValueError("assignment must be an object")
        task_id = data.get("task_id")
        if not isinstance(task_id, str) or not TASK_ID_RE.match(task_id):
            raise ValueError("task_id must be 1-128 letters, digits or ._:-")
        epoch = data.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError("epoch must be a non-negative integer")
        num_nodes = data.get("num_nodes") or 1
        rank = data.get("rank") or 0
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (num_nodes, rank)) \
                or num_nodes < 1 or not 0 <= rank < num_nodes:
            raise ValueError("rank and num_nodes must be integers with 0 <= rank < num_nodes")
        instance = None if data.get("instance") is None else InstanceSpec.from_wire(data["instance"])
        command = data.get("command")
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command) \
                or any("\0" in a for a in command) or not (command or (instance and instance.image)):
            raise ValueError("command must be a non-empty list of strings (empty only for an instance with an image)")
        env = data.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and ENV_NAME_RE.match(k) for k in env):
            raise ValueError("env must map variable names to values")
        env = {k: "" if v is None else str(v) for k, v in env.items()}
        if any("\0" in v for v in env.values()):
            raise ValueError("env values must not contain NUL")
        gpus = data.get("gpus") or []
        if not isinstance(gpus, list) or not all(isinstance(g, dict) and isinstance(g.get("uuid"), str)
                                                  and GPU_UUID_RE.match(g["uuid"]) for g in gpus):
            raise ValueError("gpus must be a list of {uuid, ...}")
        max_runtime = data.get("max_runtime_seconds")
        if max_runtime is not None and (isinstance(max_runtime, bool) or not isinstance(max_runtime, (int, float))
                                        or max_runtime <= 0):
            raise ValueError("max_runtime_seconds must be a positive number")
        artifacts = data.get("artifacts") or []
        if not isinstance(artifacts, list):
            raise ValueError("artifacts must be a list")
        for item in artifacts:
            if not isinstance(item, dict) or not isinstance(item.get("sha256"), str) \
                    or not SHA256_RE.match(item["sha256"]) or not isinstance(item.get("path"), str):
                raise ValueError("artifacts must be [{sha256 (64 lowercase hex digits), path}]")
        workdir = data.get("workdir") or ""
        if not isinstance(workdir, str):
            raise ValueError("workdir must be a string")
        numbers = {}
        for name, kind in (("bid", (int, float)), ("cpus", (int, float)), ("memory_bytes", (int,))):
            value = data.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind) or value < 0):
                raise ValueError(f"{name} must be a non-negative number")
            numbers[name] = value if name == "bid" else (value or None)
        return cls(task_id=task_id, job_id=str(data.get("job_id") or ""), epoch=epoch, rank=rank,
                   num_nodes=num_nodes, command=list(command), env=env, workdir=workdir,
                   gpus=[dict(g) for g in gpus], isolation=str(data.get("isolation") or "exclusive"),
                   max_runtime_seconds=max_runtime, artifacts=[dict(a) for a in artifacts],
                   priority_class=str(data.get("priority_class") or "on-demand"), instance=instance, **numbers)


def inside(root, relative, what, allow_root=False):
    """`root`/`relative` for a relative path that stays inside `root` (symlinks resolved); TaskError otherwise."""
    if not relative or "\0" in relative or os.path.isabs(relative):
        raise TaskError(f"{what} {relative!r} must be a relative path inside the task's working directory")
    if ".." in relative.split("/"):
        raise TaskError(f"{what} {relative!r} must not contain '..'")
    path = os.path.normpath(os.path.join(root, relative))
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root \
            or (path == os.path.normpath(root) and not allow_root):
        raise TaskError(f"{what} {relative!r} leaves the task's working directory")
    return path


def task_env(assignment, master_addr, master_port, environ=None, extra=None):
    """(the task's whole environment, the variables the agent injected).

    The spec's env goes over a small passthrough of the agent's own; the injected variables go
    over both, so a spec cannot widen its GPUs or fake its rank. `extra` are the limits'
    variables (MPS); NVIDIA_VISIBLE_DEVICES carries the same UUIDs for nested containers
    ("none" without GPUs).
    """
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in PASSTHROUGH_ENV if k in environ}
    env.setdefault("PATH", DEFAULT_PATH)
    env["PYTHONUNBUFFERED"] = "1"  # Python tasks' output reaches the log as it is printed
    env.update(assignment.env)
    uuids = [g["uuid"] for g in assignment.gpus]
    injected = {
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        "NVIDIA_VISIBLE_DEVICES": ",".join(uuids) or "none",
        "FLEET_JOB_ID": assignment.job_id,
        "FLEET_TASK_ID": assignment.task_id,
        "FLEET_TASK_EPOCH": str(assignment.epoch),
        "FLEET_NODE_RANK": str(assignment.rank),
        "FLEET_NUM_NODES": str(assignment.num_nodes),
        "FLEET_GPUS_PER_NODE": str(len(uuids)),
        "FLEET_MASTER_ADDR": master_addr,
        "FLEET_MASTER_PORT": str(master_port),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(assignment.num_nodes),
        "NODE_RANK": str(assignment.rank),
    }
    injected.update(extra or {})
    env.update(injected)
    return env, injected


def free_port(address):
    """A TCP port free now on `address` (or on every address when `address` cannot be bound)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            sock.bind(("::" if family == socket.AF_INET6 else "", 0))
        return sock.getsockname()[1]
