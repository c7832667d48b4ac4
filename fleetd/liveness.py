"""In-memory liveness of nodes: heartbeats touch memory; only state changes reach the database."""

import dataclasses
import threading

TERMINAL_TASK_STATES = frozenset({"succeeded", "failed", "cancelled", "lost", "preempted"})


@dataclasses.dataclass
class Seen:
    """What the last heartbeat of one node said."""

    monotonic: float
    at: object  # naive UTC datetime
    tasks: list
    metrics: dict = None
    flushed: bool = False


class LivenessTracker:
    """Decides which nodes are overdue, allowing every node a failover grace after start-up."""

    def __init__(self, clock, ttl_seconds, grace_seconds, failover_grace_seconds):
        self.clock = clock
        self.ttl = ttl_seconds
        self.grace = grace_seconds
        self.failover_grace = failover_grace_seconds
        self.started = clock.monotonic()
        self._seen = {}
        self._lock = threading.Lock()

    def touch(self, node_id, tasks=(), metrics=None):
        """Record a heartbeat (or registration) of a node, now."""
        seen = Seen(self.clock.monotonic(), self.clock.now(), list(tasks), metrics)
        with self._lock:
            previous = self._seen.get(node_id)
            if metrics is None and previous is not None:
                seen.metrics = previous.metrics
            self._seen[node_id] = seen

    def forget(self, node_id):
        """Drop a node (deleted, deregistered or declared lost)."""
        with self._lock:
            self._seen.pop(node_id, None)

    def get(self, node_id):
        """The last heartbeat of a node, or None."""
        with self._lock:
            return self._seen.get(node_id)

    def active_tasks(self, node_id):
        """Ids of tasks the node last reported as not finished."""
        seen = self.get(node_id)
        if seen is None:
            return []
        return [t["id"] for t in seen.tasks if t.get("state") not in TERMINAL_TASK_STATES]

    def in_failover_grace(self):
        """True during the grace period after start-up."""
        return self.clock.monotonic() - self.started < self.failover_grace

    def is_overdue(self, node_id):
        """True when a node has been silent for longer than TTL + grace (never during failover grace)."""
        if self.in_failover_grace():
            return False
        seen = self.get(node_id)
        last = seen.monotonic if seen is not None else self.started
        return self.clock.monotonic() - last > self.ttl + self.grace

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
