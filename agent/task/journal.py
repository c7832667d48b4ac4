"""The state journal of a task: one JSON record a line in its state file; the last whole line is its
state."""

import json
import os


def append_state(path, record):
    """Record a task's state: one more line, the whole record as JSON, at the end of its state
    file (mode 0600); the last complete line is the state (read_state).

    Appended rather than replaced: ext4 starts writing out a file's data when another file is
    renamed over it (auto_da_alloc), which made the three records of a short task cost ten times
    what three appends do. A write() of one line is not torn by the agent's death; a host crash
    may tear the last line, and read_state then takes the line before. No fsync, unlike the
    enrolment files: the file only has to survive the agent's death, which the page cache does;
    after a host crash the boot id differs and no process of the task lives.
    """
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        view = memoryview(data)
        for _ in range(
            len(data)
        ):  # write() may take less than all of it (disk full raises OSError)
            view = view[os.write(fd, view) :]
            if not view:
                break
    finally:
        os.close(fd)


def compact_state(path, record, over_bytes):
    """append_state, but first, when the file is over `over_bytes`, start it again with the record
    alone (written beside it and renamed over it): a journal that a long-lived workload appends to
    for months stays small. The rename leaves either the old file or the new one, never a torn
    one."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        size = 0
    if size <= over_bytes:
        append_state(path, record)
        return
    tmp = f"{path}.new"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    append_state(tmp, record)
    os.replace(tmp, path)


def read_state(path):
    """The state recorded by append_state: the last line of the file that is a JSON object.

    OSError when the file cannot be read, ValueError when no line is a record. A file of one
    JSON object (written by agents before the state became a journal) reads the same.
    """
    with open(path, "rb") as fh:
        data = fh.read()
    for line in reversed(data.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(record, dict):
            return record
    raise ValueError(f"{path} holds no state record")
