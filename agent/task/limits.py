"""GPU limits enforced from the host: isolation, the VRAM watchdog, MPS, cgroups, GPU health.

This module sets each task's limits up (`Limits.prepare`) and owns the node's pieces:
agent/cgroups.py (host CPU and memory), agent/task/mps.py, agent/task/watchdog.py.

Peers limit GPU memory by intercepting CUDA inside the task, which a task bypasses (a child that
unsets a variable, a nested container). Here everything is decided on the host, from NVML and
/proc, where the task cannot reach:

* **Isolation.** Every task sees only its GPUs (``CUDA_VISIBLE_DEVICES`` and
  ``NVIDIA_VISIBLE_DEVICES`` set to their UUIDs, by the runner). ``exclusive`` tasks own whole
  GPUs; ``shared`` tasks hold a slice (``memory_limit_bytes``, ``compute_percent``) that the
  watchdog enforces; ``mps`` tasks additionally run as clients of an MPS control daemon per GPU
  (started and supervised here when ``limits.mps_enabled``), with
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` set, so that the
  driver itself enforces the compute share and the memory limit. A task on a MIG device sees only
  that device (``CUDA_VISIBLE_DEVICES=MIG-...``); the GPU's hardware isolates its memory and
  compute, so no software limit is set or watched for it (its processes show on the parent GPU).
* **Watchdog.** Every ``limits.poll_seconds`` (0.25 s, at most 0.5 s) NVML's per-process memory
  is read, each host PID is mapped to its task (:class:`ProcessMapper`) and summed per task per
  GPU. A task over ``memory_limit_bytes + limits.memory_tolerance_bytes`` on a GPU is stopped
  (SIGTERM to all its processes, SIGKILL ``limits.kill_grace_seconds`` later) and fails with
  ``gpu_memory_limit_exceeded: ...``; a task process on a GPU not given to the task fails it with
  ``gpu_not_assigned: ...``; a task on a GPU that became unhealthy (critical XID, uncorrectable
  ECC, lost) fails with ``gpu_unhealthy: ...``. GPU processes that belong to no task are
  reported (heartbeat metrics, local API) and killed when ``limits.foreign_processes = "kill"``.
* **Compute share.** Per-process SM utilisation from NVML is reported per worker. With MPS the
  driver enforces the share; without MPS it is *reported, not throttled*: the worker record says
  so and flags a task over its share while another process on the GPU is active.
* **Host CPU, memory and processes** (``cpus`` and ``memory_bytes`` of the JobSpec, else the fleet's
  ``task_memory_default_bytes``; ``pids``, else the fleet's ``task_pids_max``) through a cgroup v2
  per task where the host has cgroup v2 with the cpu/memory/pids controllers writable; where not,
  the worker's record says "not enforced" and why. Without the pids controller the pid limit falls
  back to RLIMIT_NPROC, set by the task's root shell (its ``ulimit``; ``prlimit`` where it has none)
  before the task's process switches to its uid: that one counts every process and thread of the
  task's uid on the node (its owner's other tasks too), and binds no root task. A container gets
  both from its runtime instead (``--pids-limit``, ``--memory``: agent/task/container.py), since its
  processes live in the runtime's cgroup, not the task's. The task cgroup, when it can be created at
  all, is also the most reliable way to find a task's processes.

The tolerance: NVML counts a process's whole footprint (CUDA context, allocator rounding to 2 MiB
pages), so usage over the limit by at most ``memory_tolerance_bytes`` (32 MiB by default) is
allowed; usage at ``limit + tolerance`` is within, one byte more is over.
"""

import dataclasses
import os
import shutil

from agent.cgroups import Cgroups, shell_nproc_flag, shim_command
from agent.isolation import SETPRIV_PATH
from agent.task.errors import LimitError
from agent.task.mps import MIB, MpsSupervisor, mps_client_env
from agent.task.watchdog import MAX_POLL_SECONDS, Watchdog, grant_number

ISOLATION_MODES = ("exclusive", "shared", "mps")

__all__ = ["MIB", "LimitError", "LimitSettings", "Limits", "TaskLimits"]


@dataclasses.dataclass
class LimitSettings:
    """The [limits] settings of the agent config."""

    poll_seconds: float = 0.25
    memory_tolerance_bytes: int = 32 * MIB
    kill_grace_seconds: float = 0.5
    foreign_processes: str = "report"
    mps_enabled: bool = False
    mps_control_command: str = "nvidia-cuda-mps-control"
    mps_dir: str = ""  # empty: <state_dir>/mps
    cgroup_parent: str = "fleet-agent"  # empty: no task cgroups

    @classmethod
    def from_config(cls, config):
        """The settings from an agent Config."""
        return cls(
            poll_seconds=config.limits_poll_seconds,
            memory_tolerance_bytes=config.limits_memory_tolerance_bytes,
            kill_grace_seconds=config.limits_kill_grace_seconds,
            foreign_processes=config.limits_foreign_processes,
            mps_enabled=config.limits_mps_enabled,
            mps_control_command=config.limits_mps_control_command,
            mps_dir=config.limits_mps_dir,
            cgroup_parent=config.limits_cgroup_parent,
        )


@dataclasses.dataclass
class TaskLimits:
    """What the agent set up for one task: env, cgroup, limits, and how each is enforced."""

    task_id: str
    epoch: int
    isolation: str
    gpus: list  # [{uuid, memory_limit_bytes?, compute_percent?}]
    env: dict  # variables injected on top of the runner's
    cgroup: str | None = None  # absolute path of the task's cgroup
    cgroup_rel: str | None = None  # as /proc/<pid>/cgroup shows it
    host: dict = dataclasses.field(default_factory=dict)
    gpu_enforcement: dict = dataclasses.field(default_factory=dict)  # uuid -> {memory, compute}
    tolerance_bytes: int = 0
    kill_grace_seconds: float = 0.5
    nproc: int | None = (
        None  # RLIMIT_NPROC for the task's process (the pid limit without a pids cgroup)
    )

    def describe(self):
        """The `limits` part of the local API's worker record."""
        return {
            "isolation": self.isolation,
            "memory_tolerance_bytes": self.tolerance_bytes,
            "limit_kill_grace_seconds": self.kill_grace_seconds,
            "gpus": [dict(g, **self.gpu_enforcement.get(g["uuid"], {})) for g in self.gpus],
            "host": self.host,
            "cgroup": self.cgroup,
        }


class Limits:
    """Sets up each task's limits and runs the watchdog over all of them."""

    def __init__(
        self,
        settings=None,
        devices=None,
        workers=None,
        state_dir=None,
        cgroups=None,
        prlimit=None,
        nproc_flag=None,
    ):
        self.settings = settings or LimitSettings()
        self.prlimit = (
            prlimit if prlimit is not None else shutil.which("prlimit", path=SETPRIV_PATH)
        )
        # RLIMIT_NPROC is set by the task's root shell where its ulimit can (no exec), else by
        # prlimit.
        self.nproc_flag = shell_nproc_flag() if nproc_flag is None else (nproc_flag or None)
        self.devices = devices
        self.workers = workers
        base = self.settings.mps_dir or os.path.join(state_dir or ".", "mps")
        self.mps = (
            MpsSupervisor(self.settings.mps_control_command, os.path.abspath(base))
            if self.settings.mps_enabled
            else None
        )
        self.mps_base = os.path.abspath(base)
        self.cgroups = cgroups if cgroups is not None else Cgroups(self.settings.cgroup_parent)
        self.watchdog = Watchdog(self.settings, devices, workers, self.mps)

    # Per task.

    def prepare(self, assignment, run_as=None):
        """TaskLimits for an assignment (run as `run_as`, agent.isolation.RunAs; None: unknown);
        LimitError when it cannot run here as asked."""
        isolation = assignment.isolation if assignment.isolation in ISOLATION_MODES else None
        if isolation is None:
            raise LimitError(
                f"unknown isolation {assignment.isolation!r}: use exclusive, shared or mps"
            )
        gpus = [dict(g) for g in assignment.gpus]
        env, enforcement = {}, {}
        for grant in gpus:
            if grant.get("mig_device"):
                # A MIG device: the GPU's hardware isolates its memory and compute; no software
                # limit is set or watched (watchdog.hardware_limits).
                grant.pop("memory_limit_bytes", None)
                grant.pop("compute_percent", None)
                enforcement[grant["uuid"]] = {
                    "memory_enforcement": f"MIG hardware isolation ({grant['mig_device']})",
                    "compute_enforcement": f"MIG hardware isolation ({grant['mig_device']})",
                }
                continue
            for key in ("memory_limit_bytes", "compute_percent"):
                # A limit that is present must be one: 0 (a fraction too small to hold any memory)
                # is an error, never "no limit".
                if grant.get(key) is not None and grant_number(grant, key) is None:
                    raise LimitError(
                        f"GPU {grant['uuid']}: {key} {grant[key]!r} is not a positive number; a "
                        "shared slice needs a real limit"
                    )
            memory = grant_number(grant, "memory_limit_bytes")
            compute = grant_number(grant, "compute_percent")
            enforcement[grant["uuid"]] = {
                "memory_enforcement": "none: whole GPU"
                if memory is None
                else "watchdog (NVML per-process memory)",
                "compute_enforcement": "none: whole GPU"
                if compute is None
                else (
                    "reported, not throttled (no MPS): per-process SM utilisation is reported per "
                    "worker"
                ),
            }
        if isolation == "mps":
            if any(g.get("mig_device") for g in gpus):
                raise LimitError(
                    "mps isolation is not available on a MIG device: the GPU's hardware already "
                    "isolates it"
                )
            if len(gpus) != 1:
                raise LimitError(
                    f"mps isolation needs exactly one GPU per task (got {len(gpus)}): "
                    "there is one MPS control daemon per GPU"
                )
            uuid = gpus[0]["uuid"]
            if self.mps is None:
                enforcement[uuid]["mps"] = (
                    "not enabled on this node (limits.mps_enabled = false): run as shared"
                )
            else:
                self.mps.ensure(uuid)
                env.update(mps_client_env(self.mps_base, uuid, gpus[0]))
                if "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in env:
                    percentage = env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]
                    enforcement[uuid]["compute_enforcement"] = (
                        f"MPS: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percentage}"
                    )
                if "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in env:
                    pinned = env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
                    enforcement[uuid]["memory_enforcement"] = (
                        f"MPS: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={pinned}, and the watchdog"
                    )
                enforcement[uuid]["mps"] = "client of the MPS control daemon of this GPU"
        name = f"task-{assignment.task_id}.{assignment.epoch}"
        cpus = getattr(assignment, "cpus", None)
        memory_bytes = getattr(assignment, "memory_bytes", None)
        pids = getattr(assignment, "pids", None)
        path, host = self.cgroups.create(name, cpus=cpus, memory_bytes=memory_bytes, pids=pids)
        if getattr(assignment, "memory_default", False) and memory_bytes:
            host["memory_bytes"]["source"] = "fleet task_memory_default_bytes"
        nproc = None
        instance = getattr(assignment, "instance", None)
        if instance is not None and instance.image:
            # A container's processes are in its runtime's cgroup: the runtime bounds them
            # (container.py).
            for key, flag in (("memory_bytes", "--memory"), ("pids", "--pids-limit")):
                if host[key]["limit"]:
                    host[key].update(
                        enforced=True, how=f"container runtime {flag}={int(host[key]['limit'])}"
                    )
        elif pids and not host["pids"]["enforced"]:
            nproc = self._nproc_fallback(host["pids"], run_as)
        return TaskLimits(
            task_id=assignment.task_id,
            epoch=assignment.epoch,
            isolation=isolation,
            gpus=gpus,
            env=env,
            cgroup=path,
            cgroup_rel=self.cgroups.relative(path),
            host=host,
            gpu_enforcement=enforcement,
            tolerance_bytes=self.settings.memory_tolerance_bytes,
            kill_grace_seconds=self.settings.kill_grace_seconds,
            nproc=nproc,
        )

    def _nproc_fallback(self, record, run_as):
        """The RLIMIT_NPROC that stands in for a pid limit no cgroup enforces (None where it
        cannot), its record updated to say how or why not."""
        why = record["how"].removeprefix("not enforced: ")
        limit = int(record["limit"])
        if run_as is None or run_as.uid == 0:
            record["how"] = f"not enforced: {why}; RLIMIT_NPROC does not bind root"
        elif run_as.source == "agent":
            record["how"] = (
                f"not enforced: {why}; the task runs as the agent's own uid {run_as.uid} "
                "(isolation: none), all of whose processes RLIMIT_NPROC would count"
            )
        elif not self.prlimit and not self.nproc_flag:
            record["how"] = (
                f"not enforced: {why}; neither /bin/sh's ulimit nor prlimit (util-linux) can set "
                "RLIMIT_NPROC here"
            )
        else:
            record.update(
                enforced=True,
                how=f"RLIMIT_NPROC = {limit} for uid {run_as.uid} (it counts all of that "
                f"uid's processes and threads on this node), since {why}",
            )
            return limit
        return None

    def command(self, task_limits, argv, status_path=None):
        """The argv to spawn: through the cgroup shim when the task has a cgroup; with
        `status_path`, under the root-owned shell that records its exit status there
        (agent/cgroups.py shim_command). A pid limit no cgroup holds is RLIMIT_NPROC, set as root
        just before the switch to the task's uid (setpriv), so that the root shell is not bound and
        the task cannot raise it: by that shell's ulimit, or by prlimit where the shell cannot (an
        exec more)."""
        cgroup = task_limits.cgroup if task_limits is not None else None
        nproc = task_limits.nproc if task_limits is not None else None
        if nproc and self.nproc_flag is None:
            argv = [self.prlimit, f"--nproc={nproc}", "--", *argv]
            nproc = None
        if not cgroup and status_path is None and not nproc:
            return list(argv)
        return shim_command(
            cgroup, argv, status_path, nproc=(self.nproc_flag, nproc) if nproc else None
        )

    def release(self, task_limits):
        """After the task: remove its cgroup (the supervisor read its OOM kills before, if it
        failed).

        True when the cgroup is gone, which the kernel allows only once no process is left in it:
        nothing the task started still runs. False without a cgroup, or when one is left.
        """
        if task_limits is not None and task_limits.cgroup:
            return self.cgroups.remove(task_limits.cgroup)
        return False

    def close(self):
        """Stop the MPS daemons."""
        if self.mps is not None:
            self.mps.close()

    # The node's picture.

    def run(self, stop, beat=None):
        """Run the watchdog until `stop` is set (see Watchdog.run)."""
        self.watchdog.run(stop, beat)

    def poll_once(self):
        """One watchdog pass; the violations acted on."""
        return self.watchdog.poll_once()

    def recent_detections(self):
        """The last violations acted on (newest last)."""
        return self.watchdog.recent_detections()

    def report(self):
        """The node-level picture for the heartbeat's metrics and the local API."""
        polls, foreign = self.watchdog.last_poll()
        return {
            "polls": polls,
            "poll_seconds": min(self.settings.poll_seconds, MAX_POLL_SECONDS),
            "foreign_processes": foreign,
            "foreign_policy": self.settings.foreign_processes,
            "cgroups": {
                "path": self.cgroups.path,
                "controllers": sorted(self.cgroups.controllers),
                "note": self.cgroups.why,
            },
            "mps": self.mps.status() if self.mps is not None else "disabled",
        }
