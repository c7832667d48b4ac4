"""Instance volumes in the ledger: storage cost per GB-month (the storage price, months in UTC) from
an instance's first start (its node made the volume, and it fitted) to its deletion."""

import datetime as dt

from fleetd.db import write_transaction
from fleetd.models import (
    Event,
    Instance,
    InstanceState,
    Node,
    StorageRecord,
)
from fleetd.services.accounting.periods import GB, STORAGE, month_seconds, split_days


def _first_event(instance_id, to_status):
    row = (
        Event.select(Event.at)
        .where(
            (Event.subject_type == "instance")
            & (Event.subject_id == instance_id)
            & (Event.to_status == to_status)
        )
        .order_by(Event.id)
        .first()
    )
    return row.at if row is not None else None


def storage_cost(volume_bytes, book, start, end):
    """Cost of a volume over [start, end) at the storage prices in force, per GB-month of each UTC
    month."""
    total = 0.0
    for a, b in split_days(start, end):
        for pa, pb, price in book.pieces(STORAGE, "", a, b):
            total += (
                volume_bytes / GB * (price or 0.0) * (pb - pa).total_seconds() / month_seconds(pa)
            )
    return total


def _first_runs(instance_ids):
    """{instance id: when its process first started}: its volume was made, and fitted on its node,
    then (a run that never started, its volume refused for want of room on the node, left no volume
    to bill)."""
    out: dict[str, dt.datetime] = {}
    for subject, at in (
        Event.select(Event.subject_id, Event.at)
        .where(
            (Event.subject_type == "instance")
            & Event.subject_id.in_(instance_ids)
            & (Event.to_status == InstanceState.RUNNING.value)
        )
        .order_by(Event.id)
        .tuples()
        .execute()
    ):
        out.setdefault(subject, at)
    return out


def _withdraw(run, record):
    """Take back all a volume's row accounted, from the sums too, and delete it (inside the batch's
    transaction): the prices are kept, so the same pieces come out."""
    for a, b in split_days(record.started_at, record.accounted_until):
        run.add(a, STORAGE, record, cost=-storage_cost(record.volume_bytes, run.book, a, b))
    record.delete_instance()


def flush_volumes(run, batch):
    """Account instance volumes: from their first start (the volume made) until their deletion;
    returns how many."""
    live = list(
        Instance.select(Instance.id).where(
            (Instance.state != InstanceState.DELETED.value) & Instance.node_id.is_null(False)
        )
    )
    open_ids = [
        r.id for r in StorageRecord.select(StorageRecord.id).where(StorageRecord.ended_at.is_null())
    ]
    ids = sorted({i.id for i in live} | set(open_ids))
    for i in range(0, len(ids), batch):
        with write_transaction():
            chunk = ids[i : i + batch]
            instances = {inst.id: inst for inst in Instance.select().where(Instance.id.in_(chunk))}
            records = {r.id: r for r in StorageRecord.select().where(StorageRecord.id.in_(chunk))}
            started = _first_runs(chunk)
            for instance_id in chunk:
                inst, record = instances.get(instance_id), records.get(instance_id)
                gone = inst is None or inst.state == InstanceState.DELETED.value
                if record is None:
                    volume = inst.instance_spec.volume_bytes if inst is not None else 0
                    first = started.get(instance_id)
                    if inst is None or gone or not volume or first is None:
                        continue
                    node = Node.select(Node.fleet).where(Node.id == inst.node_id).first()
                    record = StorageRecord(
                        id=inst.id,
                        owner=inst.owner,
                        owner_token_id=inst.owner_token_id,
                        team=inst.team or "",
                        project=inst.project or "",
                        fleet=node.fleet_id if node is not None else "",
                        volume_bytes=volume,
                        started_at=first,
                        accounted_until=first,
                    )
                    record.save(force_insert=True)
                elif record.ended_at is not None:
                    continue
                elif inst is not None and instance_id not in started:
                    _withdraw(
                        run, record
                    )  # billed from a placement by an older fleetd: its run never started
                    continue
                until = run.now
                if gone:
                    until = (
                        _first_event(instance_id, InstanceState.DELETED.value)
                        if inst is not None
                        else None
                    ) or run.now
                until = max(until, record.accounted_until)
                cost = 0.0
                for a, b in split_days(record.accounted_until, until):
                    piece = storage_cost(record.volume_bytes, run.book, a, b)
                    cost += piece
                    run.add(a, STORAGE, record, cost=piece)
                record.cost += cost
                record.accounted_until = until
                if gone:
                    record.ended_at = until
                record.save()
            run.write_days()
    return len(ids)
