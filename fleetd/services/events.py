"""Events: the audit trail of state changes."""

import contextlib
import contextvars

from fleetd.models import Event
from fleetd.services.pagination import paginate
from fleetd.sql import insert_row

_batch = contextvars.ContextVar("fleetd_event_batch", default=None)
BATCH_ROWS = 200  # rows per INSERT (7 columns each: well under SQLite's bound variables)


def record_event(now, kind, subject_type, subject_id, reason, from_status=None, to_status=None):
    """Write one Event (call inside the transaction that made the change); inside `batched()` it
    is written with the others of the batch."""
    row = {"at": now, "kind": kind, "subject_type": subject_type, "subject_id": subject_id,
           "from_status": from_status, "to_status": to_status, "reason": reason}
    rows = _batch.get()
    if rows is not None:
        rows.append(row)
    else:
        insert_row(Event, row)


@contextlib.contextmanager
def batched():
    """Events recorded inside are written in a few multi-row INSERTs when it ends (use it inside
    the transaction that makes the changes, so that they commit together)."""
    rows = []
    token = _batch.set(rows)
    try:
        yield
    finally:
        _batch.reset(token)
    if len(rows) <= 4:  # the usual pass places a job or two: compiled single-row inserts are cheaper
        for row in rows:
            insert_row(Event, row)
        return
    for start in range(0, len(rows), BATCH_ROWS):
        Event.insert_many(rows[start:start + BATCH_ROWS]).execute()


def list_events(subject_type, subject_id, limit, cursor=None, after=None):
    """Events of one subject, oldest first, after an event id if given."""
    query = Event.select().where((Event.subject_type == subject_type) & (Event.subject_id == subject_id))
    if after is not None:
        query = query.where(Event.id > after)
    return paginate(query, Event.id, limit, cursor)
