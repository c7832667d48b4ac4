"""GPU boards by serial number: what the API shows of one (identity, where it is, its history),
the RMA mark an operator sets, and the dynamic MIG block an operator clears
(services.nodes.gpu_history records the history itself; services.placement.mig_plan blocks)."""

from fleetd.clock import isoformat
from fleetd.db import write_transaction
from fleetd.errors import Conflict, NotFound
from fleetd.models import Event, Gpu, GpuRecord, Node, NodeStatus
from fleetd.services.nodes import gpu_history, nodes
from fleetd.services.notify.events import current_actor, record_event
from fleetd.services.pagination import last_rows, paginate

# A node in one of these is drained for repair when one of its GPUs is marked for RMA.
DRAINABLE = (NodeStatus.READY.value, NodeStatus.CORDONED.value, NodeStatus.FAILED_VALIDATION.value)
OUT_OF_SERVICE = (
    NodeStatus.DRAINING.value,
    NodeStatus.DRAINED.value,
)  # their drain becomes one for repair


def get_gpu(serial, history=200):
    """A board with its current place and health and the last `history` events of its history
    (oldest first); NotFound for a serial never seen."""
    record = GpuRecord.get_or_none(GpuRecord.serial == serial)
    if record is None:
        raise NotFound(f"no GPU with serial {serial!r} has been seen")
    record.hostname = gpu_history.node_hostname(record.node_id)
    row = (
        Gpu.select(Gpu.healthy, Gpu.health_reason, Gpu.mig_blocked)
        .where((Gpu.node == record.node_id) & (Gpu.serial == serial))
        .first()
        if record.node_id
        else None
    )
    record.healthy = row.healthy if row is not None else None
    record.health_reason = row.health_reason if row is not None else None
    record.mig_blocked = row.mig_blocked if row is not None else None
    record.history = last_rows(
        Event.select().where((Event.subject_type == "gpu") & (Event.subject_id == serial)),
        Event.id,
        history,
    )
    return record


def mark_rma(rt, serial, reason, deadline_seconds):
    """Mark a board for RMA: it is reported unhealthy from now on (it takes no work), its history
    says so, and its node is drained for repair (undrained, the node validates before it takes work
    again, and fails while the board is still in it). One transaction: a drain refused marks
    nothing. Returns the record."""
    now = rt.clock.now()
    with write_transaction():
        record = GpuRecord.get_or_none(GpuRecord.serial == serial)
        if record is None:
            raise NotFound(f"no GPU with serial {serial!r} has been seen")
        record.rma = {
            "reason": reason,
            "at": isoformat(now),
            "actor": current_actor(),
            "node_id": record.node_id,
        }
        record.flagged = ""
        record.save()
        where = f" in node {record.node_id}" if record.node_id else ""
        record_event(now, "gpu.rma", "gpu", serial, f"marked for RMA{where}: {reason}")
        healthy, why = gpu_history.rma_health({}, reason)
        Gpu.update(healthy=healthy, health_reason=why).where(Gpu.serial == serial).execute()
        node = Node.get_or_none(Node.id == record.node_id) if record.node_id else None
        if node is not None and (
            node.status in DRAINABLE or (node.status in OUT_OF_SERVICE and not node.drain_repair)
        ):
            nodes.drain_node(
                rt,
                node.id,
                f"GPU serial {serial} marked for RMA: {reason}",
                deadline_seconds,
                repair=True,
            )
    return get_gpu(serial)


GPU_STATES = ("all", "rma", "flagged", "ok", "mig_blocked")


def list_gpus(limit, cursor=None, state="all", model=None):
    """One page of boards by serial: `state` rma (marked for RMA), flagged (marked and seen again
    in a node), ok (neither), mig_blocked (a dynamic MIG repartition failed on it) or all; `model`:
    only boards of that model."""
    query = GpuRecord.select()
    if state == "mig_blocked":
        query = query.where(
            GpuRecord.serial.in_(Gpu.select(Gpu.serial).where(Gpu.mig_blocked != ""))
        )
    if state == "rma":
        query = query.where(GpuRecord.rma.is_null(False))
    elif state == "flagged":
        query = query.where(GpuRecord.flagged != "")
    elif state == "ok":
        query = query.where(GpuRecord.rma.is_null() & (GpuRecord.flagged == ""))
    if model:
        query = query.where(GpuRecord.model == model)
    items, next_cursor = paginate(query, GpuRecord.serial, limit, cursor)
    hostnames = {
        n.id: n.hostname
        for n in Node.select(Node.id, Node.hostname).where(
            Node.id.in_([r.node_id for r in items if r.node_id])
        )
    }
    blocked = {
        g.serial: g.mig_blocked
        for g in Gpu.select(Gpu.serial, Gpu.mig_blocked).where(
            Gpu.serial.in_([r.serial for r in items])
        )
    }
    for record in items:
        record.hostname = hostnames.get(record.node_id)
        record.mig_blocked = blocked.get(record.serial)
    return items, next_cursor


def clear_mig_block(rt, serial):
    """Let a GPU that a failed dynamic MIG repartition blocked take work and be planned again
    (after its fleet's settle time). NotFound for a serial never seen or not in a node now,
    Conflict for a GPU that is not blocked. Returns the record."""
    now = rt.clock.now()
    with write_transaction():
        if GpuRecord.get_or_none(GpuRecord.serial == serial) is None:
            raise NotFound(f"no GPU with serial {serial!r} has been seen")
        gpu = Gpu.get_or_none(Gpu.serial == serial)
        if gpu is None:
            raise NotFound(f"GPU {serial} is in no node now")
        if not gpu.mig_blocked:
            raise Conflict(f"GPU {serial} is not blocked by dynamic MIG", {"serial": serial})
        Gpu.update(mig_blocked="", mig_changed_at=now).where(Gpu.id == gpu.id).execute()
        record_event(
            now, "gpu.mig_unblocked", "gpu", serial, f"MIG block cleared ({gpu.mig_blocked})"
        )
    return get_gpu(serial)


def clear_rma(rt, serial):
    """Take a board's RMA mark (and its flag) away: a repaired or replaced board returns. Its own
    health is its agent's again (the RMA part of the stored health goes at once, the rest with the
    next report); its node stays as the operator left it (undrained, it validates first). The
    history keeps the mark and its clearing. NotFound for a serial never seen, Conflict for one
    that is not marked."""
    now = rt.clock.now()
    with write_transaction():
        record = GpuRecord.get_or_none(GpuRecord.serial == serial)
        if record is None:
            raise NotFound(f"no GPU with serial {serial!r} has been seen")
        if record.rma is None and not record.flagged:
            raise Conflict(f"GPU {serial} is not marked for RMA", {"serial": serial})
        marked = record.rma or {}
        record.rma, record.flagged = None, ""
        record.save()
        record_event(
            now,
            "gpu.rma_cleared",
            "gpu",
            serial,
            f"RMA mark of {marked.get('at')} ({marked.get('reason')}) cleared",
        )
        why = gpu_history.rma_health({}, marked.get("reason"))[1]
        for gpu in Gpu.select(Gpu.id, Gpu.health_reason).where(Gpu.serial == serial):
            rest = (gpu.health_reason or "").removeprefix(why).removeprefix("; ")
            Gpu.update(healthy=not rest, health_reason=rest).where(Gpu.id == gpu.id).execute()
    return get_gpu(serial)
