"""Events: the audit trail of state changes, and who caused each one (its actor)."""

import contextlib
import contextvars

from fleetd.models import Event, Node
from fleetd.services.notify import webhooks
from fleetd.services.pagination import paginate
from fleetd.sql import insert_row

# fleetd's own decisions (liveness, leases, drains' deadlines, the scheduler, the health policy).
FLEETD = "fleetd"
ACTOR_MAX = 200

# Who the code running now acts for. Greenlets and threads each have their own context, so a
# request's actor never leaks into another request or into a background task.
_ACTOR = contextvars.ContextVar("fleetd_actor", default=None)


@contextlib.contextmanager
def acting_as(actor):
    """Record the events written inside this block as caused by `actor` (token:<name>,
    node:<id> or fleetd), unless a call names another actor itself."""
    token = _ACTOR.set(actor)
    try:
        yield
    finally:
        _ACTOR.reset(token)


# Who the request being served acts for: (its principal's label, its API token's id or None, how it
# authenticated or None), set by the API layer once it authenticated the request (enter_request) and
# reset when the request ends.
_REQUEST: contextvars.ContextVar[tuple[str, str | None, str | None] | None] = (
    contextvars.ContextVar("fleetd_request_actor", default=None)
)


def enter_request(label, token_id=None, via=None):
    """The API layer: the request being served acts for `label` (the id of its API token, when it
    has one; `via`: how it authenticated, token:<name> or session); returns what leave_request takes
    when the request ends."""
    return _REQUEST.set((label, token_id, via))


def leave_request(entered):
    """The API layer: the request that enter_request() named ended."""
    _REQUEST.reset(entered)


def current_actor():
    """The actor of the code running now: the innermost acting_as, else the authenticated
    principal of this request (API token or UI session), else fleetd."""
    actor = _ACTOR.get()
    if actor is not None:
        return actor
    request = _REQUEST.get()
    return request[0] if request is not None else FLEETD


def actor_token_id(actor):
    """The id of the API token that `actor` names, when it is this request's own token (its label):
    two tokens may have had one name over time, their ids tell them apart. None for nodes, fleetd
    and outside requests."""
    request = _REQUEST.get()
    if request is not None and request[1] is not None and request[0] == actor:
        return request[1]
    return None


def actor_via(actor):
    """How `actor` authenticated, when it is this request's own principal (its label): token:<name>
    for an API token (a user's own token too: its actor is user:<login>), session for a user's
    signed-in session, jwt for a workload's JWT. None for nodes, fleetd and outside requests."""
    request = _REQUEST.get()
    if request is not None and request[0] == actor:
        return request[2]
    return None


def record_event(
    now,
    kind,
    subject_type,
    subject_id,
    reason,
    from_status=None,
    to_status=None,
    actor=None,
    data=None,
):
    """Write one Event (call inside the transaction that made the change), through a compiled
    INSERT: peewee's Event.create and insert_many build their SQL anew each time. `actor`: who
    caused it; by default the actor of the code running now (current_actor). An event that
    webhooks receive (webhooks.webhook_kind) queues their deliveries in the same transaction, with
    `data` added to what they carry. Returns the actor."""
    actor = (actor or current_actor())[:ACTOR_MAX]
    token_id = actor_token_id(actor)
    via = actor_via(actor)
    insert_row(
        Event,
        {
            "at": now,
            "kind": kind,
            "subject_type": subject_type,
            "subject_id": subject_id,
            "from_status": from_status,
            "to_status": to_status,
            "reason": reason,
            "actor": actor,
            "actor_token_id": token_id,
            "actor_via": via,
        },
    )
    notify = webhooks.webhook_kind(kind, from_status, to_status)
    if notify is not None:

        def carried():  # built only when a webhook receives it (a node's names cost a read)
            # a receiver names the host, even of a node deleted since
            names = _node_names(subject_id) if subject_type == "node" else {}
            return dict(
                {**names, **(data or {})},
                from_status=from_status,
                to_status=to_status,
                reason=reason,
                actor=actor,
                actor_token_id=token_id,
                actor_via=via,
            )

        webhooks.enqueue(now, notify, f"{subject_type}/{subject_id}", carried)
    return actor


def _node_names(node_id):
    """{hostname, fleet} of a node, for the webhooks of its events ({} once it is gone)."""
    node = Node.select(Node.hostname, Node.fleet).where(Node.id == node_id).first()
    return {"hostname": node.hostname, "fleet": node.fleet_id} if node is not None else {}


def list_events(subject_type, subject_id, limit, cursor=None, after=None):
    """Events of one subject, oldest first, after an event id if given."""
    query = Event.select().where(
        (Event.subject_type == subject_type) & (Event.subject_id == subject_id)
    )
    if after is not None:
        query = query.where(Event.id > after)
    return paginate(query, Event.id, limit, cursor)
