"""A task's output kept in files on the node (issue 47): cut into numbered lines, framed into
chunks, with a state file that an agent restart resumes from.

The process writes ``stdout.log`` and ``stderr.log`` in its task directory (root's, 0600), which
outlive the agent. At each tick of the runner's Ticker the keeper reads what is new in them
(bounded), cuts whole lines (a longer one than MAX_LINE_BYTES in pieces; at the end a last line
without a newline gets one), numbers them from 0 across the streams and appends one frame per
stream and read (fleetwire.output) to the open chunk, ``output/<first line>.frames``. A chunk is
sealed at CHUNK_RAW_BYTES, past an age and at the end; the shipper (agent/task/shipping.py)
compresses it into ``<first line>.gz``, uploads it and only then deletes it. The keeper also
keeps the texts that the next OutputBatch carries (agent/task/texts.py).

``output-state.json`` says how far everything got: the raw files' consumed offsets, the next line,
the open chunk and its size, the sealed chunks not yet uploaded, the acknowledged batch position.
Saved after every tick that changed it, before a raw file is emptied. A keeper made after a restart
cuts the open chunk back to its recorded size and reads the raw files on from the recorded offsets,
so no line is skipped or numbered twice.

A raw file wholly consumed past MAX_OUTPUT_FILE_BYTES is emptied (the process appends, so it goes
on at the start); a line written in the instant between the check and the truncation is lost, as
with logrotate's copytruncate.
"""

import dataclasses
import errno
import json
import logging
import os
import threading
import time

from agent.task.chunks import Chunk, chunk_path, compress_chunk, unlink, write_all
from agent.task.texts import TailTexts, line_text
from fleetwire.output import (
    CHUNK_RAW_BYTES,
    DEFAULT_OUTPUT_CAP_BYTES,
    MAX_BATCH_LINES,
    MAX_LINE_BYTES,
    OutputBatch,
    OutputSummary,
    encode_frame,
)

log = logging.getLogger("agent.runner")

OUTPUT_FILES = (("stdout", "stdout.log"), ("stderr", "stderr.log"))
OUTPUT_DIR = "output"
STATE_NAME = "output-state.json"
# One read: a line wholly inside it cannot be over MAX_LINE_BYTES, so only the first line of a
# read (which goes on from the last one) needs measuring.
READ_BYTES = MAX_LINE_BYTES
MAX_OUTPUT_FILE_BYTES = 64 << 20  # a wholly consumed output file over this is emptied
FINISH_RETRY_SECONDS = 30.0  # the end waits this long at most for a full disk to take the rest


@dataclasses.dataclass
class OutputSettings:
    """Bounds of keeping and shipping a task's output."""

    batch_lines: int = MAX_BATCH_LINES  # most line texts in one batch (the last, at the end)
    # ... and in one while the task runs: a live view needs no more (fleetd keeps the newest
    # texts and forgets the older ones), and ten chatty tasks do not cost fleetd 40,000 row
    # writes a second
    live_batch_lines: int = 100
    batch_bytes: int = 256 * 1024  # about the most text in one batch
    interval_seconds: float = 0.25  # a tick: files read, at most one batch sent
    tick_bytes: int = 16 << 20  # most read from one file at one tick
    chunk_age_seconds: float = 120.0  # an open chunk older than this is sealed
    backoff_max_seconds: float = 60.0


def cut_lines(block, final):
    """(whole lines of `block`, each ending in a newline and none over MAX_LINE_BYTES, the rest).
    `block` is what was left from before plus one read of at most READ_BYTES; `final`: the
    process ended, so a rest is a line too."""
    pieces = []
    for _ in range(len(block) // MAX_LINE_BYTES + 1):  # only its first line can be too long
        if block.find(b"\n", 0, MAX_LINE_BYTES + 1) >= 0 or len(block) <= MAX_LINE_BYTES:
            break
        pieces.append(block[:MAX_LINE_BYTES] + b"\n")
        block = block[MAX_LINE_BYTES:]
    end = block.rfind(b"\n") + 1
    whole, rest = block[:end], block[end:]
    if final and rest:
        whole, rest = whole + rest + b"\n", b""
    if pieces:
        whole = b"".join(pieces) + whole
    return whole, rest


def _write_json(path, data):
    tmp = path + ".new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


class OutputKeeper:
    """One task's output: its raw files read into numbered lines, chunk files and batch texts.

    Thread-safe: the ticker pumps, the shipper's threads take batches and chunks.
    """

    def __init__(self, directory, epoch, cap_bytes=None, settings=None, label=""):
        self.dir = directory
        self.epoch = epoch
        self.cap = cap_bytes or DEFAULT_OUTPUT_CAP_BYTES
        self.settings = settings or OutputSettings()
        self.label = label
        self.paths = {stream: os.path.join(directory, name) for stream, name in OUTPUT_FILES}
        self.out_dir = os.path.join(directory, OUTPUT_DIR)
        self.state_path = os.path.join(directory, STATE_NAME)
        self.lock = threading.Lock()
        self.offsets = {stream: 0 for stream in self.paths}  # consumed into lines (or discarded)
        self.next_line = 0
        self.total_bytes = 0  # of the lines kept
        self.last_at = 0
        self.open: Chunk | None = None
        self.sealed: list[Chunk] = []  # not yet uploaded, in order
        self.acked_line = 0  # fleetd has every line before this in a batch
        self.acked_bytes = 0
        self.unacked_first_at = None
        self.warned = False  # cap_warning due or sent
        self.capped = False  # the cap was reached: the rest is discarded
        self.notice = None  # what the next batch says
        self.ended = False  # read to the end after the process ended
        self._partial = {stream: b"" for stream in self.paths}
        self._texts = TailTexts(self.settings.batch_lines, self.settings.batch_bytes)
        self._since_snapshot_at = None  # at_ms of the first line after the last batch taken
        self._fd = None  # the open chunk's, once opened in this agent
        self._full_disk = 0  # ticks in a row that a full disk stopped
        self._load()

    # The raw files.

    def open_output(self):
        """(stdout, stderr) descriptors for a new process: appended to, created mode 0600; the
        caller closes them."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        return tuple(os.open(self.paths[stream], flags, 0o600) for stream in ("stdout", "stderr"))

    def pump(self, eof=False):
        """Read what is new in the files into lines (bounded); (changed, every file read to its
        end). `eof`: the process ended, so a last line without a newline is a line too."""
        with self.lock:
            changed, at_end = False, True
            for stream in self.paths:
                more, done = self._pump(stream, eof)
                changed, at_end = changed or more, at_end and done
            if self.open is not None and (
                (eof and at_end)
                or time.time() * 1000 - self.open.first_at >= self.settings.chunk_age_seconds * 1000
            ):
                self._seal()
                changed = True
            if changed and self._save():  # a raw file is emptied only once the state says so
                self._empty_consumed()
            return changed, at_end

    def _pump(self, stream, eof):
        path = self.paths[stream]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False, True
        changed = False
        try:
            size = os.fstat(fd).st_size
            if size < self.offsets[stream]:  # emptied since (by this keeper before a restart)
                self.offsets[stream], self._partial[stream] = 0, b""
            read_to = self.offsets[stream] + len(self._partial[stream])
            for _ in range(self.settings.tick_bytes // READ_BYTES + 1):
                if read_to >= size:
                    break
                data = os.pread(fd, min(READ_BYTES, size - read_to), read_to)
                if not data:
                    break
                final = eof and read_to + len(data) >= size
                if not self._take(stream, self._partial[stream] + data, final):
                    return changed, False
                read_to += len(data)
                changed = True
            if eof and read_to >= size and self._partial[stream]:
                if not self._take(stream, self._partial[stream], True):
                    return changed, False
                changed = True
            return changed, read_to >= size
        finally:
            os.close(fd)

    def _take(self, stream, block, final):
        """Keep the whole lines of `block` (what was left plus one read) as a frame; False when
        the disk took none of it (then nothing was consumed)."""
        whole, rest = cut_lines(block, final)
        if self.capped:  # read and discarded, so that the raw files are still emptied
            self.offsets[stream] += len(block)
            self._partial[stream] = b""
            return True
        if not whole:
            self._partial[stream] = rest
            return True
        frames = [(stream, whole)]
        over = self.total_bytes + len(whole) > self.cap
        if over:
            room = max(0, self.cap - self.total_bytes)
            kept = whole[: whole.rfind(b"\n", 0, room) + 1]
            note = (
                f"[fleet-agent] output cap of {self.cap} bytes reached: the rest of this task's "
                "output is discarded"
            )
            frames = ([(stream, kept)] if kept else []) + [("system", note.encode() + b"\n")]
        if not self._append(frames, int(time.time() * 1000)):
            return False
        if over:
            self.capped, self.notice = True, "cap_reached"
            log.warning("task %s: %s", self.label, frames[-1][1].decode().strip())
            self.offsets[stream] += len(block)
            self._partial[stream] = b""
        else:
            self.offsets[stream] += len(block) - len(rest)
            self._partial[stream] = rest
        return True

    def note(self, text):
        """A line of the agent's own (the system stream), e.g. an instance's restart."""
        with self.lock:
            if self.capped:
                return
            data = line_text(text.encode("utf-8", "replace")).encode() + b"\n"
            if self._append([("system", data)], int(time.time() * 1000)):
                self._save()

    def _append(self, frames, at_ms):
        """Append [(stream, whole lines)] as frames, in one write; False on a full disk (then
        nothing was kept)."""
        blob = b"".join(encode_frame(at_ms, stream, data) for stream, data in frames)
        try:
            if self.open is not None and self.open.bytes + len(blob) > CHUNK_RAW_BYTES:
                self._seal()
            if self.open is None:
                os.makedirs(self.out_dir, mode=0o700, exist_ok=True)
                self.open = Chunk(self.next_line, first_at=at_ms)
                self._fd = self._open_chunk(self.open, truncate=True)
            elif self._fd is None:
                self._fd = self._open_chunk(self.open, truncate=False)
            write_all(self._fd, blob, self.open.bytes)
        except OSError as exc:
            self._disk_problem(exc)
            return False
        self._full_disk = 0
        self.open.bytes += len(blob)
        self.open.last_at = self.last_at = at_ms
        if self.unacked_first_at is None:
            self.unacked_first_at = at_ms
        if self._since_snapshot_at is None:
            self._since_snapshot_at = at_ms
        for stream, data in frames:
            count = data.count(b"\n")
            self._texts.add(stream, data, self.next_line, count, at_ms)
            self.open.lines += count
            self.next_line += count
            self.total_bytes += len(data)
        if not self.warned and self.total_bytes >= self.cap // 10:
            self.warned = True
            self.notice = self.notice or "cap_warning"
        return True

    def _open_chunk(self, chunk, truncate):
        path = self._chunk_path(chunk, ".frames")
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
        fd = os.open(path, flags, 0o600)
        if not truncate:  # resumed: what was written after the last saved state goes
            os.ftruncate(fd, chunk.bytes)
        os.lseek(fd, 0, os.SEEK_END)
        return fd

    def _disk_problem(self, exc):
        self._full_disk += 1
        if self._full_disk == 1 or self._full_disk % 100 == 0:
            what = "the disk is full" if exc.errno == errno.ENOSPC else str(exc)
            log.error(
                "task %s: cannot keep its output (%s); it waits in its files, tried again at the "
                "next tick",
                self.label,
                what,
            )

    # Chunks.

    def _chunk_path(self, chunk, suffix):
        return chunk_path(self.out_dir, chunk, suffix)

    def seal_now(self):
        """Seal the open chunk now (a reader waits for it); False when none holds a line."""
        with self.lock:
            if self.open is None or not self.open.lines:
                return False
            self._seal()
            self._save()
            return True

    def _seal(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.open is not None and self.open.lines:
            self.sealed.append(self.open)
        elif self.open is not None:  # made by a write the full disk refused
            unlink(self._chunk_path(self.open, ".frames"))
        self.open = None

    def next_chunk(self):
        """The first sealed chunk not yet uploaded, or None."""
        with self.lock:
            return self.sealed[0] if self.sealed else None

    def chunk_blob(self, chunk):
        """The gzip bytes of a sealed chunk (compressed the first time); OSError to retry."""
        return compress_chunk(self.out_dir, chunk)

    def uploaded(self, chunk):
        """fleetd stored the chunk (or it is given up): it goes from the node."""
        with self.lock:
            if chunk in self.sealed:
                self.sealed.remove(chunk)
            unlink(self._chunk_path(chunk, ".gz"))
            unlink(self._chunk_path(chunk, ".frames"))
            self._save()

    # Batches.

    def batch(self, max_texts):
        """The next OutputBatch: every line since the last acknowledged one, with at most
        `max_texts` texts (the first lines', then the newest); None when there is none."""
        with self.lock:
            if self.next_line <= self.acked_line:
                return None
            self._since_snapshot_at = None
            return OutputBatch(
                epoch=self.epoch,
                first_line=self.acked_line,
                count=self.next_line - self.acked_line,
                first_at=self.unacked_first_at or self.last_at,
                last_at=self.last_at,
                bytes=self.total_bytes - self.acked_bytes,
                lines=self._texts.pick(self.acked_line, max_texts),
                notice=self.notice,
            )

    def acked(self, batch):
        """fleetd took `batch` (204)."""
        with self.lock:
            end = batch.first_line + batch.count
            if end <= self.acked_line:
                return
            self.acked_line, self.acked_bytes = end, self.acked_bytes + batch.bytes
            self.unacked_first_at = self._since_snapshot_at if self.next_line > end else None
            if batch.notice == self.notice:
                self.notice = None
            self._texts.drop_before(end)
            self._save()

    def unacked(self):
        """True while some line was not acknowledged in a batch."""
        with self.lock:
            return self.next_line > self.acked_line

    # The end.

    def finish(self, deadline=None):
        """Read the files to their end (the process ended) and seal the chunk; the summary for the
        finish report (None: the task wrote nothing). Bounded: a full disk is waited for until
        `deadline` (monotonic), then what was kept is what is reported."""
        deadline = deadline or time.monotonic() + FINISH_RETRY_SECONDS
        for _ in range(1_000_000):
            _changed, at_end = self.pump(eof=True)
            if at_end or time.monotonic() >= deadline:
                break
            if self._full_disk:
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        with self.lock:
            self._seal()
            self.ended = True
            if self.next_line:  # a silent task leaves no file (its directory may be reused)
                self._save()
        return self.summary()

    def summary(self):
        """OutputSummary so far, or None when nothing was written."""
        with self.lock:
            if not self.next_line:
                return None
            return OutputSummary(self.next_line, self.total_bytes, self.capped)

    def pending(self):
        """True while something is left to ship: a line not acknowledged, a chunk not uploaded."""
        with self.lock:
            return self.next_line > self.acked_line or bool(self.sealed) or self.open is not None

    def remove_files(self):
        """Everything shipped or given up: the chunks and the state file go."""
        with self.lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self.sealed, self.open = [], None
            try:
                names = os.listdir(self.out_dir)
            except OSError:
                names = []
            for name in names:
                unlink(os.path.join(self.out_dir, name))
            try:
                os.rmdir(self.out_dir)
            except OSError:
                pass
            unlink(self.state_path)

    # The state file.

    def _state(self):
        return {
            "offsets": dict(self.offsets),
            "next_line": self.next_line,
            "bytes": self.total_bytes,
            "last_at": self.last_at,
            "open": dataclasses.asdict(self.open) if self.open is not None else None,
            "sealed": [dataclasses.asdict(c) for c in self.sealed],
            "acked_line": self.acked_line,
            "acked_bytes": self.acked_bytes,
            "unacked_first_at": self.unacked_first_at,
            "warned": self.warned,
            "capped": self.capped,
            "notice": self.notice,
            "ended": self.ended,
        }

    def _save(self):
        """Write the state (atomically, 0600: how much a task wrote is its owner's business)."""
        try:
            _write_json(self.state_path, self._state())
        except OSError as exc:
            self._disk_problem(exc)
            return False
        return True

    def _load(self):
        try:
            with open(self.state_path) as fh:
                data = json.load(fh)
            offsets = {s: int(data["offsets"][s]) for s in self.paths}
            opened = Chunk.from_state(data["open"]) if data.get("open") else None
            sealed = [Chunk.from_state(c) for c in data.get("sealed") or []]
            numbers = [int(data[k]) for k in ("next_line", "bytes", "acked_line", "acked_bytes")]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("task %s: output state %s unusable (%s)", self.label, self.state_path, exc)
            return
        self.offsets, self.open, self.sealed = offsets, opened, sealed
        self.next_line, self.total_bytes, self.acked_line, self.acked_bytes = numbers
        self.last_at = int(data.get("last_at") or 0)
        self.unacked_first_at = data.get("unacked_first_at")
        self.warned, self.capped = bool(data.get("warned")), bool(data.get("capped"))
        self.notice = data.get("notice")
        self.ended = bool(data.get("ended"))
        log.info(
            "task %s: output resumed at line %d (%d chunk(s) to upload)",
            self.label,
            self.next_line,
            len(self.sealed) + (self.open is not None),
        )

    def _empty_consumed(self):
        """Empty a raw file consumed past MAX_OUTPUT_FILE_BYTES (the state says so first)."""
        for stream, offset in self.offsets.items():
            if offset <= MAX_OUTPUT_FILE_BYTES or self._partial[stream]:
                continue
            try:
                if os.stat(self.paths[stream]).st_size != offset:
                    continue  # written to since: emptied another time
                os.truncate(self.paths[stream], 0)
            except OSError as exc:
                log.warning("cannot empty %s: %s", self.paths[stream], exc)
                continue
            self.offsets[stream] = 0
            self._save()
