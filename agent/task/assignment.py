"""The environment and paths a task gets from its assignment (the Assignment itself, validated, is
fleetwire.assignment's)."""

import os
import socket

from agent.task.errors import TaskError
from fleetwire.assignment import visible_device

# What a task inherits from the agent's own environment; nothing else (no FLEET_AGENT_* secrets).
# Not PATH: the agent's own may name directories of root's (a pyenv's shims) that a task's uid
# cannot enter.
PASSTHROUGH_ENV = (
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
)
# A task's PATH where fleetd sends none (a fleetd older than the fleet's task_path); the fleet's
# default.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def inside(root, relative, what, allow_root=False):
    """`root`/`relative` for a relative path that stays inside `root` (symlinks resolved); TaskError
    otherwise."""
    if not relative or "\0" in relative or os.path.isabs(relative):
        raise TaskError(
            f"{what} {relative!r} must be a relative path inside the task's working directory"
        )
    if ".." in relative.split("/"):
        raise TaskError(f"{what} {relative!r} must not contain '..'")
    path = os.path.normpath(os.path.join(root, relative))
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root or (
        path == os.path.normpath(root) and not allow_root
    ):
        raise TaskError(f"{what} {relative!r} leaves the task's working directory")
    return path


def task_env(assignment, master_addr, master_port, environ=None, extra=None):
    """(the task's whole environment, the variables the agent injected).

    The spec's env goes over a small passthrough of the agent's own and the PATH of the task's
    fleet (`task_path`; never the agent's own); the injected variables go over both, so a spec
    cannot widen its GPUs or fake its rank. `extra` are the limits'
    variables (MPS); NVIDIA_VISIBLE_DEVICES carries the same UUIDs for nested containers
    ("none" without GPUs). A GPU held as a MIG device is named by its MIG uuid (MIG-...): the task
    sees that slice, never its whole GPU.
    """
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in PASSTHROUGH_ENV if k in environ}
    env["PATH"] = assignment.task_path or DEFAULT_PATH
    env["PYTHONUNBUFFERED"] = "1"  # Python tasks' output reaches the log as it is printed
    env.update(assignment.env)
    uuids = [visible_device(g) for g in assignment.gpus]
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
