"""Log shipping: a task's output, cut into lines, carried to fleetd in ordered, bounded batches."""

import collections
import dataclasses
import logging
import threading
import time

from agent.client import FleetdError, TooLarge, Unreachable, backoff_delay
from agent.task.errors import is_fencing
from agent.threads import Job

log = logging.getLogger("agent.runner")

MAX_LINE_BYTES = 16 * 1024  # longer lines reach fleetd in pieces of this size
MIN_TRUNCATED_CHARS = 256  # a single line that fleetd still refuses (413) is halved down to this, then dropped
TRUNCATED_MARK = " [truncated by fleet-agent]"


def _line_size(stream, text):
    return len(text.encode("utf-8", "replace")) + len(stream) + 8  # JSON quoting and separators


@dataclasses.dataclass
class LogSettings:
    """Bounds of log shipping, per task."""

    batch_lines: int = 1000
    batch_bytes: int = 256 * 1024
    interval_seconds: float = 0.25
    buffer_bytes: int = 8 * 1024 * 1024
    backoff_max_seconds: float = 60.0


class LogShipper:
    """Carries a task's output lines to fleetd in ordered batches without ever blocking the task.

    Lines wait in a bounded buffer; when fleetd is slow or down and the buffer is full, the oldest
    lines are dropped and a marker line says how many. A batch answered 413 is split in halves
    (a single line is truncated) and sent again.
    """

    def __init__(self, clients, task_id, epoch, settings, on_fenced, give_up, label):
        self._clients = clients  # checkout_client() / checkin_client(): a FleetClient for this thread
        self.task_id = task_id
        self.epoch = epoch
        self.settings = settings
        self._on_fenced = on_fenced
        self._give_up = give_up  # callable() -> True once undelivered lines should be abandoned
        self.label = label
        self._cond = threading.Condition()
        self._buf = collections.deque()
        self._buf_bytes = 0
        self._due_at = None  # monotonic time by which the oldest buffered line must be on its way
        self._dropped = 0
        self._closing = False
        self._aborted = False
        self.delivered = 0
        self.lost = 0  # lines dropped for good: overflow, refused or abandoned
        self._thread = Job(self._run, name=f"logs-{label}")  # on one of the runner's threads
        self._started = False

    def add(self, stream, text):
        """Queue one line (called by the pipe reader); drops the oldest lines past the buffer bound.
        The shipping thread starts with the first line: a silent task needs none."""
        size = _line_size(stream, text)
        with self._cond:
            start, self._started = not self._started, True
        if start:
            self._clients.threads.submit(self._thread)
        with self._cond:
            self._buf.append((stream, text, size))
            self._buf_bytes += size
            while self._buf_bytes > self.settings.buffer_bytes and len(self._buf) > 1:
                _s, _t, old = self._buf.popleft()
                self._buf_bytes -= old
                self._dropped += 1
                self.lost += 1
            if self._due_at is None:
                self._due_at = time.monotonic() + self.settings.interval_seconds
            if len(self._buf) >= self.settings.batch_lines or self._buf_bytes >= self.settings.batch_bytes:
                self._cond.notify_all()

    def feed(self, buf, stream, eof):
        """Queue the complete lines of `buf` (at most MAX_LINE_BYTES each; all of it at EOF); return what is left."""
        for _ in range(len(buf) + 1):
            cut = buf.find(b"\n", 0, MAX_LINE_BYTES)
            if cut >= 0:
                line, buf = buf[:cut + 1], buf[cut + 1:]
            elif len(buf) >= MAX_LINE_BYTES or (eof and buf):
                line, buf = buf[:MAX_LINE_BYTES], buf[MAX_LINE_BYTES:]
            else:
                return buf
            text = line.decode("utf-8", "replace").replace("\0", "\ufffd")  # fleetd stores no NUL
            if text.endswith("\n"):
                text = text[:-2] if text.endswith("\r\n") else text[:-1]
            self.add(stream, text)
        return buf

    def close(self):
        """No more lines will come: ship what is buffered, then end."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def abort(self):
        """Stop at once, shipping nothing more."""
        with self._cond:
            self._aborted = True
            self._cond.notify_all()

    def nudge(self):
        """Cut a retry backoff short (the agent is stopping: one more try, then give up)."""
        with self._cond:
            self._cond.notify_all()

    def join(self, timeout=None):
        """Wait for the shipping thread; True when it ended."""
        with self._cond:
            if not self._started:
                return True
        return self._thread.join(timeout)

    def _take(self):
        """The next batch as a list, or None when closed and empty (or aborted); waits until one is due."""
        with self._cond:
            while not self._aborted:
                now = time.monotonic()
                if self._buf:
                    full = len(self._buf) >= self.settings.batch_lines or self._buf_bytes >= self.settings.batch_bytes
                    if full or self._closing or now >= self._due_at:
                        return self._cut(now)
                    self._cond.wait(self._due_at - now)
                elif self._closing:
                    return None
                else:
                    self._cond.wait(1.0)
            return None

    def _cut(self, now):
        batch, size = [], 0
        if self._dropped:
            batch.append(["system", f"[fleet-agent] {self._dropped} line(s) of output dropped here: "
                                    "fleetd was too slow or unreachable"])
            self._dropped = 0
        while self._buf and len(batch) < self.settings.batch_lines:
            stream, text, line_size = self._buf[0]
            if batch and size + line_size > self.settings.batch_bytes:
                break
            self._buf.popleft()
            self._buf_bytes -= line_size
            size += line_size
            batch.append([stream, text])
        self._due_at = now if self._buf else None  # a backlog goes out at once
        return batch

    def _wait(self, seconds):
        with self._cond:
            if not self._aborted:
                self._cond.wait(seconds)

    def _run(self):
        client = self._clients.checkout_client()
        try:
            self._ship(client)
        finally:
            self._clients.checkin_client(client)

    def _ship(self, client):
        failures = 0
        pending = []  # a stack of parts of the current batch, next part last
        while True:
            if not pending:
                batch = self._take()
                if batch is None:
                    return
                pending = [batch]
            part = pending.pop()
            try:
                client.task_logs(self.task_id, self.epoch, part)
            except TooLarge:
                pending.extend(self._split(part))
                continue
            except Unreachable as exc:
                pending.append(part)
                failures += 1
                if self._give_up() or self._aborted:
                    abandoned = sum(len(p) for p in pending)
                    self.lost += abandoned
                    log.warning("task %s: %d log line(s) not delivered: %s", self.label, abandoned, exc)
                    pending = []
                    if self._aborted:
                        return
                    continue
                if failures == 1 or failures % 10 == 0:
                    log.warning("task %s: logs not delivered yet (attempt %d): %s; buffering, the task keeps "
                                "running", self.label, failures, exc)
                self._wait(backoff_delay(failures, self.settings.backoff_max_seconds))
                continue
            except FleetdError as exc:
                if is_fencing(exc):
                    self._on_fenced(exc)
                    return
                self.lost += len(part)
                log.error("task %s: fleetd refused %d log line(s): %s", self.label, len(part), exc)
                continue
            failures = 0
            self.delivered += len(part)

    def _split(self, part):
        """Halves of a refused batch (first half last, so it goes first), or a truncated single line."""
        if len(part) > 1:
            middle = len(part) // 2
            return [part[middle:], part[:middle]]
        stream, text = part[0]
        body = text[:-len(TRUNCATED_MARK)] if text.endswith(TRUNCATED_MARK) else text
        if len(body) <= MIN_TRUNCATED_CHARS:
            self.lost += 1
            log.error("task %s: fleetd refused a %d-character log line even truncated; dropped", self.label, len(text))
            return []
        return [[[stream, body[:len(body) // 2] + TRUNCATED_MARK]]]
