"""Small helpers the pages share."""

import collections

from flask import g

from fleetd.errors import Forbidden

# Reading a whole history to show its end is bounded: past this many rows the page says so.
TAIL_SCAN_LIMIT = 50_000
PAGE = 1000


def tail(fetch, count, scan_limit=TAIL_SCAN_LIMIT):
    """The last `count` rows of an oldest-first list, read page by page with fetch(after_id).

    Returns (rows, complete): complete is False when the list is longer than `scan_limit`
    and the rows shown are the end of its first `scan_limit` rows.
    """
    kept = collections.deque(maxlen=count)
    after, scanned = None, 0
    while scanned < scan_limit:
        rows = fetch(after)
        kept.extend(rows)
        scanned += len(rows)
        if len(rows) < PAGE:
            return list(kept), True
        after = rows[-1].id
    return list(kept), False


def allow(allowed):
    """Forbidden unless the signed-in principal's role is in `allowed`."""
    principal = g.ui_principal
    if principal.role not in allowed:
        raise Forbidden(f"your token's role ({principal.role}) may not do this")
    return principal


def confirmed(form):
    """Whether a POST comes from the confirmation step of an action."""
    return form.get("confirm") == "yes"
