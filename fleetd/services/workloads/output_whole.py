"""A job's (or an instance's) whole output: what is stored and what a node still holds (info),
and the whole as text or gzip, in line order, from the output store, and from the database where
the store lacks lines (output_read.py pages and searches it). Chunks are read and compressed on the
Runtime's offload, never on the event loop; a task that still runs is asked for what it holds
first.
"""

import time
import zlib

from fleetd.models import LogLine, OutputChunk, TaskOutput
from fleetd.services.workloads.output_store import StoreError
from fleetwire.output import CHUNK_RAW_BYTES, MAX_LINE_BYTES, decompress_chunk, iter_frames

FLUSH_POLL_SECONDS = 0.1


def outputs(job_ids, rank=None, attempt=None):
    query = TaskOutput.select().where(TaskOutput.job.in_(job_ids))
    if rank is not None:
        query = query.where(TaskOutput.rank == rank)
    if attempt is not None:
        query = query.where(TaskOutput.attempt == attempt)
    return list(query.order_by(TaskOutput.attempt, TaskOutput.rank, TaskOutput.id))


def info(job_ids, cap_bytes):
    """{bytes, lines, stored_bytes, pending_ranges, truncated, cap_bytes, outputs}."""
    found = outputs(job_ids)
    return {
        "bytes": sum(o.bytes for o in found),
        "lines": sum(o.lines for o in found),
        "stored_bytes": sum(o.stored_bytes for o in found),
        "pending_ranges": [
            {
                "rank": o.rank,
                "attempt": o.attempt,
                "first_line": o.stored_lines,
                "lines": o.lines - o.stored_lines,
                "node_id": o.node_id,
            }
            for o in found
            if o.stored_lines < o.lines
        ],
        "truncated": any(o.truncated for o in found),
        "cap_bytes": max((o.cap_bytes for o in found), default=cap_bytes),
        "outputs": [
            {
                "rank": o.rank,
                "attempt": o.attempt,
                "node_id": o.node_id,
                "lines": o.lines,
                "bytes": o.bytes,
                "stored_lines": o.stored_lines,
                "stored_bytes": o.stored_bytes,
                "truncated": o.truncated,
                "ended": o.ended,
            }
            for o in found
        ],
    }


def _chunk_text(store, key, skip, stream):
    """A stored chunk's lines as text (its first `skip` lines left out; one stream's only)."""
    raw = decompress_chunk(store.get(key), CHUNK_RAW_BYTES + MAX_LINE_BYTES + 64)
    parts = []
    for _at_ms, name, data in iter_frames(raw):
        count = data.count(b"\n")
        if skip >= count:
            skip -= count
            continue
        if skip:
            data = data.split(b"\n", skip)[-1]
            skip = 0
        if stream is None or name == stream:
            parts.append(data)
    return b"".join(parts)


def _flushed(rt, found):
    """`found` outputs again once the nodes of those still running have sealed and uploaded
    what they hold (asked through their acquire; waited for at most output_flush_seconds)."""
    running = {o.id: o.lines for o in found if not o.ended and o.stored_lines < o.lines}
    if not running:
        return found
    for output in found:
        if output.id in running:
            rt.flushes.want(output.node_id, output.task_id)
            rt.notifier.notify(("node", output.node_id), local=True)
    deadline = rt.clock.monotonic() + rt.settings.output_flush_seconds
    for _ in range(int(rt.settings.output_flush_seconds / FLUSH_POLL_SECONDS) + 1):
        fresh = {o.id: o for o in TaskOutput.select().where(TaskOutput.id.in_(list(running)))}
        if all(o.stored_lines >= running[i] for i, o in fresh.items()):
            break
        if rt.clock.monotonic() >= deadline:
            break
        time.sleep(FLUSH_POLL_SECONDS)
    return [TaskOutput.get_by_id(o.id) if o.id in running else o for o in found]


def whole(rt, job_ids, rank=None, attempt=None, stream=None):
    """The whole output of these jobs as pieces of text: each output in line order, from the
    store, and from the database where the store lacks lines (or a line saying they are pending);
    a header line before each output when there are several. A task that still runs is asked
    for what it holds first."""
    found = _flushed(rt, outputs(job_ids, rank, attempt))
    for output in found:
        if len(found) > 1:
            yield f"==> rank {output.rank}, attempt {output.attempt} <==\n".encode()
        position = 0
        chunks = list(
            OutputChunk.select()
            .where(OutputChunk.output == output.id)
            .order_by(OutputChunk.first_line)
        )
        for chunk in chunks:
            end = chunk.first_line + chunk.lines
            if end <= position:
                continue
            if chunk.first_line > position:
                yield from _gap(output, position, chunk.first_line, stream)
            try:
                yield rt.offload(
                    _chunk_text,
                    rt.output_store,
                    chunk.key,
                    max(0, position - chunk.first_line),
                    stream,
                )
            except (StoreError, ValueError) as exc:
                yield f"[fleetd] lines {chunk.first_line}-{end - 1}: unreadable ({exc})\n".encode()
            position = end
        if position < output.lines:
            yield from _gap(output, position, output.lines, stream)


def _gap(output, first, end, stream):
    """Lines [first, end) of an output that no stored chunk holds: the texts the database keeps,
    and a line for each run of the others."""
    rows = (
        LogLine.select(LogLine.line, LogLine.stream, LogLine.text)
        .where(
            (LogLine.job == output.job_id)
            & (LogLine.rank == output.rank)
            & (LogLine.attempt == output.attempt)
            & (LogLine.line >= first)
            & (LogLine.line < end)
        )
        .order_by(LogLine.line)
    )
    position, parts = first, []
    for row in rows.iterator():
        if row.line > position:
            parts.append(_missing(output, position, row.line))
        if stream is None or row.stream == stream:
            parts.append(row.text.encode("utf-8", "replace") + b"\n")
        position = row.line + 1
    if position < end:
        parts.append(_missing(output, position, end))
    yield b"".join(parts)


def _missing(output, first, end):
    return (
        f"[fleetd] lines {first}-{end - 1} are on node {output.node_id}, not in the output "
        "store yet\n"
    ).encode()


def gzipped(rt, pieces):
    """The pieces as one gzip stream (compressed piece by piece, on the offload)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    for piece in pieces:
        out = rt.offload(packer.compress, piece)
        if out:
            yield out
    yield packer.flush()
