"""Database binding: one DatabaseProxy for the models, bound from a URL at start-up."""

import os

import peewee
from playhouse import db_url
from playhouse.migrations import Runner
from playhouse.pool import PooledPostgresqlDatabase, PooledSqliteDatabase

database = peewee.DatabaseProxy()

MIGRATIONS_DIR = os.path.join(os.path.dirname(__file__), "migrations")
_SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}


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
        return PooledSqliteDatabase(
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


def write_transaction():
    """A transaction for read-modify-write: BEGIN IMMEDIATE on SQLite, so writers queue up front."""
    if isinstance(database.obj, peewee.SqliteDatabase):
        return database.atomic("IMMEDIATE")
    return database.atomic()


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
