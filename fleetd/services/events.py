"""Events: the audit trail of state changes."""

from fleetd.models import Event
from fleetd.services.pagination import paginate
from fleetd.sql import insert_row


def record_event(now, kind, subject_type, subject_id, reason, from_status=None, to_status=None):
    """Write one Event (call inside the transaction that made the change), through a compiled
    INSERT: peewee's Event.create and insert_many build their SQL anew each time."""
    insert_row(Event, {"at": now, "kind": kind, "subject_type": subject_type, "subject_id": subject_id,
                       "from_status": from_status, "to_status": to_status, "reason": reason})


def list_events(subject_type, subject_id, limit, cursor=None, after=None):
    """Events of one subject, oldest first, after an event id if given."""
    query = Event.select().where((Event.subject_type == subject_type) & (Event.subject_id == subject_id))
    if after is not None:
        query = query.where(Event.id > after)
    return paginate(query, Event.id, limit, cursor)
