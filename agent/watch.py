"""Two threads that serve every task at once: one sees processes exit, one reads output files.

A task used to hold three threads while it ran: its supervisor, a watcher waiting on the pidfd of
its process, and a tail reading its output files every quarter second. With tens of short tasks in
flight on a host those threads did little each, but every hand-over of the interpreter lock between
them was a pair of futex calls and a context switch: a third of the agent's CPU went to the
scheduler (perf, 2026-12-07, docs/benchmarks.md). Here one `ExitWatcher` thread waits on the pidfds
of every supervised process that writes into files, and one `Ticker` thread pumps every task's
tail; a task keeps its supervisor thread alone.
"""

import logging
import os
import selectors
import threading
import time

from agent.threads import UNTIL_STOPPED

log = logging.getLogger(__name__)


class Watch:
    """One process watched by an ExitWatcher, with the `join` and `is_alive` of a thread: done once
    its exit was seen, or once it was cancelled."""

    __slots__ = ("pidfd", "on_exit", "_done", "_owner")

    def __init__(self, owner, pidfd, on_exit):
        self._owner = owner
        self.pidfd = pidfd
        self.on_exit = on_exit
        self._done = threading.Event()

    def cancel(self):
        """Stop watching (the process runs on: the agent stops and leaves it); the pidfd is
        closed."""
        self._owner._change(self, add=False)

    def join(self, timeout=None):
        """Wait until the exit was seen or the watch cancelled; True once it was."""
        return self._done.wait(timeout)

    def is_alive(self):
        return not self._done.is_set()


class ExitWatcher:
    """Sees the exits of many processes through their pidfds, on one thread (started at the first
    watch). `on_exit()` runs on that thread: it must only set events."""

    def __init__(self, name="exits"):
        self.name = name
        self._lock = threading.Lock()
        self._changes: list[tuple[Watch | None, bool]] = []  # to apply on the thread
        self._wake: int | None = None  # the write end of the pipe that wakes the thread
        self._thread: threading.Thread | None = None

    def watch(self, pidfd, on_exit):
        """Watch a pidfd (now the watcher's: it closes it) until the process exits; returns the
        Watch."""
        watch = Watch(self, pidfd, on_exit)
        self._change(watch, add=True)
        return watch

    def close(self):
        """End the thread (the agent stopped its tasks); a watch still open is closed unseen."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._change(None, add=False)
            thread.join(5.0)

    def _change(self, watch, add):
        with self._lock:
            if self._thread is None:
                selector = selectors.DefaultSelector()
                wake_read, self._wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                selector.register(wake_read, selectors.EVENT_READ, None)
                self._thread = threading.Thread(
                    target=self._run, args=(selector, wake_read), name=self.name, daemon=True
                )
                self._thread.start()
            self._changes.append((watch, add))
            wake = self._wake
            assert wake is not None  # made with the thread, dropped only with it
            try:
                os.write(wake, b"x")
            except BlockingIOError:  # the pipe is full: the thread is woken already
                pass

    def _run(self, selector, wake_read):
        watches: set[Watch] = set()
        for _ in range(UNTIL_STOPPED):
            for key, _mask in selector.select():
                watch = key.data
                if watch is None:
                    if not self._apply(selector, wake_read, watches):
                        return
                elif watch in watches:  # the pidfd is readable: the process exited
                    watches.discard(watch)
                    selector.unregister(watch.pidfd)
                    self._end(watch, exited=True)

    def _apply(self, selector, wake_read, watches):
        """Apply the changes asked for; False once asked to close (the thread's resources are
        released)."""
        os.read(wake_read, 4096)
        with self._lock:
            changes, self._changes = self._changes, []
        for watch, add in changes:
            if watch is None:  # close
                for left in watches:
                    self._end(left, exited=False)
                selector.close()
                with self._lock:
                    os.close(wake_read)
                    if self._wake is not None:
                        os.close(self._wake)
                    self._thread = self._wake = None
                    later, self._changes = self._changes, []
                for watch_later, _ in later:  # asked for as it closed: not watched
                    if watch_later is not None:
                        self._end(watch_later, exited=False)
                return False
            if add and not watch._done.is_set():
                try:
                    selector.register(watch.pidfd, selectors.EVENT_READ, watch)
                    watches.add(watch)
                except (OSError, ValueError) as exc:  # a closed pidfd: say it exited
                    log.warning("cannot watch a process's pidfd: %s", exc)
                    self._end(watch, exited=True)
            elif not add and watch in watches:
                watches.discard(watch)
                selector.unregister(watch.pidfd)
                self._end(watch, exited=False)
            elif not add:
                watch._done.set()  # ended already
        return True

    def _end(self, watch, exited):
        try:
            os.close(watch.pidfd)
        except OSError:
            pass
        watch._done.set()
        if exited:
            watch.on_exit()


class Ticker:
    """Calls every added function every `interval` seconds on one thread (started at the first
    add), until it is removed. A function that raises is logged and called again next time."""

    def __init__(self, interval, name="tails"):
        self.interval = interval
        self.name = name
        self._lock = threading.Lock()  # guards _fns
        self._calling = threading.Lock()  # held around each call: remove() waits for it
        self._fns = {}  # id -> fn, in the order added
        self._ids = 0
        self._thread = None
        self._added = threading.Event()
        self._closed = False

    def add(self, fn):
        """Call fn() from the next tick on; returns the id that remove() takes."""
        with self._lock:
            self._ids += 1
            self._fns[self._ids] = fn
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._added.set()
            return self._ids

    def close(self):
        """End the thread after the call in progress (the agent stopped its tasks)."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            self._added.set()
        if thread is not None:
            thread.join(5.0)

    def remove(self, ident):
        """No call of that function after this returns (one in progress is waited for)."""
        with self._calling, self._lock:
            self._fns.pop(ident, None)

    def _run(self):
        for _ in range(UNTIL_STOPPED):
            with self._lock:
                if self._closed:
                    return
                ids = list(self._fns)
                if not ids:
                    self._added.clear()
            if not ids:
                self._added.wait()
                continue
            for ident in ids:
                with self._calling:
                    with self._lock:
                        fn = self._fns.get(ident)
                    if fn is None:
                        continue
                    try:
                        fn()
                    except Exception:  # one task's tail must not stop the others'
                        log.exception("periodic %s call failed", self.name)
            time.sleep(self.interval)
