"""Threads kept for reuse.

Every task needs a supervisor thread and a pipe reader, and a task that prints needs a log
shipper too. Starting a thread costs about 135 µs of CPU on a small VM (clone, a stack to map,
the start handshake; unmapping it again at the end), against 3-4 ms that the agent spends on a
no-op task in all. A `Pool` hands work to a thread that finished its last piece instead, and
starts a new thread only when none is idle. Idle threads end after `idle_seconds`.
"""

import logging
import queue
import threading

log = logging.getLogger(__name__)

UNTIL_STOPPED = 1_000_000_000_000  # bounds the loops of a thread that lives as long as the agent


class PoolWork:
    """A callable run by a Pool, with the `join` and `is_alive` of a thread."""

    __slots__ = ("fn", "args", "name", "_done")

    def __init__(self, fn, *args, name="job"):
        self.fn = fn
        self.args = args
        self.name = name
        self._done = threading.Event()

    def join(self, timeout=None):
        """Wait until the callable returned (or raised); True once it has."""
        return self._done.wait(timeout)

    def is_alive(self):
        """True until the callable returned; work not yet run counts as alive."""
        return not self._done.is_set()


class Pool:
    """Runs PoolWork, each on a thread of its own for as long as it runs; threads are reused."""

    def __init__(self, name, idle_seconds=60.0):
        self.name = name
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._idle = []  # the inboxes of threads waiting for work; the one idle the shortest last
        self._started = 0

    def run(self, fn, *args, name=None):
        """Run fn(*args) on a thread now; returns its PoolWork."""
        work = PoolWork(fn, *args, name=name or self.name)
        self.submit(work)
        return work

    def submit(self, work):
        """Run PoolWork made beforehand."""
        with self._lock:
            if self._idle:
                self._idle.pop().put(work)  # under the lock: the thread cannot time out in between
                return
            self._started += 1
            number = self._started
        inbox: queue.SimpleQueue[PoolWork] = queue.SimpleQueue()
        inbox.put(work)
        threading.Thread(
            target=self._serve, args=(inbox,), name=f"{self.name}-{number}", daemon=True
        ).start()

    def idle(self):
        """How many threads wait for work."""
        with self._lock:
            return len(self._idle)

    def _serve(self, inbox):
        me = threading.current_thread()
        own_name = me.name
        for _ in range(UNTIL_STOPPED):
            try:
                work = inbox.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return
                work = inbox.get()  # handed work as the wait timed out: it is in the inbox already
            me.name = work.name
            try:
                work.fn(*work.args)
            except Exception:  # the work's own bug: the thread lives on for the next one
                log.exception("thread %s failed", work.name)
            finally:
                me.name = own_name
                work._done.set()
            with self._lock:
                self._idle.append(inbox)
