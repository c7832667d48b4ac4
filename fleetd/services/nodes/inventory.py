"""A node's GPUs as its agent reports them: whether its driver answers (its GPU status), and the
rows of its GPUs, replaced when the report changes."""

import collections

from fleetd.models import Gpu
from fleetd.services.nodes import gpu_history
from fleetd.services.notify.events import record_event
from fleetd.sql import Statement, insert_rows

GPU_FIELDS = (
    "index",
    "vendor",
    "model",
    "memory_total_bytes",
    "numa_node",
    "max_tflops",
    "healthy",
    "health_reason",
    "mig_mode",
    "serial",
    "board_part_number",
    "vbios",
    "mig_devices",
)


# What fleetd keeps of a GPU across its agent's reports (dynamic MIG: migration 0047): a row
# replaced by a new report keeps them.
KEPT_FIELDS = ("mig_target", "mig_changed_at", "mig_blocked")
_NOT_KEPT = {"mig_target": None, "mig_changed_at": None, "mig_blocked": ""}  # a GPU new to fleetd

# uuids of GPUs the node no longer reports
GpuChange = collections.namedtuple("GpuChange", "gone")


# What a node's GPUs are: "ok" (it has some), "cpu_only" (no NVIDIA driver, no NVML library, or
# no GPU: a CPU-only host) or "driver_error" (a driver is there and NVML failed: a GPU host that
# needs attention).
GPU_STATUSES = ("ok", "cpu_only", "driver_error")


_NO_DRIVER = (
    "not installed",
    "Library Not Found",
    "libnvidia-ml",
    "No such file",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
)


def learned_gpu_status(node, gpus, metrics):
    """(status, reason) when a heartbeat (its GPU list, its metrics' devices_reason) says something
    new of the node's GPUs, else None. Reads the database only when a reason went away."""
    if gpus is None and metrics is None:
        return None
    reason = str((metrics or {}).get("devices_reason") or "")[:500]
    if reason:
        found = (
            "cpu_only" if any(mark in reason for mark in _NO_DRIVER) else "driver_error",
            reason,
        )
    elif gpus is not None:
        found = ("ok", "") if gpus else ("cpu_only", "no GPU found")
    elif node.gpu_status == "ok":
        return None
    else:  # the agent no longer says why it has none: look at what it reported last
        found = (
            ("ok", "")
            if Gpu.select().where(Gpu.node == node.id).exists()
            else ("cpu_only", "no GPU found")
        )
    return None if found == (node.gpu_status, node.gpu_status_reason) else found


def set_gpu_status(node, status, reason, now):
    """Store what the node's GPUs are (inside the caller's transaction), with an Event."""
    node.gpu_status, node.gpu_status_reason = status, reason
    node.save()
    record_event(
        now, "node.gpus", "node", node.id, f"GPUs: {status}{': ' + reason if reason else ''}"
    )


def replace_gpus(node, gpus, now):
    """Store a node's reported GPU inventory; records an Event when it changed. Returns a GpuChange
    (always truthy) if so, else False."""
    rows = _GPUS_OF.rows(node=node.id)
    current = {g.uuid: {f: getattr(g, f) for f in GPU_FIELDS} for g in rows}
    kept = {g.uuid: {f: getattr(g, f) for f in KEPT_FIELDS} for g in rows}
    marked = gpu_history.rma_overrides(gpus)
    if marked:  # a board marked for RMA takes no work, whatever its agent says of it
        gpus = [
            dict(
                g,
                **dict(
                    zip(
                        ("healthy", "health_reason"), gpu_history.rma_health(g, marked[g["serial"]])
                    )
                ),
            )
            if g.get("serial") in marked
            else g
            for g in gpus
        ]
    gpu_history.observe(node, gpus, current, now)
    reported = {g["uuid"]: {f: g.get(f) for f in GPU_FIELDS} for g in gpus}
    if current == reported:
        return False
    _DELETE_GPUS_OF.execute(node=node.id)
    insert_rows(
        Gpu,
        [
            dict(fields, node=node.id, uuid=uuid, **kept.get(uuid, _NOT_KEPT))
            for uuid, fields in reported.items()
        ],
    )
    unhealthy = sorted(u for u, f in reported.items() if not f["healthy"])
    reason = f"GPU inventory: {len(reported)} GPU(s) (was {len(current)})"
    if unhealthy:
        reason += f", unhealthy: {', '.join(unhealthy)}"
    record_event(now, "node.gpus", "node", node.id, reason)
    return GpuChange(gone=tuple(sorted(set(current) - set(reported))))


# Compiled once: every registration and every heartbeat that reports GPUs runs these.
_GPUS_OF = Statement(lambda v: Gpu.select().where(Gpu.node == v("node")))


_DELETE_GPUS_OF = Statement(lambda v: Gpu.delete().where(Gpu.node == v("node")))
