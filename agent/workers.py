"""The registry of tasks running on this host, as the local API and the heartbeat see them.

The task runner (agent/runner.py) registers a Worker when it accepts an assignment and removes
it once fleetd has the task's outcome; with no tasks every view here is an empty list.
"""

import dataclasses
import logging
import threading

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
    gpus: list = dataclasses.field(default_factory=list)  # [{uuid, memory_limit_bytes?, compute_percent?}]
    env: dict = dataclasses.field(default_factory=dict)  # what the agent injected (CUDA_VISIBLE_DEVICES, ...)
    started_at: str = ""
    stop: object = None  # callable(reason) supplied by the runner
    limits: dict = dataclasses.field(default_factory=dict)  # max_runtime_seconds, kill grace, ...
    list_pids: object = None  # callable() -> the live pids of the task's process group, from the runner

    def current_pids(self):
        """The task's processes now (the whole process group when the runner can list it)."""
        if self.list_pids is not None:
            return list(self.list_pids())
        return list(self.pids)

    def usage(self, inventory):
        """Per GPU: bytes used by this worker's processes, from NVML's process list."""
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
            "task_id": self.task_id, "job_id": self.job_id, "epoch": self.epoch, "rank": self.rank,
            "state": self.state, "priority_class": self.priority_class, "pids": self.current_pids(),
            "gpus": list(self.gpus), "env": dict(self.env), "limits": dict(self.limits),
            "started_at": self.started_at, "usage": self.usage(inventory),
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
        """The heartbeat's `tasks`: [{id, epoch, state}]."""
        return [{"id": w.task_id, "epoch": w.epoch, "state": w.state} for w in self.all()]

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
            for grant in worker.gpus:
                out.append({
                    "task_id": worker.task_id, "gpu_uuid": grant["uuid"],
                    "memory_limit_bytes": grant.get("memory_limit_bytes"),
                    "compute_percent": grant.get("compute_percent"),
                    "used_memory_bytes": usage[grant["uuid"]]["used_memory_bytes"],
                })
        return out

    def trap(self, inventory, gpu_uuid, pressure_bytes=None):
        """Workers on a GPU under VRAM pressure, the ones to stop first (lowest priority, largest) first.

        With `pressure_bytes`, the list ends once stopping the candidates would free that much.
        """
        candidates = []
        for worker in self.all():
            if not any(g["uuid"] == gpu_uuid for g in worker.gpus):
                continue
            used = worker.usage(inventory)[gpu_uuid]["used_memory_bytes"]
            candidates.append((PRIORITY_ORDER.get(worker.priority_class, 1), -used, worker.started_at, worker, used))
        candidates.sort(key=lambda c: c[:3])
        out, freed = [], 0
        for _prio, _neg, _started, worker, used in candidates:
            if pressure_bytes is not None and freed >= pressure_bytes:
                break
            out.append({"task_id": worker.task_id, "priority_class": worker.priority_class, "used_memory_bytes": used})
            freed += used
        return out
