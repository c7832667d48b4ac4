"""Replicas: several `fleetd serve` processes on one PostgreSQL database.

Every replica answers every route. One of them, the leader, makes the decisions that must be
made once: scheduling passes, lost nodes, expired leases, drain deadlines, background tasks.

- Leadership is a lease row in the database (`leader_lease`: holder, expiry, epoch), taken with
  SELECT ... FOR UPDATE when it expired, renewed well before it does. A new holder increments the
  epoch. A replica counts itself leader only until `lease_seconds` minus a margin after the start
  of its last successful renewal: it stops leading before its lease can expire in the database.
- Fencing: every write made for leadership runs `fence()` inside its transaction, which locks the
  lease row (FOR SHARE) and refuses (Fenced) unless this replica holds it at its epoch and it has
  not expired. A leader paused past its lease (SIGSTOP, a long GC) therefore cannot assign work or
  declare nodes lost after another took over: the write rolls back.
- Shared liveness: heartbeats and lease renewals land in the memory of whichever replica got them;
  each replica writes them down in batches (services.fleet_ops.replication.sync()), and the leader's
  decisions read them back.
- Wake-ups cross processes over LISTEN/NOTIFY (`Bus`): a long poll answered by one replica wakes
  when another one assigns, cancels or changes what it waits for; kicks reach the leader.

On SQLite (one process, `fleetd serve` refuses a second one) the replica always leads and
fence() checks nothing.
"""

import datetime as dt
import fcntl
import json
import logging
import os
import threading
import time
import uuid

from fleetd.db import Fenced, database, hand_back
from fleetd.services.notify.events import FLEETD, record_event

log = logging.getLogger("fleetd.replicas")
CHANNEL = "fleetd"


class Leadership:
    """This replica's hold on the leader lease."""

    def __init__(self, lease_seconds=8.0, shared=False, replica_id=None, monotonic=time.monotonic):
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self.lease_seconds = lease_seconds
        self.shared = shared
        self.epoch = 1 if not shared else 0  # this replica's epoch while it leads
        self.leader_epoch = self.epoch  # the epoch last seen in the database
        self.changes = 0  # times this replica became or stopped being leader
        self._monotonic = monotonic
        self._valid_until = 0.0
        self._was_leading = not shared
        self._listeners = []
        self._lock = threading.Lock()

    @property
    def margin(self):
        return self.lease_seconds / 4

    def leading(self):
        """True while this replica may act as leader (always, on SQLite)."""
        return not self.shared or self._monotonic() < self._valid_until

    def on_change(self, fn):
        """Call fn(leading, epoch) whenever this replica starts or stops leading."""
        self._listeners.append(fn)

    def tick(self):
        """Renew the lease, or take it when it expired. Returns True when this replica leads."""
        if not self.shared:
            return True
        started = self._monotonic()
        try:
            with database.atomic():
                leads = self._claim()
        except Exception:  # the database is unreachable: keep what was valid, let it lapse
            log.exception("leader lease: renewal failed")
            leads = None
        finally:
            hand_back()
        if leads:
            self._valid_until = started + self.lease_seconds - self.margin
        elif leads is False:
            self._valid_until = 0.0
        self._notice()
        return self.leading()

    def _claim(self):
        cursor = database.execute_sql(
            "SELECT holder, epoch, expires_at > now() FROM leader_lease WHERE id = 1 FOR UPDATE"
        )
        holder, epoch, live = cursor.fetchone()
        self.leader_epoch = epoch
        interval = f"{self.lease_seconds} seconds"
        if holder == self.replica_id and live and epoch == self.epoch:
            database.execute_sql(
                "UPDATE leader_lease SET expires_at = now() + %s::interval WHERE id = 1",
                (interval,),
            )
            return True
        if live:
            return False
        database.execute_sql(
            "UPDATE leader_lease SET holder = %s, epoch = epoch + 1, "
            "expires_at = now() + %s::interval WHERE id = 1",
            (self.replica_id, interval),
        )
        self.epoch = self.leader_epoch = epoch + 1
        # An Event (and its webhook deliveries) in the transaction that took the lease.
        record_event(
            dt.datetime.now(dt.timezone.utc).replace(tzinfo=None),
            "leader.changed",
            "cluster",
            self.replica_id,
            f"replica {self.replica_id} leads now (epoch {self.epoch}; previous holder "
            f"{holder or 'none'})",
            actor=FLEETD,
            data={"replica_id": self.replica_id, "epoch": self.epoch, "previous": holder or None},
        )
        log.warning(
            "replica %s leads now (epoch %d; previous holder %r)",
            self.replica_id,
            self.epoch,
            holder or None,
        )
        return True

    def _notice(self):
        leading = self.leading()
        with self._lock:
            changed, self._was_leading = leading != self._was_leading, leading
            if changed:
                self.changes += 1
        if changed:
            if not leading:
                log.warning("replica %s stopped leading (epoch %d)", self.replica_id, self.epoch)
            for fn in self._listeners:
                fn(leading, self.epoch)

    def resign(self):
        """Shutting down: give the lease up at once so that another replica takes over now."""
        if not self.shared or not self.leading():
            return
        self._valid_until = 0.0
        try:
            with database.atomic():
                database.execute_sql(
                    "UPDATE leader_lease SET expires_at = now() WHERE id = 1 AND holder = %s "
                    "AND epoch = %s",
                    (self.replica_id, self.epoch),
                )
        except Exception:
            log.exception("leader lease: could not hand it back")
        self._notice()

    def fence(self):
        """Inside a write transaction made for leadership: Fenced unless this replica holds the
        lease at its epoch and the lease has not expired (the row stays locked until commit)."""
        if not self.shared:
            return
        if not self.leading():
            raise Fenced(f"replica {self.replica_id} does not lead")
        holder, epoch, live = database.execute_sql(
            "SELECT holder, epoch, expires_at > now() FROM leader_lease WHERE id = 1 FOR SHARE"
        ).fetchone()
        if holder != self.replica_id or epoch != self.epoch or not live:
            self._valid_until = 0.0
            raise Fenced(
                f"replica {self.replica_id} at epoch {self.epoch} is fenced off: the lease is "
                f"{holder!r}'s at epoch {epoch}{'' if live else ', expired'}"
            )

    def status(self):
        return {
            "replica_id": self.replica_id,
            "leader": self.leading(),
            "leader_epoch": self.leader_epoch,
        }


class Bus:
    """Wake-ups between replicas over PostgreSQL LISTEN/NOTIFY, on two connections of its own
    (not the pool's: a LISTEN lives as long as its connection). Messages are JSON lists whose
    first item is the kind; a replica ignores its own."""

    def __init__(self, connect, replica_id, handlers):
        self._connect = connect  # () -> a new psycopg2 connection
        self.replica_id = replica_id
        self.handlers = handlers  # kind -> fn(*args)
        self._send = None
        self._send_lock = threading.Lock()
        self._stopped = threading.Event()
        self.sent = self.received = 0

    def publish(self, kind, *args):
        """Tell the other replicas; a lost message is not fatal (heartbeats and passes catch up)."""
        payload = json.dumps([self.replica_id, kind, *args])
        if len(payload) > 7000:  # NOTIFY payloads are limited to 8000 bytes
            return
        with self._send_lock:
            try:
                if self._send is None or self._send.closed:
                    self._send = self._connect()
                    self._send.autocommit = True
                with self._send.cursor() as cursor:
                    cursor.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
                self.sent += 1
            except Exception:
                log.exception("replica bus: could not publish %s", kind)
                self._close_send()

    def _close_send(self):
        try:
            if self._send is not None:
                self._send.close()
        except Exception:  # already broken
            pass
        self._send = None

    def run(self, wait_readable):
        """Listen until stop(); `wait_readable(fd, timeout)` waits for the socket (gevent's)."""
        for _ in range(10**9):  # bounded: reconnects at most once a second until stopped
            if self._stopped.is_set():
                return
            try:
                self._listen(wait_readable)
            except Exception:
                log.exception("replica bus: listener failed; reconnecting")
                self._stopped.wait(1.0)

    def _listen(self, wait_readable):
        conn = self._connect()
        try:
            conn.autocommit = True
            with conn.cursor() as cursor:
                cursor.execute(f"LISTEN {CHANNEL}")
            while not self._stopped.is_set():
                wait_readable(conn.fileno(), 1.0)
                conn.poll()
                while conn.notifies:
                    self._dispatch(conn.notifies.pop(0).payload)
        finally:
            conn.close()

    def _dispatch(self, payload):
        try:
            sender, kind, *args = json.loads(payload)
        except (ValueError, TypeError):
            return
        handler = self.handlers.get(kind)
        if sender == self.replica_id or handler is None:
            return
        self.received += 1
        try:
            handler(*args)
        except Exception:
            log.exception("replica bus: handling %s failed", kind)

    def stop(self):
        self._stopped.set()
        with self._send_lock:
            self._close_send()


class AlreadyServing(ValueError):
    """Another `fleetd serve` holds this SQLite database."""


class SingleProcessLock:
    """An exclusive lock on `<sqlite file>.lock`: one `fleetd serve` per SQLite database."""

    def __init__(self, db_path):
        self.path = os.path.abspath(db_path) + ".lock"
        self._fd = None

    def acquire(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise AlreadyServing(
                f"another fleetd serve (pid {holder}) already uses this SQLite database "
                f"({self.path[:-5]}); "
                "SQLite serves one process: stop it, or use PostgreSQL (--db postgresql://...) to "
                "run several replicas"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def release(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
