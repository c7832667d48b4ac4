"""The base of every model: ids, JSON columns, saves and reads by primary key compiled once."""

import json
import os
import time

import peewee

from fleetd import sql
from fleetd.db import database


def new_id():
    """A 20-hex-character id that sorts by creation time (ms) and is unguessable enough."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(4).hex()}"


class JSONText(peewee.TextField):
    """JSON stored as text, so SQLite and PostgreSQL behave the same."""

    def db_value(self, value):
        return None if value is None else json.dumps(value, sort_keys=True)

    def python_value(self, value):
        return None if value is None else json.loads(value)


def transition_table(states, table):
    """{state: frozenset of the states it may go to} from {"state": "to to ..."}, which names every
    state."""
    out = {
        states(state): frozenset(states(to) for to in targets.split())
        for state, targets in table.items()
    }
    missing = set(states) - set(out)
    if missing:
        raise ValueError(f"transition table lacks {sorted(s.value for s in missing)}")
    return out


class BaseModel(peewee.Model):
    """Saves and reads by primary key run statements compiled once (fleetd.sql), not recompiled
    by peewee on each call; anything else is plain peewee.

    A save writes the fields set since the row was read (all of them for a new row), as
    peewee's only_save_dirty does: an UPDATE that names a column rewrites its index entries even
    when the value is the same, and would also put back what another transaction changed in a
    column this one never touched. A field is set by assigning it; mutating a JSON value in
    place does not count (no code does).
    """

    class Meta:
        database = database
        legacy_table_names = False

    def save(self, force_insert=False, only=None):
        meta = self._meta
        pk_value = self._pk  # type: ignore[attr-defined]  # peewee's own stubs lack Model._pk and _dirty
        if (
            only is None
            and pk_value is not None
            and not meta.composite_key
            and meta.primary_key is not False
        ):
            data = self.__data__
            dirty = self._dirty  # type: ignore[attr-defined]  # the set of fields assigned since the load
            if force_insert:
                sql.insert_row(type(self), data.copy())
                dirty.clear()
                return 1
            field_dict = {name: data[name] for name in dirty if name in data}
            field_dict.pop(meta.primary_key.name, None)
            if not field_dict:
                return 0
            rows = sql.save_by_pk(self, field_dict)
            dirty -= set(field_dict)
            return rows
        return super().save(force_insert=force_insert, only=only)

    @classmethod
    def get_by_id(cls, pk):
        row = cls.get_or_none_by_id(pk)
        if row is None:
            # ModelBase makes each model's DoesNotExist; peewee's stubs do not declare it.
            raise cls.DoesNotExist(f"{cls.__name__} {pk!r} does not exist")  # type: ignore[attr-defined]
        return row

    @classmethod
    def get_or_none_by_id(cls, pk):
        """The row with this primary key, or None."""
        return sql.by_pk(cls).first(pk=pk)
