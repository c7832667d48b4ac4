"""A task's output as fleetd keeps it (docs/api.md, Output): the whole in the output store
(output_store.py: a directory or a bucket) as the agents' compressed chunks; a bounded tail of
text in the database (the first HEAD_LINES lines of each output and its newest tail_lines); and
the order in which its lines arrived, as OutputSegments.

Each line has a `seq`, unique and rising in order of arrival within a job and within an
instance's runs: a segment numbered `id` gives its lines OUTPUT_SEQ_BASE + (id << 20) onwards
(a segment holds at most SEGMENT_LINES). A segment grows while it is its job's newest, so a
single-rank job needs a row per million lines, not per batch. Rows of LogLine written before
(migration 0041) kept their own ids as seqs, all below OUTPUT_SEQ_BASE.

A node writes to an output while it holds the task's lease at that epoch, and, once the output
exists, for as long as it was the node that ran it: what it uploads after the task ended or was
retried elsewhere is still stored.
"""

import datetime as dt
import logging

import peewee

from fleetd.db import write_transaction
from fleetd.errors import Conflict, InvalidRequest, NotFound, StoreUnavailable
from fleetd.models import (
    DEFAULT_OUTPUT_CAP_BYTES,
    DEFAULT_OUTPUT_RETENTION_DAYS,
    Fleet,
    Job,
    LogLine,
    Node,
    OutputChunk,
    OutputSegment,
    Task,
    TaskOutput,
    TaskState,
)
from fleetd.services.notify.events import record_event
from fleetd.services.workloads.output_store import StoreError
from fleetd.sql import insert_rows
from fleetwire.output import (
    CHUNK_RAW_BYTES,
    HEAD_LINES,
    MAX_LINE_BYTES,
    OutputBatch,
    decompress_chunk,
    iter_frames,
)

log = logging.getLogger("fleetd.output")

OUTPUT_SEQ_BASE = 1 << 32
SEGMENT_BITS = 20
SEGMENT_LINES = 1 << SEGMENT_BITS
MAX_TEXT_CHARS = 65536  # a kept line's text is cut here (the store has the whole)
NOTICE_EVENTS = {
    "cap_warning": (
        "job.output_cap_warning",
        "its output passed a tenth of its cap of {cap} bytes",
    ),
    "cap_reached": (
        "job.output_truncated",
        "its output reached its cap of {cap} bytes: the rest was discarded",
    ),
}


def seq_of(segment_id, first_line, line):
    """The seq of `line` of the segment numbered `segment_id` that starts at `first_line`."""
    return OUTPUT_SEQ_BASE + (segment_id << SEGMENT_BITS) + (line - first_line)


def _task_cap(task, job):
    spec = job.job_spec
    if spec.output_cap_bytes is not None:
        return spec.output_cap_bytes
    row = (
        Fleet.select(Fleet.output_cap_bytes)
        .join(Node, on=(Node.fleet == Fleet.name))
        .where(Node.id == task.node_id)
        .first()
    )
    return row.output_cap_bytes if row is not None else DEFAULT_OUTPUT_CAP_BYTES


def writable_output(node_id, task_id, epoch, create=True):
    """The TaskOutput this node writes for (task, epoch): one it ran, or a new one while it holds
    the task's lease at that epoch (None without `create`). Conflict (409) when it may not."""
    output = TaskOutput.get_or_none((TaskOutput.task_id == task_id) & (TaskOutput.epoch == epoch))
    if output is not None:
        if output.node_id != node_id:
            raise Conflict(
                f"the output of task {task_id} at epoch {epoch} is another node's",
                {"task_id": task_id, "epoch": epoch},
            )
        return output
    task = Task.get_or_none_by_id(task_id)
    if task is None:
        raise NotFound(f"task {task_id} not found")
    if task.node_id != node_id or task.epoch != epoch or task.state == TaskState.PENDING.value:
        raise Conflict(
            f"stale lease for task {task_id}: epoch {epoch} is not current on this node",
            {"task_id": task_id, "epoch": epoch},
        )
    if not create:
        return None
    job = Job.get_by_id(task.job_id)
    return TaskOutput.create(
        job=task.job_id,
        rank=task.rank,
        attempt=job.attempt,
        task_id=task_id,
        epoch=epoch,
        node_id=node_id,
        cap_bytes=_task_cap(task, job),
    )


def _extend(output, first_line, count, first_at, last_at):
    """Segments for lines [first_line, first_line + count) of `output`, learnt now; returns them
    as [(segment id, first line, count)]."""
    made = []
    newest = (
        OutputSegment.select()
        .where(OutputSegment.job == output.job_id)
        .order_by(OutputSegment.id.desc())
        .first()
    )
    if (
        newest is not None
        and newest.output_id == output.id
        and newest.first_line + newest.count == first_line
        and newest.count < SEGMENT_LINES
    ):
        grow = min(count, SEGMENT_LINES - newest.count)
        OutputSegment.update(count=OutputSegment.count + grow, last_at=last_at).where(
            OutputSegment.id == newest.id
        ).execute()
        made.append((newest.id, newest.first_line, newest.count + grow))
        first_line, count = first_line + grow, count - grow
    for _ in range(count // SEGMENT_LINES + 1):
        if count <= 0:
            break
        part = min(count, SEGMENT_LINES)
        segment = OutputSegment.create(
            job=output.job_id,
            output=output.id,
            first_line=first_line,
            count=part,
            first_at=first_at,
            last_at=last_at,
        )
        made.append((segment.id, first_line, part))
        first_line, count = first_line + part, count - part
    return made


def _seq_for(segments, line):
    for segment_id, first, count in segments:
        if first <= line < first + count:
            return seq_of(segment_id, first, line)
    return None


def append_output(rt, node_id, task_id, batch, trim=True):
    """The next lines of a task's output (a fleetwire OutputBatch): numbered in the job's order,
    the texts it carries kept, older ones past the tail forgotten (the store has them; not with
    `trim` false: an agent that uploads no chunks)."""
    now = rt.clock.now()
    first_at, last_at = _time(batch.first_at), _time(batch.last_at)
    with write_transaction():
        output = writable_output(node_id, task_id, batch.epoch)
        # Lines fleetd has are skipped (a batch sent again); lines before first_line it lacks
        # (a batch lost with an agent's state) get their seqs too: the chunks hold them.
        start, end = output.lines, batch.first_line + batch.count
        if end > start:
            segments = _extend(output, start, end - start, first_at, last_at)
            rows = []
            for line, at_ms, stream, text in batch.lines:
                if line < start:
                    continue  # sent before (the answer to an earlier try was lost)
                rows.append(
                    {
                        "id": _seq_for(segments, line),
                        "job": output.job_id,
                        "rank": output.rank,
                        "attempt": output.attempt,
                        "line": line,
                        "at": _time(at_ms),
                        "stream": stream,
                        "text": text[:MAX_TEXT_CHARS].replace("\0", "\ufffd"),
                    }
                )
            if rows:
                insert_rows(LogLine, rows)  # compiled: insert_many made SQL for every row
            if batch.first_line >= output.lines:  # a batch sent again is not counted twice
                output.bytes += batch.bytes
            output.lines = end
            output.first_at = output.first_at or first_at
            output.last_at = last_at
            output.save()
            if trim:
                _forget_middle(rt, output)
        if batch.notice is not None:
            kind, reason = NOTICE_EVENTS[batch.notice]
            record_event(
                now,
                kind,
                "job",
                output.job_id,
                f"rank {output.rank}: " + reason.format(cap=output.cap_bytes),
            )
            if batch.notice == "cap_reached":
                TaskOutput.update(truncated=True).where(TaskOutput.id == output.id).execute()


def append_lines(rt, node_id, task_id, epoch, lines):
    """Lines of an agent that sends [stream, text(, rank)] (before OutputBatch): the next lines
    of the task's output, every text kept until the tail passes it."""
    now_ms = int(rt.clock.now().replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
    with write_transaction():
        first = writable_output(node_id, task_id, epoch).lines
        texts = tuple((first + i, now_ms, line[0], line[1]) for i, line in enumerate(lines))
        size = sum(len(text.encode("utf-8", "replace")) + 1 for _n, _at, _s, text in texts)
        append_output(
            rt,
            node_id,
            task_id,
            OutputBatch(epoch, first, len(texts), now_ms, now_ms, size, texts),
            trim=False,
        )


def _forget_middle(rt, output):
    """Keep the first HEAD_LINES and the newest tail lines of an output as text."""
    keep_from = output.lines - rt.settings.output_tail_lines
    if keep_from <= HEAD_LINES:
        return
    LogLine.delete().where(
        (LogLine.job == output.job_id)
        & (LogLine.rank == output.rank)
        & (LogLine.attempt == output.attempt)
        & (LogLine.line >= HEAD_LINES)
        & (LogLine.line < keep_from)
    ).execute()


def note_finish(task, job, node_id, summary, now):
    """A finish report's OutputSummary (inside its transaction): the output's whole size."""
    output = TaskOutput.get_or_none(
        (TaskOutput.task_id == task.id) & (TaskOutput.epoch == task.epoch)
    )
    if output is None:
        output = TaskOutput(
            job=task.job_id,
            rank=task.rank,
            attempt=job.attempt,
            task_id=task.id,
            epoch=task.epoch,
            node_id=node_id,
            cap_bytes=_task_cap(task, job),
            first_at=now,
            last_at=now,
        )
    output.bytes = max(output.bytes, summary.bytes)
    output.truncated = output.truncated or summary.truncated
    output.ended = True
    output.save()
    if summary.lines > output.lines:  # lines no batch announced yet: their seqs now
        _extend(output, output.lines, summary.lines - output.lines, now, now)
        output.lines = summary.lines
        output.save()


def _check_chunk(blob, meta):
    """A chunk's frames checked against its meta; InvalidRequest (400) names what is wrong."""
    try:
        raw = decompress_chunk(blob, CHUNK_RAW_BYTES + MAX_LINE_BYTES + 64)
        lines = sum(data.count(b"\n") for _at, _stream, data in iter_frames(raw))
    except ValueError as exc:
        raise InvalidRequest(f"the chunk is not one: {exc}") from None
    if lines != meta.lines or len(raw) != meta.bytes:
        raise InvalidRequest(
            f"the chunk holds {lines} lines in {len(raw)} bytes, not {meta.lines} in {meta.bytes}"
        )


def store_chunk(rt, node_id, task_id, meta, blob):
    """Keep an uploaded chunk (fleetwire ChunkMeta and its gzip bytes) in the output store; a
    chunk stored before is not written again."""
    with write_transaction():
        output = writable_output(node_id, task_id, meta.epoch)
        if _stored(output, meta):
            return
    rt.offload(_check_chunk, blob, meta)
    key = f"{output.job_id}/{output.rank}-{output.attempt}-{output.id}/{meta.first_line:012d}.gz"
    try:
        rt.offload(rt.output_store.put, key, blob)
    except StoreError as exc:
        log.error("the output store (%s) cannot take %s: %s", rt.output_store.describe(), key, exc)
        raise StoreUnavailable(
            f"the output store cannot take this chunk now ({exc}): keep it and retry"
        ) from None
    first_at, last_at = _time(meta.first_at), _time(meta.last_at)
    with write_transaction():
        output = TaskOutput.get_by_id(output.id)
        if _stored(output, meta):
            return
        OutputChunk.create(
            output=output.id,
            first_line=meta.first_line,
            lines=meta.lines,
            bytes=meta.bytes,
            stored_bytes=len(blob),
            first_at=first_at,
            last_at=last_at,
            key=key,
        )
        end = meta.first_line + meta.lines
        if end > output.lines:  # lines no batch announced (lost with a node's state): seqs too
            _extend(output, output.lines, end - output.lines, first_at, last_at)
            output.lines = end
        output.stored_bytes += len(blob)
        output.stored_lines = _stored_prefix(output)
        output.save()


def _stored(output, meta):
    chunk = OutputChunk.get_or_none(
        (OutputChunk.output == output.id) & (OutputChunk.first_line == meta.first_line)
    )
    if chunk is None:
        return False
    if chunk.lines != meta.lines:
        raise Conflict(
            f"lines {meta.first_line}.. of this output were stored as {chunk.lines} lines, "
            f"not {meta.lines}"
        )
    return True


def _stored_prefix(output):
    """How many first lines of `output` its stored chunks hold without a gap."""
    end = 0
    for chunk in (
        OutputChunk.select(OutputChunk.first_line, OutputChunk.lines)
        .where(OutputChunk.output == output.id)
        .order_by(OutputChunk.first_line)
    ):
        if chunk.first_line > end:
            break
        end = max(end, chunk.first_line + chunk.lines)
    return end


def _time(ms):
    """A time the agent gave in milliseconds since the epoch, as fleetd stores times (naive UTC)."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).replace(tzinfo=None)


def expired_outputs(now):
    """Ids of the outputs whose job ended longer ago than its fleet's output_retention_days (the
    fleet of the node that ran it; the default where that node is gone)."""
    days = {
        f.name: f.output_retention_days
        for f in Fleet.select(Fleet.name, Fleet.output_retention_days)
    }
    shortest = min([DEFAULT_OUTPUT_RETENTION_DAYS, *days.values()])
    rows = (
        TaskOutput.select(TaskOutput.id, Job.ended_at, Node.fleet)
        .join(Job, on=(Job.id == TaskOutput.job))
        .join(Node, peewee.JOIN.LEFT_OUTER, on=(Node.id == TaskOutput.node_id))
        .where(Job.ended_at < now - dt.timedelta(days=shortest))
        .tuples()
    )
    return [
        output_id
        for output_id, ended_at, fleet in rows.iterator()
        if ended_at < now - dt.timedelta(days=days.get(fleet, DEFAULT_OUTPUT_RETENTION_DAYS))
    ]


def outputs_of(job_ids):
    """Ids of the outputs of these jobs."""
    return [o.id for o in TaskOutput.select(TaskOutput.id).where(TaskOutput.job.in_(job_ids))]


def stored_chunks(output_ids):
    """(key, stored bytes) of the stored chunks of these outputs."""
    found: list[tuple[str, int]] = []
    for start in range(0, len(output_ids), 500):
        part = output_ids[start : start + 500]
        query = OutputChunk.select(OutputChunk.key, OutputChunk.stored_bytes)
        found.extend((c.key, c.stored_bytes) for c in query.where(OutputChunk.output.in_(part)))
    return found


def delete_outputs(output_ids):
    """Forget these outputs: their chunks' rows, segments, kept lines (inside the caller's
    transaction; the stored chunks go after it commits: stored_chunks gives their keys)."""
    for start in range(0, len(output_ids), 500):
        part = output_ids[start : start + 500]
        for output in TaskOutput.select().where(TaskOutput.id.in_(part)):
            LogLine.delete().where(
                (LogLine.job == output.job_id)
                & (LogLine.rank == output.rank)
                & (LogLine.attempt == output.attempt)
                & LogLine.line.is_null(False)
            ).execute()
        OutputChunk.delete().where(OutputChunk.output.in_(part)).execute()
        OutputSegment.delete().where(OutputSegment.output.in_(part)).execute()
        TaskOutput.delete().where(TaskOutput.id.in_(part)).execute()
