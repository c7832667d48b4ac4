"""Log shipping: a task's output, cut into lines, carried to fleetd in ordered, bounded batches."""

import collections
import dataclasses
import json
import logging
import os
import threading
import time

from agent.client import FleetdError, TooLarge, Unreachable, backoff_delay
from agent.task.errors import is_fencing
from agent.threads import UNTIL_STOPPED, PoolWork

log = logging.getLogger("agent.runner")

MAX_LINE_BYTES = 16 * 1024  # longer lines reach fleetd in pieces of this size
MIN_TRUNCATED_CHARS = (
    256  # a single line that fleetd still refuses (413) is halved down to this, then dropped
)
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
        self._clients = (
            clients  # checkout_client() / checkin_client(): a FleetClient for this thread
        )
        self.task_id = task_id
        self.epoch = epoch
        self.settings = settings
        self._on_fenced = on_fenced
        self._give_up = give_up  # callable() -> True once undelivered lines should be abandoned
        self.label = label
        self._cond = threading.Condition()
        self._buf: collections.deque[tuple[str, str, int]] = (
            collections.deque()
        )  # (stream, text, size)
        self._buf_bytes = 0
        self._due_at: float | None = (
            None  # monotonic time by which the oldest buffered line must be on its way
        )
        self._dropped = 0
        self._closing = False
        self._aborted = False
        self._busy = False  # a batch is on its way (taken from the buffer, not yet settled)
        self.delivered = 0
        self.lost = 0  # lines dropped for good: overflow, refused or abandoned
        self._thread = PoolWork(self._run, name=f"logs-{label}")  # on one of the runner's threads
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
            if (
                len(self._buf) >= self.settings.batch_lines
                or self._buf_bytes >= self.settings.batch_bytes
            ):
                self._cond.notify_all()

    def feed(self, buf, stream, eof):
        """Queue the complete lines of `buf` (at most MAX_LINE_BYTES each; all of it at EOF); return
        what is left."""
        for _ in range(len(buf) + 1):
            cut = buf.find(b"\n", 0, MAX_LINE_BYTES)
            if cut >= 0:
                line, buf = buf[: cut + 1], buf[cut + 1 :]
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

    def settled(self):
        """True when every line added so far was delivered or given up (none buffered or on its
        way)."""
        with self._cond:
            return not self._buf and not self._busy

    def backlog_bytes(self):
        """How much buffered text waits to be shipped."""
        with self._cond:
            return self._buf_bytes

    def wait_for_room(self, timeout):
        """Wait (at most `timeout`) until a batch went out or the shipper stopped."""
        with self._cond:
            if self._buf and not self._aborted:
                self._cond.wait(timeout)

    def join(self, timeout=None):
        """Wait for the shipping thread; True when it ended."""
        with self._cond:
            if not self._started:
                return True
        return self._thread.join(timeout)

    def _take(self):
        """The next batch as a list, or None when closed and empty (or aborted); waits until one is
        due."""
        with self._cond:
            self._busy = False  # called only once the batch before is settled
            while not self._aborted:
                now = time.monotonic()
                if self._buf:
                    full = (
                        len(self._buf) >= self.settings.batch_lines
                        or self._buf_bytes >= self.settings.batch_bytes
                    )
                    due_at = self._due_at  # set whenever the buffer holds a line (add, _cut)
                    if full or self._closing or due_at is None or now >= due_at:
                        return self._cut(now)
                    self._cond.wait(due_at - now)
                elif self._closing:
                    return None
                else:
                    self._cond.wait(1.0)
            return None

    def _cut(self, now):
        self._busy = True
        batch, size = [], 0
        if self._dropped:
            batch.append(
                [
                    "system",
                    f"[fleet-agent] {self._dropped} line(s) of output dropped here: "
                    "fleetd was too slow or unreachable",
                ]
            )
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
        self._cond.notify_all()  # room for more: a FileTail waiting for it reads on
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
        pending: list[list] = []  # a stack of parts of the current batch, next part last
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
                    log.warning(
                        "task %s: %d log line(s) not delivered: %s", self.label, abandoned, exc
                    )
                    pending = []
                    if self._aborted:
                        return
                    continue
                if failures == 1 or failures % 10 == 0:
                    log.warning(
                        "task %s: logs not delivered yet (attempt %d): %s; buffering, the task "
                        "keeps running",
                        self.label,
                        failures,
                        exc,
                    )
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
        """Halves of a refused batch (first half last, so it goes first), or a truncated single
        line."""
        if len(part) > 1:
            middle = len(part) // 2
            return [part[middle:], part[:middle]]
        stream, text = part[0]
        body = text[: -len(TRUNCATED_MARK)] if text.endswith(TRUNCATED_MARK) else text
        if len(body) <= MIN_TRUNCATED_CHARS:
            self.lost += 1
            log.error(
                "task %s: fleetd refused a %d-character log line even truncated; dropped",
                self.label,
                len(text),
            )
            return []
        return [[[stream, body[: len(body) // 2] + TRUNCATED_MARK]]]


OUTPUT_FILES = (("stdout", "stdout.log"), ("stderr", "stderr.log"))
OFFSETS_FILE = "output-offsets.json"
READ_BYTES = 1 << 20  # most read from one file in one look
MAX_OUTPUT_FILE_BYTES = 64 << 20  # a wholly shipped output file over this is emptied
OFFSETS_SAVE_SECONDS = 1.0  # the offsets file is written at most this often


class FileTail:
    """A process's output, read from the files it writes (which outlive the agent) into a
    LogShipper.

    What was shipped is kept as a byte offset per file in ``output-offsets.json`` beside them; a
    tail made after an agent restart starts there. An offset is saved only once the shipper has
    settled every line before it, so a restart may send a line twice but never skips one. The
    tail reads only while the shipper has room, so a backlog waits in the file, not in memory.
    A wholly shipped file over MAX_OUTPUT_FILE_BYTES is emptied (the process appends, so it goes on
    at the start); a line written in the instant between the check and the truncation is lost, as
    with logrotate's copytruncate.
    """

    def __init__(self, directory, shipper, room_bytes):
        self.paths = {stream: os.path.join(directory, name) for stream, name in OUTPUT_FILES}
        self.offsets_path = os.path.join(directory, OFFSETS_FILE)
        self.shipper = shipper
        self.room_bytes = room_bytes
        self._read = self._load()  # stream -> bytes read from the file
        self._partial = {stream: b"" for stream in self.paths}  # read, not yet a whole line
        self._saved = dict(self._read)
        # The first save waits as the later ones do: a short task writes no offsets file (its
        # directory is then reused as it is; a restart may send a line twice, never skip one).
        self._saved_at = time.monotonic()
        self._lock = threading.Lock()  # one pump at a time (the thread, and a drain after it)
        self._job = None

    def _load(self):
        offsets = {stream: 0 for stream in self.paths}
        try:
            with open(self.offsets_path) as fh:
                data = json.load(fh)
            offsets.update(
                {s: int(data[s]) for s in offsets if isinstance(data.get(s), int) and data[s] >= 0}
            )
        except (OSError, ValueError, AttributeError):
            pass
        return offsets

    def open_output(self):
        """(stdout, stderr) descriptors for a new process: appended to, created mode 0600; the
        caller closes them."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        return tuple(os.open(self.paths[stream], flags, 0o600) for stream in ("stdout", "stderr"))

    def start(self, ticker):
        """Read at every tick of `ticker` (an agent.watch.Ticker, shared by the tasks) until
        stop()."""
        self._job = (ticker, ticker.add(self.pump))

    def pump(self, eof=False):
        """Feed what is new in the files (as far as the shipper has room) and save the offsets once
        shipped; True when every file was read to its end. `eof`: the process ended, so a last line
        without a newline is a line too."""
        with self._lock:
            at_end = all([self._pump(stream, eof) for stream in self.paths])
            self._save_if_settled()
        return at_end

    def _pump(self, stream, eof):
        room = self.room_bytes - self.shipper.backlog_bytes()
        if room <= 0:
            return False
        try:
            with open(self.paths[stream], "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if (
                    size < self._read[stream]
                ):  # emptied since (by this tail before a restart, or by hand)
                    self._read[stream], self._partial[stream] = 0, b""
                fh.seek(self._read[stream])
                data = fh.read(min(room, READ_BYTES))
        except FileNotFoundError:
            return True
        self._read[stream] += len(data)
        at_end = self._read[stream] >= size
        if data or (eof and at_end and self._partial[stream]):
            self._partial[stream] = self.shipper.feed(
                self._partial[stream] + data, stream, eof and at_end
            )
        return at_end

    def _shipped(self):
        return {stream: self._read[stream] - len(self._partial[stream]) for stream in self.paths}

    def _save_if_settled(self, force=False):
        offsets = self._shipped()
        if offsets == self._saved or not self.shipper.settled():
            return
        if not force and time.monotonic() - self._saved_at < OFFSETS_SAVE_SECONDS:
            return
        self._write(offsets)
        for stream, offset in offsets.items():
            if offset > MAX_OUTPUT_FILE_BYTES and not self._partial[stream]:
                self._empty(stream, offset)

    def _write(self, offsets):
        tmp = self.offsets_path + ".new"
        try:
            # 0600, the agent's alone: how much a task wrote is its owner's business (as its output
            # files are).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as fh:
                os.fchmod(fd, 0o600)  # one left by an older agent kept its mode through O_CREAT
                json.dump(offsets, fh)
            os.replace(tmp, self.offsets_path)
        except OSError as exc:
            log.warning("cannot save the output offsets in %s: %s", self.offsets_path, exc)
            return
        self._saved, self._saved_at = dict(offsets), time.monotonic()

    def _empty(self, stream, offset):
        try:
            if os.stat(self.paths[stream]).st_size != offset:
                return  # written to since: emptied another time
            os.truncate(self.paths[stream], 0)
        except OSError as exc:
            log.warning("cannot empty %s: %s", self.paths[stream], exc)
            return
        self._read[stream] = 0
        self._write(self._shipped())

    def stop(self, drain, eof=False, deadline=None, abandon=lambda: False):
        """Stop reading on the thread; with `drain`, read the files to their end first, waiting for
        the shipper's room until `deadline` (monotonic) or `abandon()`."""
        if self._job is not None:
            ticker, ident = self._job
            ticker.remove(ident)  # no pump of the ticker's from here on
        for _ in range(UNTIL_STOPPED if drain else 0):
            if self.pump(eof) or abandon() or time.monotonic() >= (deadline or 0):
                break
            self.shipper.wait_for_room(1.0)

    def save(self):
        """Save the offsets now if the shipper settled everything (after its last delivery)."""
        with self._lock:
            self._save_if_settled(force=True)
