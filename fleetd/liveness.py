"""In-memory liveness of nodes: heartbeats touch memory; only state changes reach the database."""

import dataclasses
import math
import threading
import time

from fleetd.db import after_commit
from fleetwire.heartbeat import TaskReport

ENDED = frozenset(("succeeded", "failed", "cancelled", "lost", "preempted"))  # as nodes report


@dataclasses.dataclass
class Seen:
    """What the last heartbeat of one node said."""

    monotonic: float
    at: object  # naive UTC datetime
    tasks: list[TaskReport]
    metrics: dict | None = None
    flushed: bool = False


class LivenessTracker:
    """Decides which nodes are overdue, allowing every node a failover grace after start-up."""

    def __init__(
        self,
        clock,
        ttl_seconds,
        grace_seconds,
        failover_grace_seconds,
        interval_seconds=10,
        max_heartbeats_per_second=0,
    ):
        self.clock = clock
        self.ttl = ttl_seconds
        self.grace = grace_seconds
        self.failover_grace = failover_grace_seconds
        self.base_interval = interval_seconds
        self.max_rate = max_heartbeats_per_second
        self.started = clock.monotonic()
        self._seen = {}  # node id -> Seen (a new one for each heartbeat; `monotonic` never changes)
        # node id -> its last heartbeat's task list, for nodes whose list is not empty
        self._reporting = {}
        self._given = []  # [(monotonic, interval)] handed out lately, longest last kept
        self._lock = threading.Lock()

    def heartbeat_interval(self):
        """The interval to give nodes: the configured one, widened as the fleet grows so that all
        nodes together send at most max_heartbeats_per_second (as Nomad does)."""
        interval = self.base_interval
        if self.max_rate > 0:
            interval = max(interval, math.ceil(len(self._seen) / self.max_rate))
        now = self.clock.monotonic()
        with self._lock:
            if not self._given or self._given[-1][1] != interval:
                self._given.append((now, interval))
                del self._given[:-64]
        return interval

    def scale(self):
        """How much the longest interval handed out within the last (scaled) TTL widens the
        configured one (>= 1): a node told to wait longer may, until it has heard the shorter
        interval. Node TTLs and task leases are scaled by it."""
        longest = self.base_interval
        now = self.clock.monotonic()
        with self._lock:
            for at, interval in reversed(self._given):
                longest = max(longest, interval)
                if now - at > 3 * self.ttl * longest / max(1, self.base_interval):
                    break
        return max(1.0, longest / max(1, self.base_interval))

    def longest_interval(self):
        """Seconds between heartbeats of a node that follows the longest interval handed out
        lately."""
        return self.base_interval * self.scale()

    def _ttl(self):
        """The TTL, scaled with the heartbeat interval (see scale)."""
        return self.ttl * self.scale()

    def touch(self, node_id, tasks=(), metrics=None):
        """Record a heartbeat (or registration) of a node, now; returns whether a task its previous
        heartbeat listed as not finished is no longer listed so (its process is gone: what it
        held is free, if fleetd had ended it already)."""
        seen = Seen(self.clock.monotonic(), self.clock.now(), list(tasks), metrics)
        with self._lock:
            previous = self._seen.get(node_id)
            if metrics is None and previous is not None:
                seen.metrics = previous.metrics
            self._seen[node_id] = seen
            if seen.tasks:
                self._reporting[node_id] = seen.tasks
            else:
                self._reporting.pop(node_id, None)
        if previous is None or not previous.tasks:
            return False
        running = {t.id for t in seen.tasks if t.state not in ENDED}
        return any(t.id not in running for t in previous.tasks if t.state not in ENDED)

    def forget(self, node_id):
        """Drop a node (deleted, deregistered or declared lost)."""
        with self._lock:
            self._seen.pop(node_id, None)
            self._reporting.pop(node_id, None)

    def get(self, node_id):
        """The last heartbeat of a node, or None."""
        with self._lock:
            return self._seen.get(node_id)

    def drop_task(self, node_id, task_id):
        """The node said this task's process ended: stop counting it as running there."""
        with self._lock:
            seen = self._seen.get(node_id)
            if seen is not None:
                seen.tasks = [t for t in seen.tasks if t.id != task_id]
                if seen.tasks:
                    self._reporting[node_id] = seen.tasks
                else:
                    self._reporting.pop(node_id, None)

    def listings_older_than(self, seconds):
        """{node id: its last Seen} of the nodes whose last heartbeat here listed tasks and came
        more than `seconds` ago."""
        now = self.clock.monotonic()
        with self._lock:
            return {
                node_id: self._seen[node_id]
                for node_id in self._reporting
                if node_id in self._seen and now - self._seen[node_id].monotonic > seconds
            }

    def drop_listing(self, node_id: str, seen: Seen) -> None:
        """Stop counting the tasks that heartbeat (`seen`) of the node listed, unless a newer one
        came."""
        with self._lock:
            if self._seen.get(node_id) is seen:
                seen.tasks = []
                self._reporting.pop(node_id, None)

    def reported_running(self):
        """{task id: (node id, epoch)} for every task a node's last heartbeat listed as not finished
        (only nodes that listed any are looked at: most heartbeats of a large idle fleet list
        none)."""
        with self._lock:
            reporting = list(self._reporting.items())
        out = {}
        for node_id, tasks in reporting:
            for task in tasks:
                if task.state not in ENDED:
                    out[task.id] = (node_id, task.epoch)
        return out

    def restart_grace(self):
        """Give every node the failover grace from now (a replica became leader)."""
        self.started = self.clock.monotonic()

    def limit(self):
        """Seconds of silence after which a node is overdue (its scaled TTL plus the grace)."""
        return self._ttl() + self.grace

    def in_failover_grace(self):
        """True during the grace period after start-up."""
        return self.clock.monotonic() - self.started < self.failover_grace

    def is_overdue(self, node_id):
        """True when a node has been silent for longer than TTL + grace (never during failover
        grace)."""
        if self.in_failover_grace():
            return False
        seen = self.get(node_id)
        last = seen.monotonic if seen is not None else self.started
        return self.clock.monotonic() - last > self._ttl() + self.grace

    def overdue_view(self):
        """is_overdue() as of now, frozen: a predicate that takes no locks when called (for work
        that runs off the event loop)."""
        if self.in_failover_grace():
            return lambda node_id: False
        limit, now, started = self._ttl() + self.grace, self.clock.monotonic(), self.started
        with self._lock:
            seen = dict(self._seen)  # a shallow copy: each Seen's `monotonic` stays as it is

        def overdue(node_id):
            last = seen.get(node_id)
            return now - (started if last is None else last.monotonic) > limit

        return overdue

    def silent_for(self, node_id):
        """Seconds since the node was last heard of (or since start-up)."""
        seen = self.get(node_id)
        last = seen.monotonic if seen is not None else self.started
        return self.clock.monotonic() - last

    def take_unflushed(self):
        """{node_id: last heartbeat time} not yet written to the database; marks them written."""
        out = {}
        with self._lock:
            for node_id, seen in self._seen.items():
                if not seen.flushed:
                    seen.flushed = True
                    out[node_id] = seen.at
        return out

    def unflushed_again(self, taken):
        """What take_unflushed() gave was not written after all: those not heard of since are taken
        next time."""
        with self._lock:
            for node_id, at in taken.items():
                seen = self._seen.get(node_id)
                if seen is not None and seen.at == at:
                    seen.flushed = False


class RuntimeSamples:
    """The last runtime figures each node reported for its instance runs (the heartbeat's
    `instances`: uptime, GPU and container use, the states of its host ports), by task id."""

    def __init__(self, clock, ttl_seconds=120):
        self.clock = clock
        self.ttl_seconds = ttl_seconds
        self._samples = {}
        self._lock = threading.Lock()

    def put(self, samples):
        """Keep these samples (one per task id) as of now."""
        now = self.clock.monotonic()
        with self._lock:
            for sample in samples:
                self._samples[sample["task_id"]] = (now, sample)
            if len(self._samples) > 100_000:
                self._samples = {
                    k: v for k, v in self._samples.items() if now - v[0] < self.ttl_seconds
                }

    def get(self, task_id):
        """The task's last sample, or None when there is none within the TTL."""
        with self._lock:
            found = self._samples.get(task_id)
        if found is None or self.clock.monotonic() - found[0] > self.ttl_seconds:
            return None
        return found[1]


class LeaseTracker:
    """Task leases renewed in memory by heartbeats: (task id, epoch) -> last renewal.

    A lease not renewed for `ttl` seconds has expired. Right after start-up nothing has
    been renewed yet, so every lease is treated as renewed at start-up.
    """

    def __init__(self, clock, ttl_seconds, scale=None):
        self.clock = clock
        self.base_ttl = ttl_seconds
        self.scale = scale or (
            lambda: 1.0
        )  # the heartbeat interval's widening (LivenessTracker.scale)
        self.started = clock.monotonic()
        self._renewed = {}
        self._unflushed = {}
        self._lock = threading.Lock()

    def renew(self, task_id, epoch):
        """The holder of (task, epoch) showed it is alive, now."""
        with self._lock:
            self._renewed[task_id] = (epoch, self.clock.monotonic())
            self._unflushed[task_id] = (epoch, self.clock.now())

    def forget(self, task_id):
        with self._lock:
            self._renewed.pop(task_id, None)
            self._unflushed.pop(task_id, None)

    def take_unflushed(self):
        """{task id: (epoch, wall-clock time)} renewed since the last call (for other replicas)."""
        with self._lock:
            out, self._unflushed = self._unflushed, {}
        return out

    def unflushed_again(self, taken):
        """What take_unflushed() gave was not written after all: taken next time, unless renewed
        since."""
        with self._lock:
            for task_id, renewal in taken.items():
                self._unflushed.setdefault(task_id, renewal)

    def restart_grace(self):
        """Treat every lease as renewed now (a new leader gives the nodes time to reach it)."""
        self.started = self.clock.monotonic()

    @property
    def ttl(self):
        """Seconds a lease lasts: the configured ones, widened as the heartbeat interval is. Agents
        hear it (the heartbeat's `lease_seconds`) and stop a job's task before it runs out."""
        return self.base_ttl * self.scale()

    def last_renewed(self, task_id, epoch):
        """The monotonic time of the last renewal of (task, epoch) here; start-up when none."""
        with self._lock:
            renewed = self._renewed.get(task_id)
        return renewed[1] if renewed is not None and renewed[0] == epoch else self.started

    def expired(self, task_id, epoch):
        """True when the lease of (task, epoch) was last renewed more than `ttl` seconds ago."""
        return self.clock.monotonic() - self.last_renewed(task_id, epoch) > self.ttl


class Notifier:
    """Wake-ups by key (a node's acquire, a job's end, a rendezvous): no polling on the server."""

    def __init__(self):
        self._waiters = {}
        self._lock = threading.Lock()
        self._closed = False
        self.publish = None  # replicas: fn(key) that wakes the same key on the other replicas

    def close(self):
        """Shutting down: every wait answers now with what it has, and later ones do not wait."""
        with self._lock:
            self._closed = True
            waiters = [event for events in self._waiters.values() for event in events]
        for event in waiters:
            event.set()

    @property
    def closed(self):
        """True once fleetd is shutting down: waits answer at once."""
        return self._closed

    def wait(self, key, timeout, ready):
        """Wait up to `timeout` seconds until `ready()` is true, re-checking after each
        notify(key)."""
        deadline = time.monotonic() + timeout
        event = threading.Event()
        with self._lock:
            self._waiters.setdefault(key, set()).add(event)
        try:
            for _ in range(10_000):  # bounded; each round waits for a notify or the deadline
                result = ready()
                if result or self._closed:
                    return result
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not event.wait(remaining):
                    return ready()
                event.clear()
            return ready()
        finally:
            with self._lock:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]

    def notify(self, key, local=False):
        """Wake everyone waiting on `key` (on the other replicas too, unless `local`) once the
        current write_transaction commits (at once outside one): a waiter reads the new rows."""
        after_commit(lambda: self._notify(key, local))

    def _notify(self, key, local):
        with self._lock:
            waiters = list(self._waiters.get(key, ()))
        for event in waiters:
            event.set()
        if self.publish is not None and not local:
            self.publish(key)
