"""Events: the audit trail of state changes."""

import contextlib
import contextvars

from fleetd.models import Event
from fleetd.services.pagination import paginate
from fleetd.sql import insert_row

_batch = contextvars.ContextVar("fleetd_event_batch", default=None)


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
    """Events recorded inside are written together when it ends (use it inside the transaction
    that makes the changes, so that they commit together)."""
    rows = []
    token = _batch.set(rows)
    try:
        yield
    finally:
        _batch.reset(token)
    # One compiled single-row INSERT per event: a third of the CPU of peewee's multi-row insert_many,
    # which builds its SQL anew each time (7 rows: 0.15 against 0.46 ms; 200 rows: 2.9 against 10.4).
    for row in rows:
        insert_row(Event, row)


def list_events(subject_type, subject_id, limit, cursor=None, after=None):
    """Events of one subject, oldest first, after an event id if given."""
    query = Event.select().where((Event.subject_type == subject_type) & (Event.subject_id == subject_id))
    if after is not None:
        query = query.where(Event.id > after)
    return paginate(query, Event.id, limit, cursor)
