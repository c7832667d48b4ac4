"""Scheduling passes: build a snapshot from the tables, ask the pure engine, write assignments back."""

import logging
import threading

from fleetd import scheduler
from fleetd.db import database, write_transaction
from fleetd.errors import InvalidRequest
from fleetd.models import Gpu, Job, JobState, Node, NodeStatus, Task, TaskState
from fleetd.services.jobs import ACTIVE_TASK_STATES, switch_job_state, switch_task_state

log = logging.getLogger(__name__)

PRIORITY_ORDER = {"on-demand": 0, "spot": 1}


def task_request(spec):
    """The engine's TaskRequest for a JobSpec; InvalidRequest when it is not one."""
    res = spec.get("resources") or {}
    selector = spec.get("node_selector") or {}
    try:
        return scheduler.TaskRequest(
            gpus=res.get("gpus", 0),
            num_nodes=spec.get("num_nodes", 1),
            gpu_memory_bytes=res.get("gpu_memory_bytes"),
            gpu_compute_percent=res.get("gpu_compute_percent"),
            gpu_types=tuple(res.get("gpu_types") or ()),
            cpus=res.get("cpus") or 0,
            memory_bytes=res.get("memory_bytes") or 0,
            node_selector=scheduler.NodeSelector(fleet=selector.get("fleet"), labels=selector.get("labels") or {}),
            priority_class=spec.get("priority_class", "on-demand"),
            bid=spec.get("bid"),
            name=spec.get("name", ""),
        )
    except ValueError as exc:
        raise InvalidRequest(f"resources: {exc}", {"fields": {"resources": [str(exc)]}}) from None


def build_snapshot(silent=lambda node_id: False):
    """Every enrolled node with what is still free on it; call inside the pass's transaction.

    `silent(node_id)` is true for nodes overdue on heartbeats but not yet declared lost:
    they get no new work.
    """
    held = {}  # (node id, gpu uuid) -> [compute milli, memory bytes, exclusive]
    node_use = {}  # node id -> [cpu milli, memory bytes]
    for task in (Task.select(Task, Job.spec).join(Job).where(Task.state.in_(ACTIVE_TASK_STATES))):
        req = task_request(task.job.spec)
        use = node_use.setdefault(task.node_id, [0, 0])
        use[0] += req.cpu_milli
        use[1] += req.memory_bytes
        for alloc in task.gpus:
            h = held.setdefault((task.node_id, alloc["uuid"]), [0, 0, False])
            h[0] += alloc.get("compute_milli", scheduler.MILLI)
            h[1] += alloc.get("memory_limit_bytes") or 0
            h[2] = h[2] or alloc.get("exclusive", False)
    gpus_by_node = {}
    for gpu in Gpu.select().order_by(Gpu.node, Gpu.index):
        h = held.get((gpu.node_id, gpu.uuid), (0, 0, False))
        gpus_by_node.setdefault(gpu.node_id, []).append(
            scheduler.GpuSnapshot(
                uuid=gpu.uuid,
                model=gpu.model,
                memory_total_bytes=gpu.memory_total_bytes,
                memory_free_bytes=max(0, gpu.memory_total_bytes - h[1]),
                compute_free_milli=max(0, scheduler.MILLI - h[0]),
                numa_node=gpu.numa_node or 0,
                healthy=gpu.healthy,
                exclusive=h[2],
            )
        )
    nodes = []
    for node in Node.select().where(Node.status != NodeStatus.REVOKED.value).order_by(Node.id):
        cpu_used, mem_used = node_use.get(node.id, (0, 0))
        nodes.append(
            scheduler.NodeSnapshot(
                id=node.id,
                gpus=tuple(gpus_by_node.get(node.id, ())),
                fleet=node.fleet_id,
                labels=node.labels or {},
                schedulable=NodeStatus(node.status).is_schedulable() and not silent(node.id),
                status=node.status if not silent(node.id) else "silent (heartbeats overdue)",
                cpu_free_milli=max(0, node.cpu_count * scheduler.MILLI - cpu_used),
                memory_free_bytes=max(0, node.memory_bytes - mem_used),
            )
        )
    return scheduler.ClusterSnapshot(nodes=tuple(nodes))


def _allocation(gpu):
    """A GpuAllocation as stored on the task and sent in the Assignment."""
    out = {"uuid": gpu.uuid, "exclusive": gpu.exclusive, "compute_milli": gpu.compute_milli}
    if not gpu.exclusive:
        out["memory_limit_bytes"] = gpu.memory_limit_bytes
        out["compute_percent"] = gpu.compute_milli / 10
    return out


_PASS_LOCK = threading.Lock()


def run_pass(rt):
    """One scheduling pass over every queued job; returns {"assigned": jobs, "pending": jobs}.

    Assignments are written in the same transaction as the snapshot they were computed
    from, and passes never overlap; nodes that got work are woken after the commit.
    """
    with _PASS_LOCK:
        return _run_pass(rt)


def _run_pass(rt):
    now = rt.clock.now()
    woken = set()
    assigned = pending = 0
    with write_transaction():
        queued = list(Job.select().where(Job.state == JobState.QUEUED.value))
        if not queued:
            return {"assigned": 0, "pending": 0}
        queued.sort(key=lambda j: (PRIORITY_ORDER.get(j.priority_class, 9), j.id))
        snapshot = build_snapshot(rt.liveness.is_overdue)
        engine = scheduler.PlacementEngine(snapshot, policy=rt.settings.scheduler_policy or None)
        for job in queued:
            result = engine.place(task_request(job.spec), explain=True)
            if not result.schedulable:
                pending += 1
                if job.pending_reason != result.reason:
                    job.pending_reason = result.reason
                    job.save()
                continue
            tasks = {t.rank: t for t in Task.select().where(Task.job == job.id)}
            for rank in result.ranks:
                task = tasks[rank.rank]
                task.node = rank.node_id
                task.gpus = [_allocation(g) for g in rank.gpus]
                task.epoch += 1
                task.assigned_at = now
                task.delivered_at = None
                switch_task_state(task, TaskState.ASSIGNED, f"placed on node {rank.node_id}", now)
                rt.leases.renew(task.id, task.epoch)
                woken.add(rank.node_id)
            job.pending_reason = ""
            switch_job_state(job, JobState.RUNNING, f"placed by policy {result.policy}", now)
            assigned += 1
    for node_id in woken:
        rt.notifier.notify(("node", node_id))
    return {"assigned": assigned, "pending": pending}


class SchedulerLoop:
    """Runs a pass soon after each kick (submit, task end, node change), coalescing kicks.

    The periodic pass is the `scheduling` background task. Without a started loop (tests,
    one-off tools), kick() runs a pass in the caller.
    """

    def __init__(self, app, rt):
        self.app = app
        self.rt = rt
        self._kicked = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    def kick(self):
        """Ask for a pass soon (now, when no loop runs)."""
        if self._thread is None:
            run_pass(self.rt)
        else:
            self._kicked.set()

    def start(self):
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout=10):
        self._stop.set()
        self._kicked.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self):
        while not self._stop.is_set():
            self._kicked.wait()
            self._kicked.clear()
            if self._stop.is_set():
                return
            try:
                with self.app.app_context(), database.connection_context():
                    run_pass(self.rt)
            except Exception:  # a failed pass is logged; the next kick or interval retries
                log.exception("scheduling pass failed")
