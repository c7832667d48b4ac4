"""Peewee statements compiled to SQL once and run again with new values.

Peewee turns a query into SQL by walking its expression tree on every execution; on the hot
paths of the agent protocol (a row by id, a state change, an event) that walk costs more CPU
than SQLite spends running the statement. A `Statement` builds its query once per database
dialect with markers where the values go, keeps the SQL text, and afterwards only binds the
values, converted by the same field converters peewee would use. The queries stay peewee
queries, written and checked once, portable between SQLite and PostgreSQL.

    TASK_BY_ID = Statement(lambda v: Task.select().where(Task.id == v("id")).limit(1))
    task = TASK_BY_ID.first(id=task_id)
"""

import threading

import peewee

from fleetd.db import database, execute_many


class _Slot:
    """Where one named value goes in a compiled statement."""

    __slots__ = ("name", "convert")

    def __init__(self, name, convert):
        self.name = name
        self.convert = convert


class Statement:
    """One query shape: `build(v)` returns the peewee query, with `v(name, field=None)` where a
    value goes (`field`: convert the value with that field's db_value, as peewee does for SET
    and VALUES; comparisons to plain columns need none)."""

    def __init__(self, build):
        self._build = build
        self._compiled = {}  # database class -> (model, sql, params: constants and _Slots)
        self._lock = threading.Lock()

    def _get(self):
        key = type(database.obj)
        compiled = self._compiled.get(key)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(key) or self._compile(key)
        return compiled

    def _compile(self, key):
        slots: dict[str, _Slot] = {}

        def value(name, field=None):
            slot = slots.get(name)
            if slot is None:
                slot = slots[name] = _Slot(name, field.db_value if field is not None else None)
            return peewee.Value(slot, converter=False)

        query = self._build(value)
        sql, params = query.sql()
        model = getattr(query, "model", None)
        columns = None
        if isinstance(query, peewee.Select) and model is not None:
            returning = query._returning  # type: ignore[attr-defined]  # peewee's stubs lack Select._returning
            if all(isinstance(f, peewee.Field) and f.model is model for f in returning):
                columns = tuple((f.name, f.python_value) for f in returning)
        compiled = (model, sql, tuple(params), columns)
        self._compiled[key] = compiled
        return compiled

    @staticmethod
    def _bind(params, values):
        out = []
        for param in params:
            if type(param) is _Slot:
                value = values[param.name]
                out.append(param.convert(value) if param.convert is not None else value)
            else:
                out.append(param)
        return out

    def rows(self, **values):
        """Model instances of a SELECT."""
        model, sql, params, columns = self._get()
        if columns is None:  # columns of other models: peewee maps them
            return list(model.raw(sql, *self._bind(params, values)))
        return self.instances(database.execute_sql(sql, self._bind(params, values)).fetchall())

    def instances(self, rows):
        """Model instances of rows that raw_tuples() returned (no database: any thread may do
        it)."""
        model, _sql, _params, columns = self._get()
        out = []
        for row in rows:
            # What peewee's cursor wrapper does, without matching column names on every query.
            instance = model.__new__(model)
            instance.__data__ = {
                name: None if value is None else convert(value)
                for (name, convert), value in zip(columns, row)
            }
            instance._dirty = set()
            instance.__rel__ = {}
            out.append(instance)
        return out

    def first(self, **values):
        """The first model instance of a SELECT, or None."""
        rows = self.rows(**values)
        return rows[0] if rows else None

    def raw_tuples(self, pause=None, **values):
        """Rows of a SELECT as the driver returns them, no field conversion (the caller converts).
        With `pause`, rows are fetched a chunk at a time and pause() is called between chunks
        (fleetd serve: a yield to the event loop, so a read of every node and GPU does not hold
        it)."""
        _model, sql, params, _columns = self._get()
        cursor = database.execute_sql(sql, self._bind(params, values))
        return cursor.fetchall() if pause is None else fetch_in_chunks(cursor, pause)

    def execute(self, **values):
        """Run an INSERT, UPDATE or DELETE; returns the rows it changed."""
        _model, sql, params, _columns = self._get()
        return database.execute_sql(sql, self._bind(params, values)).rowcount

    def execute_many(self, rows):
        """Run an INSERT, UPDATE or DELETE once per dict of values in `rows`, in one call to the
        driver (db.execute_many: one round trip to PostgreSQL for up to 100 of them)."""
        _model, sql, params, _columns = self._get()
        execute_many(sql, [self._bind(params, values) for values in rows])


FETCH_CHUNK = 2000  # rows fetched between two pauses: a few milliseconds of SQLite's work


def fetch_in_chunks(cursor, pause):
    """Every row of `cursor`, FETCH_CHUNK at a time, calling pause() between two chunks."""
    rows, size = [], FETCH_CHUNK
    while True:
        chunk = cursor.fetchmany(size)
        rows += chunk
        if len(chunk) < size:
            return rows
        pause()


_BY_PK: dict = {}  # model -> Statement selecting one row by primary key
_SAVES: dict = {}  # (model, field names) -> Statement updating those fields by primary key
_INSERTS: dict = {}  # (model, field names) -> Statement inserting a row with those fields
_CACHE_LOCK = threading.Lock()


def _cached(cache, key, build):
    statement = cache.get(key)
    if statement is None:
        with _CACHE_LOCK:
            statement = cache.setdefault(key, Statement(build))
    return statement


def by_pk(model):
    """The Statement that selects one row of `model` by its primary key (value `pk`)."""
    return _cached(
        _BY_PK, model, lambda v: model.select().where(model._meta.primary_key == v("pk")).limit(1)
    )


def save_by_pk(instance, field_dict):
    """UPDATE `field_dict` (names -> values) of the row of `instance` by its primary key."""
    model = type(instance)
    pk = model._meta.primary_key
    names = tuple(sorted(field_dict))
    fields = model._meta.fields

    def build(v):
        return model.update({fields[n]: v(n, fields[n]) for n in names}).where(
            pk == v("__pk__", pk)
        )

    statement = _cached(_SAVES, (model, names), build)
    return statement.execute(__pk__=instance._pk, **field_dict)


def _insert(model, names):
    fields = model._meta.fields

    def build(v):
        return model.insert({fields[n]: v(n, fields[n]) for n in names})

    return _cached(_INSERTS, (model, names), build)


def insert_row(model, field_dict):
    """INSERT one row of `model` with `field_dict` (its primary key among them unless it is
    automatic)."""
    return _insert(model, tuple(sorted(field_dict))).execute(**field_dict)


def insert_rows(model, field_dicts):
    """INSERT rows of `model`, each a dict of the same field names (insert_many without compiling
    the statement anew each time)."""
    if field_dicts:
        _insert(model, tuple(sorted(field_dicts[0]))).execute_many(field_dicts)
