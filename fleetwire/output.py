"""A task's output on the wire and at rest, defined once for fleetd and the agent.

A task's output (one per rank and attempt) is a sequence of lines numbered from 0 across its
streams. The agent keeps it in *chunks*: gzip files of *frames*, each frame one read of one
stream with one timestamp::

    <at_ms> <stream code> <nbytes>\\n<nbytes of whole lines, each ending in \\n>

(stream codes: ``o`` stdout, ``e`` stderr, ``s`` the agent's own notes). A chunk holds the lines
``[first_line, first_line + lines)``; the agent uploads it whole (``ChunkMeta`` in the query of
``PUT /api/v1/agent/tasks/{id}/output/{first_line}``) and fleetd keeps it in its output store
as it came.

While the task runs the agent also sends ``OutputBatch``es (``POST .../logs``): each covers the
next lines of the output, ``[first_line, first_line + count)``, in order, and carries the text
of some of them (the first lines of the output and the newest ones): fleetd keeps that text as
the output's tail and numbers every line of the batch in the job's order of arrival.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator
from typing import Any

from fleetwire.checks import is_int

STREAM_CODES = {"stdout": "o", "stderr": "e", "system": "s"}
STREAMS = {code: name for name, code in STREAM_CODES.items()}
NOTICES = ("cap_warning", "cap_reached")

DEFAULT_OUTPUT_CAP_BYTES = 1 << 30  # per task, unless the job or its fleet says otherwise
MIN_OUTPUT_CAP_BYTES = 1 << 16
MAX_OUTPUT_CAP_BYTES = 1 << 40
CHUNK_RAW_BYTES = 4 << 20  # a chunk is sealed at this much output (before compression)
MAX_CHUNK_UPLOAD_BYTES = 8 << 20  # the most one compressed chunk may be on upload
MAX_LINE_BYTES = 1 << 20  # a longer line is cut into pieces of this size
MAX_BATCH_LINES = 1000  # the most line texts one OutputBatch carries
HEAD_LINES = 100  # the first lines of an output are always sent with their text
MAX_AT_MS = 253402300799999  # a time in milliseconds since the epoch: at most 9999-12-31


def encode_frame(at_ms: int, stream: str, data: bytes) -> bytes:
    """One frame; `data` is whole lines, each ending in a newline."""
    return b"%d %s %d\n" % (at_ms, STREAM_CODES[stream].encode(), len(data)) + data


def iter_frames(raw: bytes) -> Iterator[tuple[int, str, bytes]]:
    """(at_ms, stream name, lines' bytes) of each frame in `raw` (a chunk, decompressed);
    ValueError at the first malformed frame."""
    pos, end = 0, len(raw)
    for _ in range(end + 1):
        if pos >= end:
            return
        cut = raw.find(b"\n", pos, pos + 64)
        parts = raw[pos:cut].split(b" ") if cut >= 0 else []
        if len(parts) != 3 or parts[1].decode("ascii", "replace") not in STREAMS:
            raise ValueError(f"malformed frame header at byte {pos}")
        try:
            at_ms, size = int(parts[0]), int(parts[2])
        except ValueError:
            raise ValueError(f"malformed frame header at byte {pos}") from None
        data = raw[cut + 1 : cut + 1 + size]
        if size < 0 or len(data) != size or (size and not data.endswith(b"\n")):
            raise ValueError(f"truncated frame at byte {pos}")
        yield at_ms, STREAMS[parts[1].decode("ascii")], data
        pos = cut + 1 + size


def iter_lines(raw: bytes) -> Iterator[tuple[int, str, bytes]]:
    """(at_ms, stream name, one line without its newline) of every line in `raw`."""
    for at_ms, stream, data in iter_frames(raw):
        for line in data.split(b"\n")[:-1]:
            yield at_ms, stream, line


def decompress_chunk(blob: bytes, limit: int) -> bytes:
    """A chunk's frames from its gzip bytes; ValueError when it is not gzip or inflates past
    `limit` bytes."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        raw = inflater.decompress(blob, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"not a gzip stream: {exc}") from None
    if len(raw) > limit or inflater.unconsumed_tail:
        raise ValueError(f"inflates past {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise ValueError("not one whole gzip stream")
    return raw


def _count(data: dict[str, Any], name: str, minimum: int = 0, maximum: int = 2**62) -> int:
    value = data.get(name)
    if not is_int(value) or not minimum <= value <= maximum:
        raise ValueError(f"{name} must be an integer from {minimum} to {maximum}")
    return value


@dataclasses.dataclass(frozen=True)
class OutputBatch:
    """The next `count` lines of a task's output, from `first_line`, seen at `first_at`..`last_at`
    (milliseconds since the epoch), `bytes` long; `lines` are [line, at_ms, stream, text] of some
    of them, in line order. `notice`: the output passed a tenth of its cap, or reached it."""

    epoch: int
    first_line: int
    count: int
    first_at: int
    last_at: int
    bytes: int
    lines: tuple[tuple[int, int, str, str], ...]
    notice: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out = {
            "epoch": self.epoch,
            "first_line": self.first_line,
            "count": self.count,
            "first_at": self.first_at,
            "last_at": self.last_at,
            "bytes": self.bytes,
            "lines": [list(line) for line in self.lines],
        }
        if self.notice:
            out["notice"] = self.notice
        return out

    @classmethod
    def from_wire(cls, data: Any) -> OutputBatch:
        if not isinstance(data, dict):
            raise ValueError("an output batch must be an object")
        epoch, first_line = _count(data, "epoch"), _count(data, "first_line")
        count, size = _count(data, "count"), _count(data, "bytes")
        first_at = _count(data, "first_at", maximum=MAX_AT_MS)
        last_at = _count(data, "last_at", maximum=MAX_AT_MS)
        if last_at < first_at:
            raise ValueError("last_at must not be before first_at")
        lines, raw = [], data.get("lines")
        if not isinstance(raw, list) or len(raw) > min(count, MAX_BATCH_LINES):
            raise ValueError(f"lines must be a list of at most count and {MAX_BATCH_LINES} items")
        before = first_line - 1
        for item in raw:
            if (
                not isinstance(item, list)
                or len(item) != 4
                or not is_int(item[0])
                or not before < item[0] < first_line + count
                or not is_int(item[1])
                or not 0 <= item[1] <= MAX_AT_MS
                or item[2] not in STREAM_CODES
                or not isinstance(item[3], str)
            ):
                raise ValueError(
                    "lines must be [line, at_ms, stream, text] in line order, within the batch"
                )
            before = item[0]
            lines.append((item[0], item[1], item[2], item[3]))
        notice = data.get("notice")
        if notice is not None and notice not in NOTICES:
            raise ValueError(f"notice must be one of {', '.join(NOTICES)}")
        return cls(epoch, first_line, count, first_at, last_at, size, tuple(lines), notice)


@dataclasses.dataclass(frozen=True)
class ChunkMeta:
    """What an uploaded chunk holds: `lines` lines from `first_line`, `bytes` of frames before
    compression, seen at `first_at`..`last_at` (ms)."""

    epoch: int
    first_line: int
    lines: int
    bytes: int
    first_at: int
    last_at: int

    def to_query(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "lines": self.lines,
            "bytes": self.bytes,
            "first_at": self.first_at,
            "last_at": self.last_at,
        }

    @classmethod
    def from_query(cls, first_line: int, data: dict[str, Any]) -> ChunkMeta:
        values = {}
        for name in ("epoch", "lines", "bytes", "first_at", "last_at"):
            try:
                values[name] = int(data.get(name, ""))
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be an integer") from None
            if not 0 <= values[name] <= (MAX_AT_MS if name.endswith("_at") else 2**62):
                raise ValueError(f"{name} is out of range")
        if values["lines"] < 1 or values["bytes"] > CHUNK_RAW_BYTES + MAX_LINE_BYTES + 64:
            raise ValueError("a chunk holds at least one line and at most its size")
        return cls(first_line=first_line, **values)


@dataclasses.dataclass(frozen=True)
class OutputSummary:
    """A task's whole output at its end (in its finish report): how many lines and bytes, and
    whether its cap cut it."""

    lines: int
    bytes: int
    truncated: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"lines": self.lines, "bytes": self.bytes, "truncated": self.truncated}

    @classmethod
    def from_wire(cls, data: Any) -> OutputSummary:
        if not isinstance(data, dict):
            raise ValueError("output must be an object")
        truncated = data.get("truncated", False)
        if not isinstance(truncated, bool):
            raise ValueError("output.truncated must be true or false")
        return cls(_count(data, "lines"), _count(data, "bytes"), truncated)
