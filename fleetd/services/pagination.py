"""Keyset pagination done by the database: ORDER BY key, LIMIT n+1, opaque cursors."""

import base64
import binascii
import json

import peewee

from fleetd.errors import InvalidRequest


def encode_cursor(key):
    """Opaque cursor for the last key of a page."""
    return base64.urlsafe_b64encode(json.dumps([key]).encode()).decode().rstrip("=")


def decode_cursor(cursor, key_type=str):
    """The key inside a cursor; InvalidRequest if it is not one of ours."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        (key,) = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, TypeError, UnicodeError, binascii.Error):
        raise InvalidRequest("invalid cursor", {"cursor": cursor[:100]}) from None
    if type(key) is not key_type:
        raise InvalidRequest("invalid cursor", {"cursor": cursor[:100]})
    return key


def paginate(query, key_field, limit, cursor=None):
    """One page of `query` ordered by `key_field`: (rows, next_cursor or None)."""
    if cursor:
        key_type = int if isinstance(key_field, peewee.IntegerField) else str
        query = query.where(key_field > decode_cursor(cursor, key_type))
    rows = list(query.order_by(key_field).limit(limit + 1))
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, encode_cursor(getattr(rows[-1], key_field.name))


def attach(parents, children, key, attr):
    """Give each parent the list of its children (one query): children.where(key IN parent ids)."""
    by_id = {p.id: p for p in parents}
    for parent in parents:
        setattr(parent, attr, [])
    if by_id:
        for child in children.where(key.in_(list(by_id))):
            getattr(by_id[getattr(child, key.name + "_id")], attr).append(child)
    return parents


def last_rows(query, key_field, count):
    """The last `count` rows by `key_field`, oldest first (the database does the limiting)."""
    return list(reversed(list(query.order_by(key_field.desc()).limit(count))))
