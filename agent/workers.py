"""The registry of tasks running on this host, as the local API and the heartbeat see them.

The task runner (agent/task/runner.py) registers a Worker when it accepts an assignment and removes
it once fleetd has the task's outcome; with no tasks every view here is an empty list.
"""

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable

from fleetwire.heartbeat import TaskReport

log = logging.getLogger("agent.workers")

PRIORITY_ORDER = {"spot": 0, "on-demand": 1}


@dataclasses.dataclass
class Worker:
    """One running task on this host."""

    task_id: str
    epoch: int
    job_id: str = ""
    rank: int = 0
    state: str = "running"
    priority_class: str = "on-demand"
    pids: list = dataclasses.field(default_factory=list)  # the task's process group
    gpus: list = dataclasses.field(
        default_factory=list
    )  # [{uuid, memory_limit_bytes?, compute_percent?}]
    env: dict = dataclasses.field(
        default_factory=dict
    )  # what the agent injected (CUDA_VISIBLE_DEVICES, ...)
    started_at: str = ""
    stop: Callable[..., object] | None = None  # callable(reason) supplied by the runner
    limits: dict = dataclasses.field(default_factory=dict)  # max_runtime_seconds, kill grace, ...
    list_pids: Callable[[], Iterable[int]] | None = (
        None  # callable() -> the live pids of the task (group, cgroup, markers), from the runner
    )
    bid: float | None = None  # spot bid; the trap stops lower bids first
    pgid: int | None = None  # the leader's session/process group while it is not reaped
    cgroup: str | None = None  # the task's cgroup v2 path as /proc/<pid>/cgroup shows it
    gpu_usage: dict | None = (
        None  # the VRAM watchdog's last reading: uuid -> {used, processes, limits, flags}
    )
    limit_violation: dict | None = None  # what the watchdog stopped the task for
    instance: dict | None = (
        None  # an instance run's id, name, restart policy, image, ports, restarts
    )
    run_as: dict | None = None  # {uid, gid, user, source}: whom the task runs as (agent.isolation)

    def current_pids(self):
        """The task's processes now (the whole process group when the runner can list it)."""
        if self.list_pids is not None:
            return list(self.list_pids())
        return list(self.pids)

    def usage(self, inventory):
        """Per GPU: bytes used by this worker's processes (the watchdog's mapping, else NVML's list
        by pid)."""
        if self.gpu_usage is not None:
            return {uuid: dict(slot) for uuid, slot in self.gpu_usage.items()}
        out = {}
        pids = set(self.current_pids())
        for grant in self.gpus:
            device = inventory.find(grant["uuid"]) if inventory else None
            procs = (device.processes or []) if device else []
            mine = [p for p in procs if p["pid"] in pids]
            out[grant["uuid"]] = {
                "used_memory_bytes": sum(p["used_memory_bytes"] or 0 for p in mine),
                "processes": mine,
            }
        return out

    def to_dict(self, inventory=None):
        """The local API view: GPUs, injected env, limits, per-device per-process usage."""
        return {
            "task_id": self.task_id,
            "job_id": self.job_id,
            "epoch": self.epoch,
            "rank": self.rank,
            "state": self.state,
            "priority_class": self.priority_class,
            "pids": self.current_pids(),
            "gpus": list(self.gpus),
            "env": dict(self.env),
            "limits": dict(self.limits),
            "started_at": self.started_at,
            "usage": self.usage(inventory),
            "bid": self.bid,
            "cgroup": self.cgroup,
            "limit_violation": self.limit_violation,
            "instance": dict(self.instance) if self.instance else None,
            "run_as": dict(self.run_as) if self.run_as else None,
        }


class Workers:
    """Thread-safe registry of Workers."""

    def __init__(self):
        self._lock = threading.Lock()
        self._workers = {}

    def add(self, worker):
        """Register a started task."""
        with self._lock:
            self._workers[worker.task_id] = worker

    def remove(self, task_id):
        """Forget a finished task."""
        with self._lock:
            self._workers.pop(task_id, None)

    def all(self):
        """Every worker, oldest first."""
        with self._lock:
            return list(self._workers.values())

    def get(self, task_id):
        """The worker for a task id, or None."""
        with self._lock:
            return self._workers.get(task_id)

    def report(self):
        """The heartbeat's `tasks`: a TaskReport per task."""
        return [TaskReport(w.task_id, w.epoch, w.state) for w in self.all()]

    def cancel(self, task_ids, reason):
        """Stop the listed tasks (fleetd said so); unknown ids are ignored."""
        for task_id in task_ids:
            worker = self.get(task_id)
            if worker is None:
                continue
            log.warning("stopping task %s: %s", task_id, reason)
            if worker.stop is not None:
                worker.stop(reason)

    def stop_all(self, reason):
        """Stop every task (revocation, fatal error)."""
        self.cancel([w.task_id for w in self.all()], reason)

    def limiter(self, inventory):
        """Per worker and GPU: the limit and what it uses now."""
        out = []
        for worker in self.all():
            usage = worker.usage(inventory)
            gpu_limits = {g["uuid"]: g for g in (worker.limits.get("gpus") or [])}
            for grant in worker.gpus:
                slot = usage.get(grant["uuid"]) or {}
                out.append(
                    {
                        "task_id": worker.task_id,
                        "epoch": worker.epoch,
                        "gpu_uuid": grant["uuid"],
                        "isolation": worker.limits.get("isolation"),
                        "memory_limit_bytes": grant.get("memory_limit_bytes"),
                        "memory_tolerance_bytes": worker.limits.get("memory_tolerance_bytes"),
                        "compute_percent": grant.get("compute_percent"),
                        "memory_enforcement": gpu_limits.get(grant["uuid"], {}).get(
                            "memory_enforcement"
                        ),
                        "compute_enforcement": gpu_limits.get(grant["uuid"], {}).get(
                            "compute_enforcement"
                        ),
                        "used_memory_bytes": slot.get("used_memory_bytes", 0),
                        "sm_util_percent": slot.get("sm_util_percent"),
                        "over_memory_limit": slot.get("over_memory_limit", False),
                        "over_compute_share": slot.get("over_compute_share", False),
                        "processes": slot.get("processes", []),
                    }
                )
            for uuid, slot in usage.items():
                if slot.get("not_assigned"):
                    out.append(
                        {
                            "task_id": worker.task_id,
                            "epoch": worker.epoch,
                            "gpu_uuid": uuid,
                            "not_assigned": True,
                            "used_memory_bytes": slot.get("used_memory_bytes", 0),
                            "processes": slot.get("processes", []),
                        }
                    )
            if not worker.gpus:
                out.append(
                    {
                        "task_id": worker.task_id,
                        "epoch": worker.epoch,
                        "gpu_uuid": None,
                        "isolation": worker.limits.get("isolation"),
                        "used_memory_bytes": 0,
                        "processes": [],
                    }
                )
            for row in out:
                if row["task_id"] == worker.task_id:
                    row["host"] = worker.limits.get("host")
        return out

    def trap(self, inventory, gpu_uuid, pressure_bytes=None):
        """Workers on a GPU under VRAM pressure, the ones to stop first first.

        Order: spot before on-demand; then the lowest bid first (no bid counts as 0); then the
        largest user of the GPU first; then the newest. With `pressure_bytes`, the list ends once
        stopping the candidates would free that much. Nothing is stopped here.
        """
        candidates = []
        for worker in self.all():
            slot = worker.usage(inventory).get(gpu_uuid)
            if slot is None and not any(g["uuid"] == gpu_uuid for g in worker.gpus):
                continue
            used = (slot or {}).get("used_memory_bytes", 0)
            order = (
                PRIORITY_ORDER.get(worker.priority_class, 1),
                worker.bid or 0.0,
                -used,
                _newest_first(worker.started_at),
            )
            candidates.append((order, worker, used))
        candidates.sort(key=lambda c: c[0])
        out, freed = [], 0
        for _order, worker, used in candidates:
            if pressure_bytes is not None and freed >= pressure_bytes:
                break
            out.append(
                {
                    "task_id": worker.task_id,
                    "epoch": worker.epoch,
                    "job_id": worker.job_id,
                    "priority_class": worker.priority_class,
                    "bid": worker.bid,
                    "used_memory_bytes": used,
                    "memory_limit_bytes": next(
                        (g.get("memory_limit_bytes") for g in worker.gpus if g["uuid"] == gpu_uuid),
                        None,
                    ),
                }
            )
            freed += used
        return out


def _newest_first(started_at):
    """A sort key that puts later ISO timestamps first."""
    return tuple(-ord(c) for c in started_at or "")
