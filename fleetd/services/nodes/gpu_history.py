"""GPU identity and history: a board is known by its serial number wherever it sits.

Each report of a node's GPUs (registration, heartbeats that carry `gpus`) is observed here, inside
the transaction that stores it: a board seen for the first time, in another node, or back after it
left records a `gpu.seen` event; new critical XIDs `gpu.xid`; a new count of uncorrectable ECC
errors `gpu.ecc`; a change of health `gpu.health`. Validation verdicts (`gpu.validation`), the
health policy's actions (`gpu.health`) and RMA marks (`gpu.rma`) join them, so the events of subject
gpu/<serial> are the board's history across hosts and re-enrolments. A board marked for RMA that
shows up again anywhere is flagged (`gpu.flagged`) and reported unhealthy, so it takes no work.

The lowest layer of GPU records: node and validation services call it; services.nodes.gpus (the
API's use cases) builds on it.
"""

from fleetd.models import Gpu, GpuRecord, Node
from fleetd.services.notify.events import FLEETD, record_event

REASON_MAX = 1000
XIDS_KEPT = 64


def _where(node, index, uuid):
    return f"node {node.id} ({node.hostname}) as GPU {index}, uuid {uuid}"


def _event(now, serial, kind, reason, actor=None):
    record_event(now, kind, "gpu", serial, reason[:REASON_MAX], actor=actor)


def rma_overrides(gpus):
    """{serial: reason} of the reported GPUs (wire dicts) whose boards are marked for RMA."""
    serials = [g["serial"] for g in gpus if g.get("serial")]
    if not serials:
        return {}
    return {
        r.serial: r.rma.get("reason", "")
        for r in GpuRecord.select(GpuRecord.serial, GpuRecord.rma).where(
            GpuRecord.serial.in_(serials) & GpuRecord.rma.is_null(False)
        )
    }


def rma_health(gpu, reason):
    """The health fleetd stores for a reported GPU whose board is marked for RMA: unhealthy, saying
    so."""
    why = f"marked for RMA: {reason}" if reason else "marked for RMA"
    mine = gpu.get("health_reason") or ""
    return False, (why if not mine or why in mine else f"{why}; {mine}")[:500]


def observe(node, gpus, before, now):
    """Inside the transaction that stores a node's reported GPUs (wire dicts, already with fleetd's
    RMA health): record what changed for each board by serial. `before`: {uuid: stored fields} of
    the node's GPUs until now."""
    actor = f"node:{node.id}"
    reported = {g["serial"]: g for g in gpus if g.get("serial")}
    records = (
        {r.serial: r for r in GpuRecord.select().where(GpuRecord.serial.in_(list(reported)))}
        if reported
        else {}
    )
    for serial, gpu in reported.items():
        record = records.get(serial)
        where = _where(node, gpu["index"], gpu["uuid"])
        new = record is None
        if record is None:
            record = GpuRecord(
                serial=serial, uuid=gpu["uuid"], first_seen_at=now, xids=[], flagged=""
            )
            _event(now, serial, "gpu.seen", f"first seen in {where}", actor)
        elif record.node_id != node.id:
            was = f"was in node {record.node_id}" if record.node_id else "was in no node"
            _event(now, serial, "gpu.seen", f"seen in {where} ({was})", actor)
            if record.rma:
                record.flagged = (
                    f"marked for RMA on {record.rma.get('at')} ({record.rma.get('reason')}) and "
                    f"seen again in node {node.id} ({node.hostname})"
                )[:REASON_MAX]
                _event(now, serial, "gpu.flagged", record.flagged, FLEETD)
        _observe_faults(record, gpu, before.get(gpu["uuid"]), node, now, actor)
        record.uuid, record.model = gpu["uuid"], gpu.get("model") or record.model or ""
        record.board_part_number = gpu.get("board_part_number") or record.board_part_number
        record.vbios = gpu.get("vbios") or record.vbios
        record.node_id, record.index, record.last_seen_at = node.id, gpu["index"], now
        record.save(force_insert=new)
    left = GpuRecord.select().where(
        (GpuRecord.node_id == node.id) & GpuRecord.serial.not_in(list(reported) or [""])
    )
    for record in left:
        _event(
            now, record.serial, "gpu.seen", f"no longer in node {node.id} ({node.hostname})", actor
        )
        record.node_id = record.index = None
        record.save()


def _observe_faults(record, gpu, stored, node, now, actor):
    xids = [int(x) for x in (gpu.get("xids") or [])][-XIDS_KEPT:]
    seen = list(record.xids or [])
    new = xids[len(seen) :] if xids[: len(seen)] == seen else xids
    if new:
        _event(
            now,
            record.serial,
            "gpu.xid",
            f"critical XID {', '.join(map(str, new))} in node {node.id} "
            f"({node.hostname}), GPU {gpu['index']}",
            actor,
        )
    record.xids = xids
    ecc = gpu.get("ecc_uncorrected")
    if ecc is not None and ecc != record.ecc_uncorrected and ecc > 0:
        _event(
            now,
            record.serial,
            "gpu.ecc",
            f"{ecc} uncorrectable ECC error(s) since driver load in node "
            f"{node.id} ({node.hostname}), GPU {gpu['index']}"
            + (f" (was {record.ecc_uncorrected})" if record.ecc_uncorrected else ""),
            actor,
        )
    if ecc is not None:
        record.ecc_uncorrected = ecc
    was_healthy = stored["healthy"] if stored is not None else True
    if bool(gpu.get("healthy", True)) != was_healthy or (
        not was_healthy and stored["health_reason"] != gpu.get("health_reason")
    ):
        text = (
            "healthy again"
            if gpu.get("healthy", True)
            else f"unhealthy: {gpu.get('health_reason') or '?'}"
        )
        _event(
            now,
            record.serial,
            "gpu.health",
            f"{text} (node {node.id}, {node.hostname}, GPU {gpu['index']})",
            actor,
        )


def serials_of(node_id):
    """{index: (uuid, serial)} of the node's stored GPUs that have a serial."""
    return {
        g.index: (g.uuid, g.serial)
        for g in Gpu.select(Gpu.index, Gpu.uuid, Gpu.serial).where(
            (Gpu.node == node_id) & Gpu.serial.is_null(False)
        )
    }


def record_validation(node_id, validation_id, checks, passed, now):
    """Each GPU of the node with a serial gets the validation's verdict in its history."""
    for index, (uuid, serial) in sorted(serials_of(node_id).items()):
        failed = [
            c for c in checks if not c["passed"] and (c.get("gpu") == index or c.get("gpu") is None)
        ]
        verdict = (
            "failed: " + "; ".join(f"{c['name']}: {c['detail']}" for c in failed)
            if failed
            else "passed"
        )
        if not passed and not failed:
            verdict = "passed its own checks; the node failed others"
        _event(
            now,
            serial,
            "gpu.validation",
            f"validation {validation_id} in node {node_id}, GPU {index}: {verdict}",
        )
        for check in checks:
            if check.get("gpu") == index and check.get("uuid") in (None, uuid):
                check.setdefault("serial", serial)


def record_health_action(node_id, step, reason, now):
    """The health policy acted on the node (cordon, drain, return): each unhealthy GPU's history
    says so."""
    rows = Gpu.select(Gpu.index, Gpu.serial, Gpu.healthy).where(
        (Gpu.node == node_id) & Gpu.serial.is_null(False)
    )
    for gpu in rows:
        if not gpu.healthy or step == "return":
            _event(
                now,
                gpu.serial,
                "gpu.health",
                f"health policy {step} of node {node_id} (GPU {gpu.index}): {reason}",
                FLEETD,
            )


def rma_marked_on(node_id):
    """[(index, uuid, serial, reason)] of the node's GPUs whose boards are marked for RMA."""
    by_serial = {serial: (index, uuid) for index, (uuid, serial) in serials_of(node_id).items()}
    if not by_serial:
        return []
    rows = GpuRecord.select(GpuRecord.serial, GpuRecord.rma).where(
        GpuRecord.serial.in_(list(by_serial)) & GpuRecord.rma.is_null(False)
    )
    return sorted(
        (by_serial[r.serial][0], by_serial[r.serial][1], r.serial, r.rma.get("reason", ""))
        for r in rows
    )


def node_hostname(node_id):
    """The hostname of a node, or None."""
    return Node.select(Node.hostname).where(Node.id == node_id).scalar() if node_id else None
