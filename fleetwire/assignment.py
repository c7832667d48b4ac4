"""The Assignment on the wire, defined once: what fleetd sends in an acquire's answer (docs/api.md
"Assignment") and what fleet-agent accepts, validated field by field (ValueError names the bad
one). fleetd's tests check every assignment it hands out against it; the agent runs only what
passes it.
"""

import dataclasses
import re
from typing import Any

from fleetwire.checks import is_int, is_number
from fleetwire.mig import MIG_UUID
from fleetwire.output import MAX_OUTPUT_CAP_BYTES, MIN_OUTPUT_CAP_BYTES

TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GPU_UUID_RE = re.compile(r"^[A-Za-z0-9._:/-]+$")
INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
RESTART_POLICIES = ("always", "on-failure", "never")
# The container runtime arguments an instance may add (`runtime_args`), each one `--flag[=value]`
# token: nothing that reaches the host (devices, mounts, namespaces, capabilities, users, security
# options, the network) is among them. The agent puts them before its own flags, so that its own
# (--user, --cap-drop, the ulimits it sets) win.
RUNTIME_ARGS = {
    "--shm-size": re.compile(r"^[1-9][0-9]{0,12}[kmg]?$"),  # /dev/shm's size: 1g, 512m
    "--ulimit": re.compile(r"^(memlock|stack|core)=(-1|[0-9]{1,19})(:(-1|[0-9]{1,19}))?$"),
    "--init": None,  # an init process that reaps zombies
    "--workdir": re.compile(r"^(/(?!\.\.(?:/|$))[A-Za-z0-9._@+-]*)+$"),
    "--entrypoint": re.compile(r"^(/(?!\.\.(?:/|$))[A-Za-z0-9._@+-]*)+$"),
    "--hostname": re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"),
}
MAX_RUNTIME_ARGS = 16
# /dev/shm is a tmpfs: its pages are memory, charged to the container's memory limit. Its size is at
# most the instance's `resources.memory_bytes` where the spec sets one (fleetd's schema checks that)
# and never more than this, whatever the host.
MAX_SHM_BYTES = 1024**4  # 1 TiB
_SIZE_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3}
# The allow-list as one pattern (ECMAScript and Python alike), for documents that describe the
# field.
RUNTIME_ARG_PATTERN = (
    "^("
    + "|".join(
        flag if value is None else f"{flag}=({value.pattern.removeprefix('^').removesuffix('$')})"
        for flag, value in RUNTIME_ARGS.items()
    )
    + ")$"
)


def runtime_arg_error(arg):
    """Why `arg` is not an allowed container runtime argument, or None when it is."""
    if not isinstance(arg, str):
        return "a runtime argument must be a string"
    flag, sep, value = arg.partition("=")
    if flag not in RUNTIME_ARGS:
        return (
            f"{arg[:64]!r} is not allowed; allowed: {', '.join(sorted(RUNTIME_ARGS))} (as "
            f"--flag=value)"
        )
    pattern = RUNTIME_ARGS[flag]
    if pattern is None:
        return None if not sep else f"{flag} takes no value"
    if not sep or not pattern.fullmatch(value):
        return f"{flag}=VALUE: {value[:64]!r} is not a value it takes"
    if flag == "--shm-size" and shm_size_bytes(value) > MAX_SHM_BYTES:
        return f"--shm-size={value[:64]} is more than {MAX_SHM_BYTES // 1024**3}g"
    return None


def shm_size_bytes(value):
    """The bytes of a --shm-size value its pattern took (`512m`: 512 MiB; no unit: bytes)."""
    unit = _SIZE_UNITS.get(value[-1:], 1)
    return int(value[:-1] if unit > 1 else value) * unit


PORT_PROTOCOLS = ("http", "tcp")
MAX_INSTANCE_PORTS = 32
# A task's pid limit (`pids`: processes and threads, as cgroup v2 pids.max and RLIMIT_NPROC count
# them): at least a few, for the agent's shell that records the exit status and the task's first
# processes, at most the kernel's own ceiling (PID_MAX_LIMIT on 64-bit).
MIN_TASK_PIDS = 16
MAX_TASK_PIDS = 4 * 1024 * 1024
MAX_TASK_PATH = 4096  # characters of a task's PATH
# A task's PATH: absolute directories separated by ':', no empty entry (the working directory).
TASK_PATH_RE = re.compile(r"^/[^:\x00-\x1f]*(:/[^:\x00-\x1f]*)*$")


@dataclasses.dataclass(frozen=True)
class AssignedInstance:
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
    scratch_bytes: int = 0  # the most its scratch space may hold (0: no limit)
    runtime_args: tuple = ()  # extra container runtime arguments, each allowed (runtime_arg_error)

    @classmethod
    def from_wire(cls, data):
        """Validate an assignment's `instance` object; ValueError names the bad field."""
        if not isinstance(data, dict):
            raise ValueError("instance must be an object")
        instance_id = data.get("id")
        if (
            not isinstance(instance_id, str)
            or not INSTANCE_ID_RE.fullmatch(instance_id)
            or instance_id in (".", "..")
        ):
            raise ValueError("instance.id must be 1-128 letters, digits or ._:- (not . or ..)")
        restart = data.get("restart") or "on-failure"
        if restart not in RESTART_POLICIES:
            raise ValueError("instance.restart must be always, on-failure or never")
        ports = cls._ports(data.get("ports") or [])
        volume_bytes = data.get("volume_bytes") or 0
        if not is_int(volume_bytes) or volume_bytes < 0:
            raise ValueError("instance.volume_bytes must be a non-negative integer")
        mount = data.get("volume_mount_path") or "/workspace"
        if (
            not isinstance(mount, str)
            or not mount.startswith("/")
            or any(c in mount for c in ":,\0\n")
        ):
            raise ValueError(
                "instance.volume_mount_path must be an absolute path without ':' or ','"
            )
        image = data.get("image")
        if image is not None and (
            not isinstance(image, str)
            or not image.strip()
            or image.startswith("-")
            or any(c.isspace() or c == "\0" for c in image)
        ):
            raise ValueError("instance.image must be an image reference")
        below, for_seconds = cls._idle_stop(data.get("idle_stop"))
        scratch_bytes = data.get("scratch_bytes") or 0
        if not is_int(scratch_bytes) or scratch_bytes < 0:
            raise ValueError("instance.scratch_bytes must be a non-negative integer")
        runtime_args = data.get("runtime_args") or []
        if not isinstance(runtime_args, list) or len(runtime_args) > MAX_RUNTIME_ARGS:
            raise ValueError(f"instance.runtime_args must be a list of at most {MAX_RUNTIME_ARGS}")
        for arg in runtime_args:
            error = runtime_arg_error(arg)
            if error is not None:
                raise ValueError(f"instance.runtime_args: {error}")
        if runtime_args and image is None:
            raise ValueError("instance.runtime_args apply to an image only")
        return cls(
            id=instance_id,
            name=str(data.get("name") or instance_id)[:128],
            restart=restart,
            ports=ports,
            volume_bytes=volume_bytes,
            volume_mount_path=mount,
            image=image or None,
            idle_below_percent=below,
            idle_for_seconds=for_seconds,
            scratch_bytes=scratch_bytes,
            runtime_args=tuple(runtime_args),
        )

    def to_wire(self):
        """The `instance` object as fleetd sends it (from_wire reads it back equal)."""
        idle = (
            None
            if self.idle_below_percent is None
            else {
                "gpu_util_below_percent": self.idle_below_percent,
                "for_seconds": self.idle_for_seconds,
            }
        )
        return {
            "id": self.id,
            "name": self.name,
            "restart": self.restart,
            "ports": [{"port": port, "protocol": protocol} for port, protocol in self.ports],
            "volume_bytes": self.volume_bytes,
            "volume_mount_path": self.volume_mount_path,
            "image": self.image,
            "idle_stop": idle,
            "scratch_bytes": self.scratch_bytes,
            "runtime_args": list(self.runtime_args),
        }

    @staticmethod
    def _ports(ports):
        if not isinstance(ports, list) or len(ports) > MAX_INSTANCE_PORTS:
            raise ValueError(f"instance.ports must be a list of at most {MAX_INSTANCE_PORTS}")
        out = []
        for item in ports:
            port = item.get("port") if isinstance(item, dict) else None
            protocol = (item.get("protocol") or "tcp") if isinstance(item, dict) else None
            if not is_int(port) or not 1 <= port <= 65535 or protocol not in PORT_PROTOCOLS:
                raise ValueError(
                    "instance.ports must be [{port (1-65535), protocol (http or tcp)}]"
                )
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
        if (
            not is_number(below)
            or not 0 < below <= 100
            or not is_number(for_seconds)
            or for_seconds <= 0
        ):
            raise ValueError(
                "instance.idle_stop must be {gpu_util_below_percent (0-100], for_seconds (> 0)}"
            )
        return float(below), float(for_seconds)


RUN_AS_SOURCES = ("unix_user", "nss", "claims", "dynamic", "root")
MAX_RUN_AS_GROUPS = 64  # supplementary groups a claims run_as may name
USER_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
FIRST_USER_UID = 1000  # below: the host's system accounts (daemon is 1, bin 2...)
NOBODY_UID = 65534  # the overflow user, whose files are everyone's unmapped ones


def system_uid_problem(user, uid):
    """Why a token's `unix_user` (`user`, whose uid is `uid`) is a system account that its tasks may
    run as only where the operator allowed it (fleetd's `tokens_allow_system_users`), or None."""
    if uid < FIRST_USER_UID or uid == NOBODY_UID:
        return (
            f"host user {user!r} has uid {uid}, a system account's (below {FIRST_USER_UID}, or "
            f"{NOBODY_UID}): tokens run as such users only where the setting "
            f"tokens_allow_system_users names them"
        )
    return None


def _mig_uuid(value):
    return isinstance(value, str) and MIG_UUID.fullmatch(value) is not None


def visible_device(grant: dict) -> str:
    """The device a task is given for one of its GPU grants, as CUDA_VISIBLE_DEVICES names it: its
    MIG device (MIG-...) where it holds one, else the whole GPU's uuid."""
    return grant.get("mig_device") or grant["uuid"]


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
    max_runtime_seconds: float | None  # None: no limit
    artifacts: list
    priority_class: str = "on-demand"
    bid: float | None = None
    cpus: float | None = None  # host CPU limit (cgroup v2 cpu.max) from the JobSpec
    memory_bytes: int | None = (
        None  # host memory limit (cgroup v2 memory.max): the JobSpec's, else the fleet's
    )
    memory_default: bool = (
        False  # memory_bytes is the fleet's task_memory_default_bytes (the spec set none)
    )
    pids: int | None = (
        None  # the most processes and threads the task may hold (None: fleetd did not say)
    )
    task_path: str | None = (
        None  # the task's PATH, the fleet's (None: fleetd did not say; the agent's default)
    )
    instance: AssignedInstance | None = None  # an instance run's extra terms; None for a batch task
    run_as: dict | None = (
        None  # {source, user, uid, gid}: whom the task runs as (None: fleetd did not say)
    )
    attempt: int = 1  # the job's attempt this task belongs to (its retries count them)
    output_cap_bytes: int | None = None  # the most output the task keeps (None: the default)

    @classmethod
    def from_wire(cls, data):
        """Validate an Assignment dict; ValueError names the bad field."""
        if not isinstance(data, dict):
            raise ValueError("assignment must be an object")
        task_id = data.get("task_id")
        if not isinstance(task_id, str) or not TASK_ID_RE.fullmatch(task_id):
            raise ValueError("task_id must be 1-128 letters, digits or ._:-")
        epoch = data.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError("epoch must be a non-negative integer")
        num_nodes = data.get("num_nodes") or 1
        rank = data.get("rank") or 0
        if (
            not all(isinstance(v, int) and not isinstance(v, bool) for v in (num_nodes, rank))
            or num_nodes < 1
            or not 0 <= rank < num_nodes
        ):
            raise ValueError("rank and num_nodes must be integers with 0 <= rank < num_nodes")
        instance = (
            None if data.get("instance") is None else AssignedInstance.from_wire(data["instance"])
        )
        command = data.get("command")
        if (
            not isinstance(command, list)
            or not all(isinstance(a, str) for a in command)
            or any("\0" in a for a in command)
            or not (command or (instance and instance.image))
        ):
            raise ValueError(
                "command must be a non-empty list of strings (empty only for an instance with an "
                "image)"
            )
        env = data.get("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and ENV_NAME_RE.fullmatch(k) for k in env
        ):
            raise ValueError("env must map variable names to values")
        env = {k: "" if v is None else str(v) for k, v in env.items()}
        if any("\0" in v for v in env.values()):
            raise ValueError("env values must not contain NUL")
        gpus = data.get("gpus") or []
        if not isinstance(gpus, list) or not all(
            isinstance(g, dict)
            and isinstance(g.get("uuid"), str)
            and GPU_UUID_RE.fullmatch(g["uuid"])
            and (g.get("mig_device") is None or _mig_uuid(g["mig_device"]))
            for g in gpus
        ):
            raise ValueError("gpus must be a list of {uuid, mig_device?: MIG-..., ...}")
        max_runtime = data.get("max_runtime_seconds")
        if max_runtime is not None and (
            isinstance(max_runtime, bool)
            or not isinstance(max_runtime, (int, float))
            or max_runtime <= 0
        ):
            raise ValueError("max_runtime_seconds must be a positive number")
        artifacts = data.get("artifacts") or []
        if not isinstance(artifacts, list):
            raise ValueError("artifacts must be a list")
        for item in artifacts:
            if (
                not isinstance(item, dict)
                or not isinstance(item.get("sha256"), str)
                or not SHA256_RE.fullmatch(item["sha256"])
                or not isinstance(item.get("path"), str)
            ):
                raise ValueError("artifacts must be [{sha256 (64 lowercase hex digits), path}]")
        workdir = data.get("workdir") or ""
        if not isinstance(workdir, str):
            raise ValueError("workdir must be a string")
        numbers: dict[str, float | None] = {}
        for name in ("bid", "cpus"):
            value = data.get(name)
            if value is not None and (not is_number(value) or value < 0):
                raise ValueError(f"{name} must be a non-negative number")
            numbers[name] = value if name == "bid" else (value or None)
        memory_bytes = data.get("memory_bytes")
        if memory_bytes is not None and (not is_int(memory_bytes) or memory_bytes < 0):
            raise ValueError("memory_bytes must be a non-negative number")
        pids = data.get("pids")
        if pids is not None and (not is_int(pids) or not MIN_TASK_PIDS <= pids <= MAX_TASK_PIDS):
            raise ValueError(f"pids must be an integer from {MIN_TASK_PIDS} to {MAX_TASK_PIDS}")
        task_path = data.get("task_path")
        if task_path is not None and (
            not isinstance(task_path, str)
            or len(task_path) > MAX_TASK_PATH
            or not TASK_PATH_RE.fullmatch(task_path)
        ):
            raise ValueError(
                "task_path must be absolute directories separated by ':' (no empty entry)"
            )
        run_as = cls._run_as(data.get("run_as"))
        return cls(
            task_id=task_id,
            job_id=str(data.get("job_id") or ""),
            epoch=epoch,
            rank=rank,
            num_nodes=num_nodes,
            command=list(command),
            env=env,
            workdir=workdir,
            gpus=[dict(g) for g in gpus],
            isolation=str(data.get("isolation") or "exclusive"),
            max_runtime_seconds=max_runtime,
            artifacts=[dict(a) for a in artifacts],
            priority_class=str(data.get("priority_class") or "on-demand"),
            instance=instance,
            run_as=run_as,
            memory_default=data.get("memory_default") is True,
            pids=pids,
            task_path=task_path,
            attempt=cls._attempt(data.get("attempt", 1)),
            bid=numbers["bid"],
            cpus=numbers["cpus"],
            memory_bytes=memory_bytes or None,
            output_cap_bytes=cls._output_cap(data.get("output_cap_bytes")),
        )

    def to_wire(self):
        """The Assignment as fleetd sends it (from_wire reads it back equal)."""
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        out["instance"] = self.instance.to_wire() if self.instance is not None else None
        return out

    @staticmethod
    def _output_cap(value):
        if value is None:
            return None
        if not is_int(value) or not MIN_OUTPUT_CAP_BYTES <= value <= MAX_OUTPUT_CAP_BYTES:
            raise ValueError(
                f"output_cap_bytes must be an integer from {MIN_OUTPUT_CAP_BYTES} to "
                f"{MAX_OUTPUT_CAP_BYTES}"
            )
        return value

    @staticmethod
    def _attempt(value):
        if not is_int(value) or value < 1:
            raise ValueError("attempt must be a positive integer")
        return value

    @staticmethod
    def _run_as(value):
        """{source, user, uid, gid, allow_system_user?} checked for shape (what they mean is the
        agent's to check), or None. `allow_system_user`: true when fleetd's operator allowed this
        unix_user although it is a system account (sent only then)."""
        if value is None:
            return None
        if not isinstance(value, dict) or value.get("source") not in RUN_AS_SOURCES:
            raise ValueError(
                f"run_as must be {{source: {' | '.join(RUN_AS_SOURCES)}, user?, uid?, gid?}}"
            )
        user = value.get("user")
        if user is not None and (not isinstance(user, str) or not USER_NAME_RE.fullmatch(user)):
            raise ValueError(
                "run_as.user must be a user name (letters, digits, _ and -, at most 32)"
            )
        ids = {}
        for name in ("uid", "gid"):
            number = value.get(name)
            if number is not None and (
                isinstance(number, bool)
                or not isinstance(number, int)
                or not 0 <= number < 2**31 - 1
            ):
                raise ValueError(f"run_as.{name} must be a non-negative integer")
            ids[name] = number
        allow_system_user = value.get("allow_system_user", False)
        if not isinstance(allow_system_user, bool):
            raise ValueError("run_as.allow_system_user must be true or false")
        extra: dict[str, Any] = {"allow_system_user": True} if allow_system_user else {}
        groups = value.get("groups")
        if groups is not None:
            if (
                not isinstance(groups, list)
                or len(groups) > MAX_RUN_AS_GROUPS
                or not all(is_int(g) and 0 < g < 2**31 - 1 for g in groups)
            ):
                raise ValueError(
                    f"run_as.groups must be at most {MAX_RUN_AS_GROUPS} positive group ids"
                )
            extra["groups"] = list(groups)
        return {"source": value["source"], "user": user, **ids, **extra}
