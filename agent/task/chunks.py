"""The chunks of a task's output at rest (issue 47): ``<first line>.frames`` while open, gzip in
``<first line>.gz`` once sealed and compressed, until fleetd stored it."""

import dataclasses
import gzip
import os

from fleetwire.output import ChunkMeta

COMPRESS_LEVEL = 6


@dataclasses.dataclass
class Chunk:
    """Lines [first_line, first_line + lines), `bytes` of frames, seen at first_at..last_at (ms)."""

    first_line: int
    lines: int = 0
    bytes: int = 0
    first_at: int = 0
    last_at: int = 0

    def meta(self, epoch):
        """The ChunkMeta of its upload."""
        return ChunkMeta(
            epoch, self.first_line, self.lines, self.bytes, self.first_at, self.last_at
        )

    @classmethod
    def from_state(cls, data):
        return cls(*(int(data[k]) for k in ("first_line", "lines", "bytes", "first_at", "last_at")))


def chunk_path(out_dir, chunk, suffix):
    """Where a chunk's file is: its first line, 12 digits, and `suffix` (.frames, .gz)."""
    return os.path.join(out_dir, f"{chunk.first_line:012d}{suffix}")


def compress_chunk(out_dir, chunk):
    """The gzip bytes of a sealed chunk, compressed into ``<first line>.gz`` the first time
    (written aside, synced, renamed; then the frames go). OSError (a full disk) to retry."""
    gz = chunk_path(out_dir, chunk, ".gz")
    try:
        with open(gz, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        pass
    frames = chunk_path(out_dir, chunk, ".frames")
    with open(frames, "rb") as fh:
        raw = fh.read(chunk.bytes)
    blob = gzip.compress(raw, COMPRESS_LEVEL, mtime=0)
    tmp = gz + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, gz)
    except OSError:
        unlink(tmp)
        raise
    unlink(frames)
    return blob


def write_all(fd, data, size):
    """Write all of `data` at the end of a file `size` long; on an error the file is cut back to
    `size`, so that no half frame is left behind."""
    view, written = memoryview(data), 0
    try:
        for _ in range(len(data) + 1):
            if written >= len(data):
                return
            written += os.write(fd, view[written:])
    except OSError:
        os.ftruncate(fd, size)
        os.lseek(fd, 0, os.SEEK_END)
        raise


def unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
