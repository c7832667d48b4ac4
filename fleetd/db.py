"""Database binding: one DatabaseProxy for the models, bound from a URL at start-up."""

import contextlib
import os
import threading

import peewee
from playhouse import db_url
from playhouse.migrations import Runner
from playhouse.pool import PooledPostgresqlDatabase, PooledSqliteDatabase

database = peewee.DatabaseProxy()

MIGRATIONS_DIR = os.path.join(os.path.dirname(__file__), "migrations")
_SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}


_offload = None  # runs a blocking call off the event loop (gevent's threadpool), set by `fleetd serve`
_writer = threading.RLock()  # under gevent a greenlet lock: writers queue here, not in SQLite's busy wait


def offload_commits(run):
    """Run each SQLite COMMIT through `run(fn)` (or inline, with None).

    `fleetd serve` hands commits to gevent's threadpool: with synchronous=FULL a commit waits
    for fsync, and done inline that wait would stop every other request of the process.
    sqlite3 releases the GIL while it commits, so requests go on meanwhile; the writer lock
    of write_transaction() keeps the next writer from spinning in SQLite's busy handler.
    """
    global _offload
    _offload = run


class _SqliteDatabase(PooledSqliteDatabase):
    def commit(self):
        run = _offload
        if run is None:
            return super().commit()
        if self.is_closed():
            raise peewee.InterfaceError("Cannot commit, database connection not open.")
        cursor = self.cursor()
        with peewee.__exception_wrapper__:
            run(lambda: cursor.execute("COMMIT"))


def open_database(url, sqlite_synchronous="FULL"):
    """Create (not connect) a Peewee database for a sqlite:// or postgresql:// URL."""
    if url.startswith("sqlite:"):
        sync = sqlite_synchronous.upper()
        if sync not in _SYNCHRONOUS:
            raise ValueError(f"sqlite_synchronous must be one of {sorted(_SYNCHRONOUS)}")
        path = db_url.parse(url)["database"]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        # Pooled: a connection (and its PRAGMAs) is made once and reused by later requests.
        return _SqliteDatabase(
            path,
            max_connections=0,
            stale_timeout=300,
            check_same_thread=False,  # a pooled connection moves between threads, one at a time
            pragmas={
                "journal_mode": "wal",
                "foreign_keys": 1,
                "synchronous": sync,
                "busy_timeout": 15000,
            },
            timeout=15,
        )
    if url.startswith(("postgresql://", "postgres://")):
        parsed = db_url.parse(url)
        # Bounded pool: PostgreSQL connections are costly and limited on the server.
        return PooledPostgresqlDatabase(parsed.pop("database"), max_connections=32, stale_timeout=300, **parsed)
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://...")


def bind(db):
    """Point every model at this database."""
    database.initialize(db)
    return db


@contextlib.contextmanager
def write_transaction():
    """A transaction for read-modify-write: BEGIN IMMEDIATE on SQLite, so writers queue up front
    (in the process's writer lock first, then in SQLite's lock for other processes)."""
    if not isinstance(database.obj, peewee.SqliteDatabase):
        with database.atomic() as txn:
            yield txn
        return
    with _writer, database.atomic("IMMEDIATE") as txn:
        yield txn


def upgrade(db=None):
    """Apply pending numbered migrations; returns their names."""
    db = db or database.obj
    with db.connection_context():
        return Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up()


def pending_migrations(db=None):
    """Names of migrations not yet applied."""
    db = db or database.obj
    with db.connection_context():
        return [m.name for m in Runner(db, MIGRATIONS_DIR, table_name="schema_migration").status() if not m.applied]
