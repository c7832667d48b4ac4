"""What a scheduling pass reads of the queue: every queued job, or, with groups parked, only
the jobs that do not know why they wait yet, the first job of the parked groups it asks again,
and a count of the rest of each group."""

import typing

import peewee

from fleetd import windows
from fleetd.db import database
from fleetd.models import Job, JobState
from fleetd.services.placement.inventory import raw_rows
from fleetd.services.placement.terms import group_key
from fleetd.sql import Statement

PRIORITY_ORDER = {"on-demand": 0, "spot": 1}


class Queued(typing.NamedTuple):
    """What a pass reads of a queued job (its spec is in the terms cache)."""

    id: str
    team: str
    priority_class: str
    pending_reason: str


_PLACEMENT_ORDER = (peewee.Case(Job.priority_class, list(PRIORITY_ORDER.items()), 9), Job.id)
_QUEUED = Statement(
    lambda v: (
        Job.select(Job.id, Job.team, Job.priority_class, Job.pending_reason)
        .where(Job.state == JobState.QUEUED.value)
        .order_by(*_PLACEMENT_ORDER)
    )
)


# Parked groups a kicked pass leaves out of its read (more: it reads all); two parameters each.
MAX_UNREAD_GROUPS = 10_000


def _told(parked):
    """A queued job is of a parked group and says its reason: one row value IN a VALUES list made
    as text (peewee's walk of an expression per group cost more than the read)."""
    param = database.obj.param  # the driver's placeholder: ? (SQLite) or %s (PostgreSQL)
    values = ", ".join([f"({param}, {param})"] * len(parked))
    pairs = [v for key, reason in parked.items() for v in (group_key(key), reason)]
    return peewee.Expression(
        peewee.Tuple(Job.group_key, Job.pending_reason),
        "IN",
        peewee.SQL(f"(VALUES {values})", pairs),
    )


def opened_since(inventory, now):
    """opened(at, fleet): whether an availability window of that fleet (of any, for None) opened
    after `at` and by `now` (what no event announces)."""
    timed = [(name, f.availability) for name, f in inventory.fleets.items() if f.availability]
    memo: dict = {}

    def opened(at, fleet):
        if not timed:
            return False
        if (at, fleet) not in memo:
            memo[(at, fleet)] = any(
                fleet in (None, name)
                and (opens := windows.next_open_at(availability, at)) is not None
                and opens <= now
                for name, availability in timed
            )
        return memo[(at, fleet)]

    return opened


def read_queue(parked, first_of=False):
    """(the queued jobs to read, in placement order, [(group key, jobs, one job id)] of those left
    unread). A pass that skips parked groups (`parked`: {group: reason}) does not read their jobs
    that already say why they wait: a parked backlog of thousands costs it one count per group,
    not a row per job. With `first_of_each` (a pass that looks at every group) the first of those
    jobs of each parked group is read too, and is no longer counted among the unread: the group
    is asked once, as always, through it; `first_of` a set of parked groups: of those only.
    Jobs with no group key (stored before it existed) are always read."""
    if not parked or len(parked) > MAX_UNREAD_GROUPS:
        return list(map(Queued._make, _QUEUED.raw_tuples())), []
    told = _told(parked)
    queued = Job.state == JobState.QUEUED.value
    # A group shares its priority class, so its first job in placement order is its lowest id.
    unread = raw_rows(
        Job.select(Job.group_key, peewee.fn.COUNT(Job.id), peewee.fn.MIN(Job.id))
        .where(queued & Job.group_key.is_null(False) & told)
        .group_by(Job.group_key)
    )
    read = Job.group_key.is_null() | ~told
    if first_of is not True and first_of:
        keys = {group_key(key) for key in first_of}
        asked = [row for row in unread if row[0] in keys]
    else:
        asked = unread if first_of else []
    if asked:
        read |= Job.id.in_([first for _, _, first in asked])
        keys = {row[0] for row in asked}
        unread = [
            (key, count - 1, first) if key in keys else (key, count, first)
            for key, count, first in unread
            if key not in keys or count > 1
        ]
    columns = (Job.id, Job.team, Job.priority_class, Job.pending_reason)
    rows = raw_rows(Job.select(*columns).where(queued & read).order_by(*_PLACEMENT_ORDER))
    return list(map(Queued._make, rows)), unread


def unread_requests(terms_cache, unread):
    """[(request, jobs)] of the unread groups, from one job of each (its terms are cached)."""
    terms, _failed = terms_cache.get_each(
        [some for _, _, some in unread]
    )  # a failed one is read next time
    return [(terms[some].request, count) for _, count, some in unread if some in terms]
