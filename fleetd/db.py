"""Database binding: one DatabaseProxy for the models, bound from a URL at start-up."""

import contextlib
import contextvars
import os
import threading

import peewee
from playhouse import db_url
from playhouse.migrations import Runner
from playhouse.pool import PooledPostgresqlDatabase, PooledSqliteDatabase

database = peewee.DatabaseProxy()

MIGRATIONS_DIR = os.path.join(os.path.dirname(__file__), "migrations")
_SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}


class GroupCommit:
    """Acknowledged writes are on disk, with one fsync for many commits (group commit).

    fleetd serve runs SQLite with synchronous=NORMAL (a commit appends to the WAL, no fsync)
    and, before answering a request that wrote, waits for an fsync of the WAL that started
    after its writes. Syncs run one at a time, so every request that wrote while one ran is
    covered by the next: under load one fsync serves many requests, alone it is one per
    request as with synchronous=FULL. The WAL only grows by appending committed frames and is
    synced before each checkpoint, so what a request was told is committed survives a power
    loss, as with FULL; writes not yet acknowledged may not (as with FULL, mid-commit).
    """

    def __init__(self, wal_path, run=None):
        self.wal_path = wal_path
        self.run = run or (lambda fn: fn())  # off the event loop under gevent
        self.started = 0  # syncs begun
        self.done = 0  # syncs finished
        self._lock = threading.Lock()  # one sync at a time; a greenlet lock under gevent

    def wait(self):
        """Return once an fsync that began after this call's caller wrote has finished."""
        need = self.started + 1
        with self._lock:
            if self.done >= need:  # a sync began after our writes while we queued: it covers us
                return
            self.started += 1
            self.run(self._fsync)
            self.done = self.started

    def _fsync(self):
        try:
            fd = os.open(self.wal_path, os.O_RDONLY)
        except FileNotFoundError:  # no WAL: everything was checkpointed into the (synced) database
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_group_commit = None
_wrote = contextvars.ContextVar("fleetd_wrote", default=False)
_READ_ONLY = ("SELECT", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "PRAGMA")


def enable_group_commit(group_commit):
    """Make write requests wait for `group_commit` (a GroupCommit), or stop that with None."""
    global _group_commit
    _group_commit = group_commit


def request_started():
    """Forget earlier writes of this greenlet (called when a request starts)."""
    if _group_commit is not None:
        _wrote.set(False)


def request_durable():
    """Before a response goes out: if the request wrote, wait until its writes are on disk."""
    if _group_commit is not None and _wrote.get():
        _group_commit.wait()
        _wrote.set(False)


def execute_many(sql, rows):
    """Run one write statement once per row of parameters in `rows`, counted as a write for group
    commit. On PostgreSQL the rows go 100 to a round trip (psycopg2's executemany sends each
    alone: a registration's eight GPU rows were eight waits on the server)."""
    if not rows:
        return
    if _group_commit is not None:
        _wrote.set(True)
    cursor = database.cursor()
    if isinstance(database.obj, peewee.PostgresqlDatabase):
        import psycopg2.extras  # only where PostgreSQL is in use

        psycopg2.extras.execute_batch(cursor, sql, rows, page_size=100)
    else:
        cursor.executemany(sql, rows)


class _SqliteDatabase(PooledSqliteDatabase):
    def execute_sql(self, sql, params=None):
        if _group_commit is not None and not sql.lstrip()[:9].upper().startswith(_READ_ONLY):
            _wrote.set(True)
        return super().execute_sql(sql, params)


def open_database(
    url,
    sqlite_synchronous="FULL",
    pool_size=32,
    statement_timeout_seconds=None,
    pool_wait_seconds=10,
):
    """Create (not connect) a Peewee database for a sqlite:// or postgresql:// URL; PostgreSQL's
    pool holds at most `pool_size` connections, whose statements run at most
    `statement_timeout_seconds` (None: the server's setting); with all of them in use, a request
    waits up to `pool_wait_seconds` (whole seconds, at least 1) for one before it is refused."""
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
        if statement_timeout_seconds:
            timeout = f"-c statement_timeout={int(statement_timeout_seconds * 1000)}"
            parsed["options"] = (
                f"{parsed['options']} {timeout}" if parsed.get("options") else timeout
            )
        # Bounded pool: PostgreSQL connections are costly and limited on the server.
        # A storm (thousands of agents at once) queues for a connection instead of failing at once.
        return PooledPostgresqlDatabase(
            parsed.pop("database"),
            max_connections=pool_size,
            stale_timeout=300,
            timeout=max(1, int(pool_wait_seconds)),
            **parsed,
        )
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://...")


def bind(db):
    """Point every model at this database."""
    database.initialize(db)
    return db


_AFTER_COMMIT = threading.local()  # greenlet-local under gevent, as peewee's own transaction state


def hand_back():
    """Return this greenlet's pooled connection to the pool, unless a transaction still needs it
    (before a wait: the requests that run meanwhile reuse the connection)."""
    if not database.is_closed() and not database.in_transaction():
        database.close()


def released(fn):
    """fn(), then hand the pooled connection back (a check made between the waits of a long
    poll)."""
    try:
        return fn()
    finally:
        hand_back()


def writing():
    """True inside a write_transaction: this greenlet may hold SQLite's write lock, so it must not
    give the event loop away (another writer's BEGIN IMMEDIATE would wait inside SQLite, blocking
    the loop this one needs to finish)."""
    return getattr(_AFTER_COMMIT, "fns", None) is not None


class Fenced(Exception):
    """A write made for leadership by a replica that no longer leads (or whose lease lapsed)."""


_FENCE = threading.local()  # the fence of the leader work this thread does (fenced_by)


@contextlib.contextmanager
def fenced_by(fence):
    """Leader work: every outermost write_transaction in this block calls `fence()` first, inside
    the transaction (it raises Fenced to refuse: replicas.Leadership.fence), so no write made for
    leadership commits once another replica leads. None: no fence (work every replica does)."""
    previous = getattr(_FENCE, "fn", None)
    _FENCE.fn = fence
    try:
        yield
    finally:
        _FENCE.fn = previous


@contextlib.contextmanager
def write_transaction():
    """A transaction for read-modify-write: BEGIN IMMEDIATE on SQLite, so writers queue up front.
    What after_commit() registered inside it runs once the outermost one commits. Inside
    fenced_by(), the fence is checked first."""
    outermost = not database.in_transaction()
    atomic = (
        database.atomic("IMMEDIATE")
        if isinstance(database.obj, peewee.SqliteDatabase)
        else database.atomic()
    )
    fence = getattr(_FENCE, "fn", None) if outermost else None
    if outermost:
        _AFTER_COMMIT.fns = []
    try:
        with atomic:
            if fence is not None:
                fence()
            yield atomic
    except BaseException:
        if outermost:
            _AFTER_COMMIT.fns = None
        raise
    if outermost:
        fns, _AFTER_COMMIT.fns = _AFTER_COMMIT.fns, None
        for fn in fns:
            fn()


@contextlib.contextmanager
def savepoint():
    """A nested transaction inside a write_transaction: if it rolls back, so does what
    after_commit() registered inside it (a refused report's wake-ups are not sent)."""
    fns = _open_hooks()
    mark = len(fns)
    try:
        with database.atomic():
            yield
    except BaseException:
        del fns[mark:]
        raise


def after_commit(fn):
    """Call fn() once the current write_transaction commits (dropped if it rolls back); at once
    outside a transaction. The one way to act on a change: a waiter woken, a pass kicked or a peer
    told before the commit would read the old rows (Notifier.notify and SchedulerLoop.kick defer
    through it)."""
    if not database.in_transaction():
        fn()
        return
    _open_hooks().append(fn)


def _open_hooks():
    fns = getattr(_AFTER_COMMIT, "fns", None)
    if fns is None:  # a bare database.atomic(): nothing would ever run them
        raise RuntimeError(
            "after_commit() inside a transaction that write_transaction() did not open"
        )
    return fns


def upgrade(db=None):
    """Apply pending numbered migrations; returns their names."""
    db = db or database.obj
    with db.connection_context():
        return Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up()


def pending_migrations(db=None):
    """Names of migrations not yet applied."""
    db = db or database.obj
    with db.connection_context():
        return [
            m.name
            for m in Runner(db, MIGRATIONS_DIR, table_name="schema_migration").status()
            if not m.applied
        ]
