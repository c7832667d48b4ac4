"""Reading a job's (or an instance's) output: pages in order of arrival (`after`), filtered by
rank, stream, time and a substring or bounded regex over the whole output
(services/workloads/output.py writes it; output_whole.py gives the whole).

A line's text comes from the database while fleetd keeps it (an output's first and newest lines),
else from its stored chunk; a run of lines neither has yet (the node has not uploaded them) reads
as one line of the `system` stream that says so. Chunks are read and searched on the Runtime's
offload (a thread pool under `fleetd serve`), never on the event loop.
"""

import bisect
import dataclasses
import datetime as dt
import logging
import typing

import re2

from fleetd.errors import InvalidRequest
from fleetd.models import LogLine, OutputChunk, OutputSegment, TaskOutput
from fleetd.services.workloads.output import (
    OUTPUT_SEQ_BASE,
    SEGMENT_BITS,
    seq_of,
)
from fleetd.services.workloads.output_store import StoreError
from fleetwire.output import CHUNK_RAW_BYTES, MAX_LINE_BYTES, decompress_chunk, iter_frames

log = logging.getLogger("fleetd.output")

MAX_QUERY_CHARS = 300  # a q longer than this is refused (its URL must stay under 8 KiB)
SEGMENTS_PER_READ = 64
LEGACY_SCAN_ROWS = 50_000  # rows from before numbered lines one page looks at, at most
MAX_SEGMENT_READS = 100_000  # reads of SEGMENTS_PER_READ segments one page makes at most
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS.max_mem = 16 << 20


class Line(typing.NamedTuple):
    """A line of output as a page gives it (`id` is its seq)."""

    id: int
    at: dt.datetime
    rank: int
    attempt: int
    line: int | None
    stream: str
    text: str


@dataclasses.dataclass
class Filter:
    """What a page keeps: a rank, a stream, a time range and a match (substring or regex)."""

    rank: int | None = None
    stream: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    q: str | None = None
    q_regex: bool = False

    def __post_init__(self):
        self.matcher = self.chunk_matcher = None
        if self.q:
            if len(self.q) > MAX_QUERY_CHARS:
                raise InvalidRequest(f"q is at most {MAX_QUERY_CHARS} characters")
            if self.q_regex:
                try:
                    self.matcher = re2.compile(self.q.encode(), options=_RE2_OPTIONS).search
                    lines = re2.compile(b"(?m)" + self.q.encode(), options=_RE2_OPTIONS).search
                    self.chunk_matcher = lines  # a whole chunk: ^ and $ at each line
                except re2.error as exc:
                    raise InvalidRequest(f"q is not a regex fleetd takes: {_text(exc)}") from None
            else:
                needle = self.q.encode()
                self.matcher = self.chunk_matcher = lambda data: needle in data
        self.active = bool(self.q or self.stream or self.since or self.until)
        self.since_ms = _ms(self.since) if self.since else None
        self.until_ms = _ms(self.until) if self.until else None

    def keeps(self, at_ms, stream, text_bytes):
        if self.stream is not None and stream != self.stream:
            return False
        if self.since_ms is not None and at_ms < self.since_ms:
            return False
        if self.until_ms is not None and at_ms > self.until_ms:
            return False
        return self.matcher is None or bool(self.matcher(text_bytes))


def _text(exc):
    arg = exc.args[0] if exc.args else exc
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def _ms(when):
    return int(when.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)


def _at(ms):
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).replace(tzinfo=None)


class _Reader:
    """An output's stored chunks for one request (listed once per output), read on the offload;
    and the request's time for a filtered page."""

    def __init__(self, rt, flt):
        self.rt, self.flt = rt, flt
        self.deadline = rt.clock.monotonic() + rt.settings.output_search_seconds
        self.listed = {}  # output id -> [OutputChunk] by first line
        self.starts = {}  # output id -> their first lines

    def out_of_time(self):
        return self.flt.active and self.rt.clock.monotonic() > self.deadline

    def chunk_at(self, output_id, line):
        """(the stored chunk that holds `line`, or None; the first line of the next one, or
        None)."""
        if output_id not in self.listed:
            self.listed[output_id] = list(
                OutputChunk.select()
                .where(OutputChunk.output == output_id)
                .order_by(OutputChunk.first_line)
            )
            self.starts[output_id] = [chunk.first_line for chunk in self.listed[output_id]]
        chunks, starts = self.listed[output_id], self.starts[output_id]
        index = bisect.bisect_right(starts, line) - 1
        if index >= 0 and line < chunks[index].first_line + chunks[index].lines:
            after = index + 1
            return chunks[index], starts[after] if after < len(starts) else None
        after = index + 1
        return None, starts[after] if after < len(starts) else None

    def hits(self, chunk, start, stop, limit):
        """([(line, at_ms, stream, text)] of lines [start, stop) of `chunk` the filter keeps, at
        most `limit`; the last line looked at), or None when the chunk cannot be read."""
        flt = self.flt
        if (flt.since is not None and chunk.last_at < flt.since) or (
            flt.until is not None and chunk.first_at > flt.until
        ):
            return [], stop - 1
        try:
            return self.rt.offload(
                _chunk_hits,
                self.rt.output_store,
                chunk.key,
                chunk.first_line,
                start,
                stop,
                flt,
                limit,
            )
        except (StoreError, ValueError) as exc:
            log.warning("stored output chunk %s cannot be read: %s", chunk.key, exc)
            return None


def _chunk_hits(store, key, first_line, start, stop, flt, limit):
    """_Reader.hits on the offload: inflate the chunk, test it whole first when searching."""
    raw = decompress_chunk(store.get(key), CHUNK_RAW_BYTES + MAX_LINE_BYTES + 64)
    if flt.chunk_matcher is not None and not flt.chunk_matcher(raw):
        return [], stop - 1
    found: list[tuple[int, int, str, str]] = []
    number = first_line
    for at_ms, stream, data in iter_frames(raw):
        count = data.count(b"\n")
        if number + count <= start:
            number += count
            continue
        for text in data.split(b"\n")[:-1]:
            if number >= stop:
                return found, stop - 1
            if number >= start and flt.keeps(at_ms, stream, text):
                found.append((number, at_ms, stream, _decode(text)))
                if len(found) >= limit:
                    return found, number
            number += 1
    return found, stop - 1


def _decode(data):
    return data.decode("utf-8", "replace").replace("\0", "\ufffd")


def page(rt, job_ids, after, limit, flt):
    """Up to `limit` lines of these jobs' outputs after the seq `after`, in order of arrival, as
    Lines; and the cursor to go on from (None when nothing was left to look at). A filtered page
    looks for at most output_search_seconds."""
    reader = _Reader(rt, flt)
    items, after = _legacy(job_ids, after, limit, flt), after if after is not None else -1
    if len(items) >= limit:
        return items[:limit], str(items[limit - 1].id)
    after = max(after, OUTPUT_SEQ_BASE - 1)
    for _ in range(MAX_SEGMENT_READS):
        segments = _segments(job_ids, after, flt)
        if not segments:
            return items, None
        for segment in segments:
            after = _read_segment(reader, segment, after, limit, items)
            if len(items) >= limit or reader.out_of_time():
                return items, str(after)
    return items, str(after)


def page_before(rt, job_ids, before, count):
    """Up to `count` lines before the seq `before` (None: the newest), oldest first: what a log
    view shows first, and each "load earlier" of it."""
    query = OutputSegment.select().where(OutputSegment.job.in_(job_ids))
    if before is not None:
        query = query.where(OutputSegment.id <= max(0, before - OUTPUT_SEQ_BASE) >> SEGMENT_BITS)
    needed, start = count, None
    for segment in query.order_by(OutputSegment.id.desc()).limit(count).iterator():
        low = seq_of(segment.id, segment.first_line, segment.first_line)
        high = low + segment.count if before is None else min(low + segment.count, before)
        if high <= low:
            continue
        start = max(low, high - needed)
        needed -= high - start
        if needed <= 0:
            break
    items = []
    if needed > 0:  # lines kept before numbers existed
        kept = LogLine.select().where(LogLine.job.in_(job_ids) & (LogLine.id < OUTPUT_SEQ_BASE))
        if before is not None:
            kept = kept.where(LogLine.id < before)
        items = [_row(r) for r in reversed(list(kept.order_by(LogLine.id.desc()).limit(needed)))]
    if start is not None:
        newer, _cursor = page(rt, job_ids, start - 1, count, Filter())
        items += [item for item in newer if before is None or item.id < before]
    return items


def _legacy(job_ids, after, limit, flt):
    """Lines kept before migration 0041 (their ids are their seqs, under OUTPUT_SEQ_BASE)."""
    if after is not None and after >= OUTPUT_SEQ_BASE - 1:
        return []
    query = LogLine.select().where(
        LogLine.job.in_(job_ids) & (LogLine.id < OUTPUT_SEQ_BASE) & (LogLine.id > (after or 0))
    )
    if flt.rank is not None:
        query = query.where(LogLine.rank == flt.rank)
    if flt.stream is not None:
        query = query.where(LogLine.stream == flt.stream)
    if flt.since is not None:
        query = query.where(LogLine.at >= flt.since)
    if flt.until is not None:
        query = query.where(LogLine.at <= flt.until)
    items = []
    for row in query.order_by(LogLine.id).limit(LEGACY_SCAN_ROWS).iterator():
        if flt.matcher is None or flt.matcher(row.text.encode("utf-8", "replace")):
            items.append(_row(row))
            if len(items) >= limit:
                break
    return items


def _row(row):
    return Line(row.id, row.at, row.rank, row.attempt, row.line, row.stream, row.text)


def _segments(job_ids, after, flt):
    query = (
        OutputSegment.select(OutputSegment, TaskOutput)
        .join(TaskOutput)
        .where(
            OutputSegment.job.in_(job_ids)
            & (OutputSegment.id >= (after - OUTPUT_SEQ_BASE + 1) >> SEGMENT_BITS)
        )
    )
    if flt.rank is not None:
        query = query.where(TaskOutput.rank == flt.rank)
    if flt.since is not None:
        query = query.where(OutputSegment.last_at >= flt.since)
    if flt.until is not None:
        query = query.where(OutputSegment.first_at <= flt.until)
    segments = list(query.order_by(OutputSegment.id).limit(SEGMENTS_PER_READ))
    return [s for s in segments if seq_of(s.id, s.first_line, s.first_line + s.count) > after + 1]


def _read_segment(reader, segment, after, limit, items):
    """Append the lines of `segment` after the seq `after` that the filter keeps (stored chunks
    first, then the texts fleetd keeps, else a line saying they are pending); returns the seq of
    the last line looked at."""
    output, first, flt = segment.output, segment.first_line, reader.flt
    base = seq_of(segment.id, first, first)
    line, end = max(first, first + after + 1 - base), first + segment.count
    rows: dict[int, LogLine] = {}
    for row in LogLine.select().where(
        (LogLine.id >= base + line - first) & (LogLine.id < base + segment.count)
    ):
        if row.line is not None:
            rows[row.line] = row
    row_lines = sorted(rows)
    last = after
    for _ in range(segment.count + 1):
        if line >= end or len(items) >= limit or reader.out_of_time():
            break
        chunk, next_start = reader.chunk_at(output.id, line)
        if chunk is not None:
            stop = min(end, chunk.first_line + chunk.lines)
            got = reader.hits(chunk, line, stop, limit - len(items))
            if got is not None:
                for number, at_ms, stream, text in got[0]:
                    items.append(
                        Line(
                            base + number - first,
                            _at(at_ms),
                            output.rank,
                            output.attempt,
                            number,
                            stream,
                            text,
                        )
                    )
                last, line = base + got[1] - first, got[1] + 1
                continue
            next_start = stop  # unreadable: its lines read as the texts kept, or pending
        gap_end = end if next_start is None else min(end, next_start)
        index = bisect.bisect_left(row_lines, line)
        row_line = row_lines[index] if index < len(row_lines) else end
        if row_line > line:  # lines [line, row_line) are neither stored nor kept
            upto = min(row_line, gap_end)
            _pending(segment, line, upto, items, flt)
            last, line = base + upto - 1 - first, upto
            continue
        row = rows[line]
        if flt.keeps(_ms(row.at), row.stream, row.text.encode("utf-8", "replace")):
            items.append(_row(row))
        last, line = row.id, line + 1
    return last


def _pending(segment, first, end, items, flt):
    """A `system` line for lines [first, end) of `segment` that nothing holds here yet."""
    if flt.matcher is None and flt.stream in (None, "system"):
        output = segment.output
        items.append(
            Line(
                seq_of(segment.id, segment.first_line, end - 1),
                segment.last_at,
                output.rank,
                output.attempt,
                first,
                "system",
                f"[fleetd] lines {first}-{end - 1} of rank {output.rank} are on node "
                f"{output.node_id}, not in the output store yet",
            )
        )
