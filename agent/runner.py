"""Task processes: working directory, environment, process groups, logs, cancellation, restarts.

Each assignment from fleetd becomes a Task with its own supervisor thread:

1. a working directory ``state_dir/tasks/<task_id>.<epoch>/work`` and a state file
   ``task.json`` beside it (pid, process group, process start ticks, boot id, outcome);
2. input artifacts downloaded into the working directory and verified by sha256;
3. the rendezvous: rank 0 publishes a free port on this host's address, other ranks wait for it;
4. the command in a new session (its own process group) with the spec's env plus the injected
   variables; stdout/stderr read line by line and shipped to fleetd in batches;
5. cancellation (SIGTERM to the group, SIGKILL after a grace), max_runtime_seconds;
6. the outcome reported with ``finish``, retried through a fleetd outage.

Any task call answered 409 (stale epoch), 404, 403 or 401 means fleetd no longer leases the
task to this node: its process group is killed at once and the task is forgotten (fencing).
On start, `Runner.recover` kills the processes of tasks left from before a restart (found by
process group and start ticks, or by their FLEET_TASK_ID/FLEET_TASK_EPOCH environment) and
reports them to fleetd.
"""

import collections
import dataclasses
import functools
import json
import logging
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import threading
import time

from agent.client import (Conflict, DigestMismatch, FleetdError, Rejected, TooLarge, Unreachable, backoff_delay,
                          finish_body)
from agent.limits import LimitError, Limits, LimitSettings, TaskKey, read_bytes, read_proc, signal_pids, task_pids
from agent.taskdirs import SPARE_DIR, STATE_FILE, WORK_DIR, TaskDirs
from agent.threads import FOREVER, Job, Pool
from agent.workers import Worker

log = logging.getLogger("agent.runner")

TASKS_DIR = "tasks"
TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OUTCOMES = ("succeeded", "failed", "cancelled")
# What a task inherits from the agent's own environment; nothing else (no FLEET_AGENT_* secrets).
PASSTHROUGH_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "HOME", "USER", "LOGNAME", "SHELL")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_LINE_BYTES = 16 * 1024  # longer lines reach fleetd in pieces of this size
MIN_TRUNCATED_CHARS = 256  # a single line that fleetd still refuses (413) is halved down to this, then dropped
TRUNCATED_MARK = " [truncated by fleet-agent]"
READER_JOIN_SECONDS = 5.0  # a process that escaped the group may hold the pipes; do not wait on it for ever
RECOVERY_KILL_WAIT_SECONDS = 10.0
RENDEZVOUS_POLL_SECONDS = 30
DEFAULT_REPORT_RETRY_SECONDS = 7 * 86400.0
MAX_IDLE_CLIENTS = 8
MAX_FINISHES = 64  # finish reports in one call, as fleetd takes them
# The start is reported once the process has run this long: a task that ends sooner reports its
# start with its finish, one call instead of two (short tasks are most of what fleetd hears under
# load). Later than this, fleetd's started_at is late by the same amount at most.
START_REPORT_DELAY_SECONDS = 0.05


class TaskError(Exception):
    """The task cannot run; the message is the reason reported to fleetd."""


class Fenced(Exception):
    """fleetd no longer leases this task to this node: kill it at once and forget it."""


class Stopped(Exception):
    """The task was cancelled (or the agent is stopping) before its process started."""


def _is_fencing(exc):
    """True for the answers of a task route that mean 'this task is not yours (any more)'."""
    return isinstance(exc, (Conflict, Rejected)) or exc.status in (403, 404)


def _is_fencing_artifact(exc):
    """For an artifact download only 409 and 401 say that; a 404 or 403 is about the artifact."""
    return isinstance(exc, (Conflict, Rejected))


# ----------------------------------------------------------------------------------------------
# The assignment on the wire


@dataclasses.dataclass
class Assignment:
    """API.md Assignment, validated."""

    task_id: str
    job_id: str
    epoch: int
    rank: int
    num_nodes: int
    command: list
    env: dict
    workdir: str
    gpus: list
    isolation: str
    max_runtime_seconds: float
    artifacts: list
    priority_class: str = "on-demand"
    bid: float | None = None
    cpus: float | None = None  # host CPU limit (cgroup v2 cpu.max) from the JobSpec
    memory_bytes: int | None = None  # host memory limit (cgroup v2 memory.max) from the JobSpec

    @classmethod
    def from_wire(cls, data):
        """Validate an Assignment dict; ValueError names the bad field."""
        if not isinstance(data, dict):
            raise ValueError("assignment must be an object")
        task_id = data.get("task_id")
        if not isinstance(task_id, str) or not TASK_ID_RE.match(task_id):
            raise ValueError("task_id must be 1-128 letters, digits or ._:-")
        epoch = data.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError("epoch must be a non-negative integer")
        num_nodes = data.get("num_nodes") or 1
        rank = data.get("rank") or 0
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (num_nodes, rank)) \
                or num_nodes < 1 or not 0 <= rank < num_nodes:
            raise ValueError("rank and num_nodes must be integers with 0 <= rank < num_nodes")
        command = data.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command) \
                or any("\0" in a for a in command):
            raise ValueError("command must be a non-empty list of strings")
        env = data.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and ENV_NAME_RE.match(k) for k in env):
            raise ValueError("env must map variable names to values")
        env = {k: "" if v is None else str(v) for k, v in env.items()}
        if any("\0" in v for v in env.values()):
            raise ValueError("env values must not contain NUL")
        gpus = data.get("gpus") or []
        if not isinstance(gpus, list) or not all(isinstance(g, dict) and isinstance(g.get("uuid"), str)
                                                  and re.match(r"^[A-Za-z0-9._:/-]+$", g["uuid"]) for g in gpus):
            raise ValueError("gpus must be a list of {uuid, ...}")
        max_runtime = data.get("max_runtime_seconds")
        if max_runtime is not None and (isinstance(max_runtime, bool) or not isinstance(max_runtime, (int, float))
                                        or max_runtime <= 0):
            raise ValueError("max_runtime_seconds must be a positive number")
        artifacts = data.get("artifacts") or []
        if not isinstance(artifacts, list):
            raise ValueError("artifacts must be a list")
        for item in artifacts:
            if not isinstance(item, dict) or not isinstance(item.get("sha256"), str) \
                    or not SHA256_RE.match(item["sha256"]) or not isinstance(item.get("path"), str):
                raise ValueError("artifacts must be [{sha256 (64 lowercase hex digits), path}]")
        workdir = data.get("workdir") or ""
        if not isinstance(workdir, str):
            raise ValueError("workdir must be a string")
        numbers = {}
        for name, kind in (("bid", (int, float)), ("cpus", (int, float)), ("memory_bytes", (int,))):
            value = data.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind) or value < 0):
                raise ValueError(f"{name} must be a non-negative number")
            numbers[name] = value if name == "bid" else (value or None)
        return cls(task_id=task_id, job_id=str(data.get("job_id") or ""), epoch=epoch, rank=rank,
                   num_nodes=num_nodes, command=list(command), env=env, workdir=workdir,
                   gpus=[dict(g) for g in gpus], isolation=str(data.get("isolation") or "exclusive"),
                   max_runtime_seconds=max_runtime, artifacts=[dict(a) for a in artifacts],
                   priority_class=str(data.get("priority_class") or "on-demand"), **numbers)


def inside(root, relative, what, allow_root=False):
    """`root`/`relative` for a relative path that stays inside `root` (symlinks resolved); TaskError otherwise."""
    if not relative or "\0" in relative or os.path.isabs(relative):
        raise TaskError(f"{what} {relative!r} must be a relative path inside the task's working directory")
    if ".." in relative.split("/"):
        raise TaskError(f"{what} {relative!r} must not contain '..'")
    path = os.path.normpath(os.path.join(root, relative))
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root \
            or (path == os.path.normpath(root) and not allow_root):
        raise TaskError(f"{what} {relative!r} leaves the task's working directory")
    return path


def task_env(assignment, master_addr, master_port, environ=None, extra=None):
    """(the task's whole environment, the variables the agent injected).

    The spec's env goes over a small passthrough of the agent's own; the injected variables go
    over both, so a spec cannot widen its GPUs or fake its rank. `extra` are the limits'
    variables (MPS); NVIDIA_VISIBLE_DEVICES carries the same UUIDs for nested containers
    ("none" without GPUs).
    """
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in PASSTHROUGH_ENV if k in environ}
    env.setdefault("PATH", DEFAULT_PATH)
    env["PYTHONUNBUFFERED"] = "1"  # Python tasks' output reaches the log as it is printed
    env.update(assignment.env)
    uuids = [g["uuid"] for g in assignment.gpus]
    injected = {
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        "NVIDIA_VISIBLE_DEVICES": ",".join(uuids) or "none",
        "FLEET_JOB_ID": assignment.job_id,
        "FLEET_TASK_ID": assignment.task_id,
        "FLEET_TASK_EPOCH": str(assignment.epoch),
        "FLEET_NODE_RANK": str(assignment.rank),
        "FLEET_NUM_NODES": str(assignment.num_nodes),
        "FLEET_GPUS_PER_NODE": str(len(uuids)),
        "FLEET_MASTER_ADDR": master_addr,
        "FLEET_MASTER_PORT": str(master_port),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(assignment.num_nodes),
        "NODE_RANK": str(assignment.rank),
    }
    injected.update(extra or {})
    env.update(injected)
    return env, injected


def free_port(address):
    """A TCP port free now on `address` (or on every address when `address` cannot be bound)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            sock.bind(("::" if family == socket.AF_INET6 else "", 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# Processes, from /proc


@functools.lru_cache(maxsize=1)
def read_boot_id():
    """This boot's id (read once: it cannot change while the agent runs); a pid from another
    boot is never ours."""
    data = read_bytes("/proc/sys/kernel/random/boot_id")
    return "" if data is None else data.decode(errors="replace").strip()


def uptime_ticks():
    """Clock ticks since boot, on the scale of /proc/<pid>/stat's starttime."""
    data = read_bytes("/proc/uptime")
    if data is None:
        raise OSError("cannot read /proc/uptime")
    return int(float(data.split()[0]) * os.sysconf("SC_CLK_TCK"))


def proc_stat(pid):
    """(state, pgid, start_ticks) of a process, or None when there is none."""
    data = read_bytes(f"/proc/{pid}/stat")
    if data is None:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    # fields[0] is field 3 (state) of proc(5); pgrp is field 5, starttime field 22.
    return fields[0].decode(), int(fields[2]), int(fields[19])


def all_pids():
    """Every pid in /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit()]


def group_pids(pgid, exclude=()):
    """Live (not zombie) processes of a process group."""
    out = []
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat and stat[1] == pgid and stat[0] != "Z" and pid not in exclude:
            out.append(pid)
    return out


def _environ_has(pid, markers):
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            entries = set(fh.read().split(b"\0"))
    except OSError:
        return False
    return markers <= entries


def find_task_processes(record):
    """Live pids that belong to the task described by a state record from before a restart.

    A process belongs to it when it is in the recorded process group (and the group's leader, if
    still there, is the very process started, by its start ticks), or when its environment carries
    the task's FLEET_TASK_ID and FLEET_TASK_EPOCH (that also finds processes that left the group
    and the one started just before the agent died, before the state file had its pid).
    """
    if record.get("boot_id") and record["boot_id"] != read_boot_id():
        return []
    pgid = record.get("pgid")
    start = record.get("start_ticks")
    created = record.get("created_ticks") or 0
    leader = proc_stat(pgid) if pgid else None
    group_is_ours = bool(pgid) and (leader is None or leader[2] == start)
    markers = {f"FLEET_TASK_ID={record['task_id']}".encode(), f"FLEET_TASK_EPOCH={record['epoch']}".encode()}
    found = []
    for pid in all_pids():
        if pid == os.getpid():
            continue
        stat = proc_stat(pid)
        if stat is None or stat[0] == "Z" or stat[2] < created:
            continue
        if (group_is_ours and stat[1] == pgid) or _environ_has(pid, markers):
            found.append(pid)
    return found


def kill_pids(pids, sig=signal.SIGKILL):
    """Signal each pid that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids, timeout):
    """True once none of `pids` is alive (zombies count as gone); bounded by `timeout`."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.05) + 1):
        alive = [p for p in pids if (s := proc_stat(p)) and s[0] != "Z"]
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return False


# ----------------------------------------------------------------------------------------------
# Logs


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
                if _is_fencing(exc):
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


# ----------------------------------------------------------------------------------------------
# One task


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
        for _ in range(len(data)):  # write() may take less than all of it (disk full raises OSError)
            view = view[os.write(fd, view):]
            if not view:
                break
    finally:
        os.close(fd)


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


def _check_executable(program, cwd, path):
    """TaskError unless `program` can be executed (as exec would find it), before it is wrapped."""
    if "/" in program:
        candidate = program if os.path.isabs(program) else os.path.join(cwd, program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return
        raise TaskError(f"cannot start {program!r}: No such file or directory (or not executable)")
    key = (program, path)
    found = _FOUND_IN_PATH.get(key)
    if found is not None and os.path.isfile(found) and os.access(found, os.X_OK):
        return  # found before and still there: one lookup instead of a walk down PATH
    found = shutil.which(program, path=path)
    if found is None:
        _FOUND_IN_PATH.pop(key, None)
        raise TaskError(f"cannot start {program!r}: not found in PATH")
    if len(_FOUND_IN_PATH) >= MAX_FOUND_IN_PATH:
        _FOUND_IN_PATH.clear()
    _FOUND_IN_PATH[key] = found


_FOUND_IN_PATH = {}  # (program, PATH) -> where shutil.which last found it
MAX_FOUND_IN_PATH = 1024


def _utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Task:
    """One assignment on this host, from preparation to the acknowledged finish report."""

    def __init__(self, runner, assignment):
        self.runner = runner
        self.a = assignment
        self.label = f"{assignment.task_id}/{assignment.epoch}"
        self.dir = os.path.join(runner.tasks_dir, f"{assignment.task_id}.{assignment.epoch}")
        self.state_path = os.path.join(self.dir, STATE_FILE)
        self.workdir = os.path.join(self.dir, WORK_DIR)
        self._lock = threading.Lock()
        self._wake = threading.Event()  # the supervisor re-checks its state
        self._exited = threading.Event()  # the leader process exited (not yet reaped)
        self.proc = None
        self.pgid = None
        self._reaped = False
        self._stop = None  # (outcome, reason) once a stop is asked for
        self._lost = False  # the stop is the agent's doing (it stops), not the task's nor the user's
        self._kill_at = None  # monotonic time of the SIGKILL that follows a SIGTERM
        self._grace = runner.kill_grace_seconds  # of the stop asked for
        self._seen = {}  # pid -> start ticks of every process seen as the task's (they may leave its tree)
        self._fenced = None  # why, once fleetd fenced the task off
        self._keep_state = False
        self.record = {}
        self.shipper = None
        self._watcher = None  # the thread that reads the pipes (and sees the exit)
        self.started_monotonic = None
        self._start_with_finish = False  # the process ended before its start was reported
        self.task_limits = None  # what agent.limits set up (env, cgroup), once prepared
        self.worker = Worker(task_id=assignment.task_id, epoch=assignment.epoch, job_id=assignment.job_id,
                             rank=assignment.rank, state="starting", priority_class=assignment.priority_class,
                             bid=assignment.bid, gpus=[dict(g) for g in assignment.gpus], stop=self.cancel,
                             limits={"max_runtime_seconds": assignment.max_runtime_seconds,
                                     "kill_grace_seconds": runner.kill_grace_seconds,
                                     "isolation": assignment.isolation},
                             list_pids=self.pids)
        self.thread = Job(self._main, name=f"task-{self.label}")  # run on one of the runner's threads

    @property
    def epoch(self):
        return self.a.epoch

    # Called from other threads.

    def key(self):
        """The TaskKey that finds this task's processes (group and session while the leader is not reaped)."""
        limits = self.task_limits
        return TaskKey(self.a.task_id, self.a.epoch, None if self._reaped else self.pgid,
                       limits.cgroup_rel if limits is not None else None,
                       limits.cgroup if limits is not None else None)

    def pids(self):
        """The live processes of the task: its group and session, its cgroup, its FLEET_TASK_* environment."""
        with self._lock:
            if self.proc is None:
                return []
            key = self.key()
        pids = task_pids(key)
        with self._lock:
            return self._remember(pids)

    def cancel(self, reason, outcome="cancelled", lost=False, grace=None):
        """Stop the task: SIGTERM to all its processes now, SIGKILL after the grace.

        `lost`: the agent itself is stopping; fleetd is told so (finish `lost: true`), so that the job
        is retried as for a lost node rather than failed. `grace` overrides tasks.kill_grace_seconds
        (the limits watchdog uses limits.kill_grace_seconds).
        """
        grace = self.runner.kill_grace_seconds if grace is None else grace
        with self._lock:
            if self._stop is None:
                self._stop = (outcome, reason)
                self._lost = lost
                self._grace = grace
                log.info("task %s: stopping (%s)", self.label, reason)
                if self.pgid and not self._reaped:
                    self._signal_group(signal.SIGTERM)
                    self._kill_at = time.monotonic() + grace
        self._wake.set()

    def fence(self, why, keep_state=False):
        """fleetd no longer leases the task here: SIGKILL its process group at once; no report follows.

        With `keep_state` (the agent is stopping, not fenced by fleetd) the state file stays, so that
        the next start reports the task.
        """
        with self._lock:
            if self._fenced is None:
                self._fenced = str(why)
                self._keep_state = keep_state
                if self.pgid and not self._reaped:
                    self._signal_group(signal.SIGKILL)
        if self.shipper is not None:
            self.shipper.abort()
        self._wake.set()

    def _signal_group(self, sig):
        """Signal the process group, and the processes that left it (setsid) but are still the task's.

        The task's processes are listed before the group is signalled: once the leader dies, a
        child that left its session and environment is reparented and only its cgroup, or this
        task having seen it before, still ties it to the task.
        """
        # Only while the leader is not reaped: until then its pid (the pgid) cannot be reused.
        others = self._remember(task_pids(self.key()))
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if sig == signal.SIGKILL and self.task_limits is not None and self.task_limits.cgroup:
            self.runner.limits.cgroups.kill(self.task_limits.cgroup)
        signal_pids(others, sig)

    def _remember(self, pids):
        """Remember `pids` as the task's; returns every remembered process still alive (same start time)."""
        for pid in pids:
            info = read_proc(pid)
            if info is not None:
                self._seen[pid] = info.start_ticks
        alive = []
        for pid, start in list(self._seen.items()):
            info = read_proc(pid)
            if info is None or info.start_ticks != start:
                del self._seen[pid]
            else:
                alive.append(pid)
        return alive

    # The supervisor thread.

    def start(self):
        """Run the task in its supervisor thread."""
        self.runner.threads.submit(self.thread)

    def _main(self):
        client = self.runner.checkout_client()
        keep_dir = False
        try:
            self.runner.workers.add(self.worker)
            try:
                result = self._run_to_result(client)
            except Fenced:
                raise
            except Exception as exc:  # a host problem (disk full) or a bug: the task fails, and fleetd hears why
                log.exception("task %s: the agent could not run it", self.label)
                self._kill_and_reap()
                result = ("failed", None, f"fleet-agent could not run the task: {exc}")
            self.worker.state = "finishing"
            lost = self._lost and self._stop is not None and result[0] == self._stop[0]
            try:
                self._save(state="finished", outcome=result[0], exit_code=result[1], reason=result[2], lost=lost)
            except OSError as exc:
                log.error("task %s: cannot record its outcome in %s: %s", self.label, self.state_path, exc)
            self._finish_logs()
            keep_dir = not report_finish(client, self.runner, self.a.task_id, self.a.epoch, result, self.label,
                                         lost=lost, pid=self.proc.pid if self._start_with_finish else None,
                                         started_monotonic=self.started_monotonic)
        except Fenced as exc:
            if self._keep_state:
                log.warning("task %s: abandoned (%s); killed its process group", self.label, exc)
                keep_dir = True
            else:
                log.warning("task %s: fleetd no longer leases it to this node (%s); killed its process group "
                            "and forgot it", self.label, exc)
        except Exception:  # a bug here must not leave the process running unsupervised
            log.exception("task %s: supervisor failed; killing the task", self.label)
            keep_dir = True
        finally:
            self._kill_and_reap()
            # A task directory is reused only when the kernel vouches that none of the task's
            # processes is left (its cgroup is gone): one left could write into the next task's.
            contained = self._release_limits()
            if self.shipper is not None:
                self.shipper.abort()
            if self.runner.workers.get(self.a.task_id) is self.worker:
                self.runner.workers.remove(self.a.task_id)
            self.runner.forget(self)
            if not keep_dir:
                self.runner.dirs.remove(self.dir, reuse=contained)
            self.runner.checkin_client(client)

    def _check(self):
        """Raise Fenced or Stopped when the task must not go on preparing."""
        if self._fenced:
            raise Fenced(self._fenced)
        if self._stop is not None:
            raise Stopped(self._stop[1])

    def _run_to_result(self, client):
        """(outcome, exit_code, reason) of the task."""
        try:
            self.runner.dirs.make(self.dir)
            self._prepare_limits()  # the cgroup exists before the state file that names it
            self._save(state="starting", created_ticks=uptime_ticks() - 1, boot_id=read_boot_id(),
                       cgroup=self.task_limits.cgroup)
            cwd = self.workdir
            if self.a.workdir:
                cwd = inside(self.workdir, self.a.workdir, "workdir", allow_root=True)
                os.makedirs(cwd, exist_ok=True)
            self._download_artifacts(client, cwd)
            addr, port = self._rendezvous(client)
            self._spawn(cwd, addr, port)
        except TaskError as exc:
            log.warning("task %s: cannot run: %s", self.label, exc)
            return "failed", None, str(exc)
        except Stopped:
            return self._stop[0], None, self._stop[1]
        return self._supervise(client)

    def _call(self, what, fn, deadline, fencing=_is_fencing):
        """fn() retried while fleetd is unreachable, until `deadline` (monotonic); fencing raises Fenced."""
        for attempt in range(1, 1_000_000):
            self._check()
            try:
                return fn()
            except Unreachable as exc:
                if time.monotonic() >= deadline or self.runner.closing.is_set():
                    raise TaskError(f"{what}: {exc}") from None
                delay = min(backoff_delay(attempt, self.runner.backoff_max_seconds),
                            max(0.0, deadline - time.monotonic()))
                self._wake.wait(delay)
                self._wake.clear()
            except FleetdError as exc:
                if fencing(exc):
                    raise Fenced(str(exc)) from None
                raise TaskError(f"{what}: {exc}") from None
        raise TaskError(f"{what}: gave up")

    def _prep_deadline(self, limit):
        bound = limit if self.a.max_runtime_seconds is None else min(limit, self.a.max_runtime_seconds)
        return time.monotonic() + bound

    def _download_artifacts(self, client, cwd):
        deadline = self._prep_deadline(self.runner.rendezvous_timeout_seconds)
        for item in self.a.artifacts:
            dest = inside(cwd, item["path"], "artifact path")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.isdir(dest):
                raise TaskError(f"artifact path {item['path']!r} is a directory")
            try:
                size = self._call(f"downloading artifact {item['sha256']}",
                                  functools.partial(client.download_artifact, item["sha256"], dest), deadline,
                                  fencing=_is_fencing_artifact)
            except DigestMismatch as exc:
                raise TaskError(str(exc)) from None
            except OSError as exc:
                raise TaskError(f"cannot write artifact {item['path']!r}: {exc.strerror or exc}") from None
            log.info("task %s: artifact %s (%d bytes) verified at %s", self.label, item["sha256"][:12], size,
                     item["path"])

    def _rendezvous(self, client):
        """(master address, master port): rank 0's, published by it or learnt from fleetd."""
        addr = self.runner.address
        if self.a.num_nodes <= 1:
            return addr, free_port(addr)
        started = time.monotonic()
        deadline = self._prep_deadline(self.runner.rendezvous_timeout_seconds)
        if self.a.rank == 0:
            port = free_port(addr)
            self._call("publishing the rendezvous",
                       functools.partial(client.publish_rendezvous, self.a.task_id, self.a.epoch, addr, port), deadline)
            log.info("task %s: rank 0 of %d published rendezvous %s:%d", self.label, self.a.num_nodes, addr, port)
            return addr, port
        for _ in range(1_000_000):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wait = max(1, min(RENDEZVOUS_POLL_SECONDS, int(remaining)))
            found = self._call("waiting for the rendezvous",
                               functools.partial(client.wait_rendezvous, self.a.task_id, wait), deadline)
            if found:
                log.info("task %s: rank %d learnt rendezvous %s:%d", self.label, self.a.rank, *found)
                return found
        raise TaskError(f"rank 0 did not publish its address and port within {deadline - started:.0f}s")

    def _prepare_limits(self):
        """Set up the task's limits (MPS, cgroup); TaskError when they cannot be met here."""
        try:
            self.task_limits = self.runner.limits.prepare(self.a)
        except LimitError as exc:
            raise TaskError(str(exc)) from None
        except OSError as exc:
            raise TaskError(f"cannot set up the task's limits: {exc.strerror or exc}") from None
        limits = dict(self.worker.limits)
        limits.update(self.task_limits.describe())
        self.worker.limits = limits
        self.worker.cgroup = self.task_limits.cgroup_rel

    def _spawn(self, cwd, addr, port):
        env, injected = task_env(self.a, addr, port, extra=self.task_limits.env)
        argv = self.runner.limits.command(self.task_limits, self.a.command)
        if argv != self.a.command:
            _check_executable(self.a.command[0], cwd, env.get("PATH", DEFAULT_PATH))
        self.shipper = LogShipper(self.runner, self.a.task_id, self.a.epoch, self.runner.log_settings,
                                  self.fence, self.runner.closing.is_set, self.label)
        with self._lock:
            self._check()
            try:
                self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             start_new_session=True, close_fds=True)
            except OSError as exc:
                raise TaskError(f"cannot start {self.a.command[0]!r}: {exc.strerror or exc}") from None
            self.pgid = self.proc.pid  # start_new_session: the leader's pid is the session and group id
            self.worker.pgid = self.pgid
            self.started_monotonic = time.monotonic()
            # The watcher first: from here on nothing may leave the process unwatched.
            try:
                pidfd = os.pidfd_open(self.proc.pid)  # readable once the leader exits; reaps nothing
            except (AttributeError, OSError):  # Linux before 5.3: a thread waits for the exit instead
                pidfd = None
                self.runner.threads.run(self._wait_exit, name=f"wait-{self.label}")
            self._watcher = self.runner.threads.run(self._watch, pidfd, name=f"watch-{self.label}")
        stat = proc_stat(self.proc.pid)
        self.worker.pids = [self.proc.pid]
        self.worker.env = injected
        self.worker.started_at = _utc_now()
        self.worker.state = "running"
        log.info("task %s: started pid %d: %s", self.label, self.proc.pid, " ".join(self.a.command)[:200])
        self._save(state="running", pid=self.proc.pid, pgid=self.pgid,
                   start_ticks=stat[2] if stat else None, started_at=self.worker.started_at)

    def _watch(self, pidfd):
        """Read the task's stdout and stderr into the shipper and, given a pidfd, notice the
        leader's exit: one thread per task instead of three. Ends once both pipes are closed
        and the exit was seen."""
        selector = selectors.DefaultSelector()
        pending = {}
        try:
            for pipe, stream in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
                os.set_blocking(pipe.fileno(), False)
                selector.register(pipe.fileno(), selectors.EVENT_READ, stream)
                pending[pipe.fileno()] = b""
            if pidfd is not None:
                selector.register(pidfd, selectors.EVENT_READ, None)
            for _ in range(1_000_000_000_000):
                if not selector.get_map():
                    return
                for key, _mask in selector.select():
                    if key.data is None:  # the pidfd: the leader exited (a zombie until reaped)
                        selector.unregister(pidfd)
                        os.close(pidfd)
                        pidfd = None
                        self._exited.set()
                        self._wake.set()
                        continue
                    try:
                        chunk = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    buf = pending[key.fd] + chunk
                    buf = self._lines(buf, key.data, eof=not chunk)
                    pending[key.fd] = buf
                    if not chunk:
                        selector.unregister(key.fd)
        finally:
            if pidfd is not None:
                os.close(pidfd)
            selector.close()
            self.proc.stdout.close()
            self.proc.stderr.close()

    def _lines(self, buf, stream, eof):
        """Ship the complete lines of `buf` (at most MAX_LINE_BYTES each); return what is left."""
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
            self.shipper.add(stream, text)
        return buf

    def _wait_exit(self):
        # WNOWAIT leaves the leader a zombie, so its pid (= the pgid) stays reserved until we reap it.
        try:
            os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        self._exited.set()
        self._wake.set()

    def _supervise(self, client):
        """Report the start, enforce the limits, wait for the exit; (outcome, exit_code, reason)."""
        with self._lock:
            if self._stop is not None:  # cancelled between the spawn and now
                self._signal_group(signal.SIGTERM)
                self._kill_at = time.monotonic() + self.runner.kill_grace_seconds
        start_reported = False
        attempts = 0
        next_report = self.started_monotonic + START_REPORT_DELAY_SECONDS
        runtime_deadline = None
        if self.a.max_runtime_seconds is not None:
            runtime_deadline = self.started_monotonic + self.a.max_runtime_seconds
        for _ in range(1_000_000_000):
            exited = self._exited.is_set()
            if self._fenced:
                raise Fenced(self._fenced)
            now = time.monotonic()
            if not start_reported and exited:
                # Ended before its start was reported: the finish report carries the start (one
                # call instead of two, which for short tasks is most of what fleetd hears).
                self._start_with_finish = start_reported = True
            if not start_reported and now >= next_report:
                start_reported, attempts = self._report_start(client, attempts)
                next_report = now + backoff_delay(attempts, self.runner.backoff_max_seconds)
            if exited:
                break
            if runtime_deadline is not None and now >= runtime_deadline and self._stop is None:
                self.cancel(f"exceeded max_runtime_seconds={self.a.max_runtime_seconds:g}", outcome="failed")
            with self._lock:
                if self._kill_at is not None and now >= self._kill_at:
                    log.warning("task %s: still running %gs after SIGTERM; SIGKILL", self.label, self._grace)
                    self._signal_group(signal.SIGKILL)
                    self._kill_at = None
                kill_at = self._kill_at
            timeout = 1.0
            for moment in (kill_at, runtime_deadline if self._stop is None else None,
                           None if start_reported else next_report):
                if moment is not None:
                    timeout = min(timeout, max(0.0, moment - now))
            self._wake.wait(timeout)
            self._wake.clear()
        if self._fenced:
            raise Fenced(self._fenced)
        self._end_group()
        code = self._reap()
        if code < 0:
            exit_code, how = 128 - code, f"killed by {_signal_name(-code)}"
        else:
            exit_code, how = code, f"exit code {code}"
        if self._stop is not None:
            outcome, reason = self._stop
            return outcome, exit_code, f"{reason} ({how})"
        if code == 0:
            return "succeeded", 0, None
        oom = self.runner.limits.cgroups.oom_kills(self.task_limits.cgroup if self.task_limits else None)
        if oom:
            limit = self.task_limits.host.get("memory_bytes", {}).get("limit")
            return "failed", exit_code, (f"host_memory_limit_exceeded: memory_bytes {limit}, the kernel OOM-killed "
                                         f"{oom} process(es) of the task ({how})")
        return "failed", exit_code, how

    def _report_start(self, client, attempts):
        """One try at POST start -> (reported or not worth retrying, attempts so far)."""
        try:
            client.task_start(self.a.task_id, self.a.epoch, self.proc.pid)
            return True, attempts
        except Unreachable as exc:
            log.warning("task %s: start not reported yet (%s); the task keeps running", self.label, exc)
            return False, attempts + 1
        except FleetdError as exc:
            if attempts and isinstance(exc, Conflict) and exc.details.get("state") == "running":
                return True, attempts  # an earlier attempt got through; its answer did not
            if _is_fencing(exc):
                raise Fenced(str(exc)) from None
            log.error("task %s: fleetd refused the start report: %s", self.label, exc)
            return True, attempts

    def _end_group(self):
        """The leader exited: let the rest of the group end within what is left of a grace, then SIGKILL it."""
        with self._lock:
            kill_at = self._kill_at
        if kill_at is not None:
            for _ in range(int(self.runner.kill_grace_seconds / 0.05) + 2):
                if self._fenced or time.monotonic() >= kill_at or not group_pids(self.pgid, exclude=(self.proc.pid,)):
                    break
                time.sleep(0.05)
        with self._lock:
            if not self._reaped:
                self._signal_group(signal.SIGKILL)  # whatever is left of the group ends with the task
            self._kill_at = None

    def _reap(self):
        with self._lock:
            code = self.proc.wait()
            self._reaped = True
            self.worker.pgid = None  # the pid may be reused from now on
        return code

    def _kill_and_reap(self):
        """However the supervisor ends, the process group does not outlive it."""
        if self.proc is None or self._reaped:
            return
        with self._lock:
            self._signal_group(signal.SIGKILL)
        if self._exited.wait(30):
            self._reap()
        else:
            log.error("task %s: pid %d did not exit after SIGKILL", self.label, self.proc.pid)

    def _release_limits(self):
        """Whatever is left of the task outside its group is killed; its cgroup removed. True
        when the cgroup is gone, so that no process of the task is left."""
        if self.task_limits is None:
            return False
        try:
            if self.proc is not None:
                pids = task_pids(dataclasses.replace(self.key(), pgid=None))
                with self._lock:
                    signal_pids(self._remember(pids), signal.SIGKILL)
            return self.runner.limits.release(self.task_limits)
        except OSError as exc:
            log.warning("task %s: releasing its limits: %s", self.label, exc)
            return False

    def _finish_logs(self):
        """Let the readers reach EOF and the shipper deliver every line before the finish report."""
        if self.shipper is None:
            return
        if self._watcher is not None:
            self._watcher.join(READER_JOIN_SECONDS)
        self.shipper.close()
        deadline = time.monotonic() + self.runner.report_retry_seconds
        for _ in range(1_000_000):
            if self.shipper.join(1.0) or time.monotonic() >= deadline:
                break
            if self._fenced:
                raise Fenced(self._fenced)
        if self._fenced:
            raise Fenced(self._fenced)

    def _save(self, **changes):
        self.record.update(changes)
        self.record.update(task_id=self.a.task_id, job_id=self.a.job_id, epoch=self.a.epoch, rank=self.a.rank)
        append_state(self.state_path, self.record)


def report_finish(client, runner, task_id, epoch, result, label, lost=False, pid=None, started_monotonic=None):
    """POST finish, retried through a fleetd outage; True once fleetd has it or will never take it.

    False when given up (the agent stops, or the retry time is over): the state file stays, and
    the next start reports the task. `lost` adds `lost: true` (the agent, not the task, ended it);
    `pid` reports the start with the finish (the process ended before its start was reported), and
    `started_monotonic` (time.monotonic() at the spawn) how long ago that was.
    A fleetd that does not know these fields (400) gets a start report, then the finish without them.
    """
    outcome, exit_code, reason = result
    deadline = time.monotonic() + runner.report_retry_seconds
    for attempt in range(1, 1_000_000):
        try:
            ago = None if pid is None or started_monotonic is None else max(0.0, time.monotonic() - started_monotonic)
            runner.finishes.send(client, task_id, finish_body(epoch, outcome, exit_code, (reason or "")[:1000] or None,
                                                              lost=lost, pid=pid, started_seconds_ago=ago))
            log.info("task %s: %s%s%s", label, outcome, f", exit code {exit_code}" if exit_code is not None else "",
                     f" ({reason})" if reason else "")
            return True
        except Unreachable as exc:
            if runner.closing.is_set() or time.monotonic() >= deadline:
                log.warning("task %s: finish (%s) not reported: %s; it will be reported at the next start",
                            label, outcome, exc)
                return False
            delay = backoff_delay(attempt, runner.backoff_max_seconds)
            if attempt == 1 or attempt % 10 == 0:
                log.warning("task %s: finish not reported yet (attempt %d): %s; retrying", label, attempt, exc)
            runner.closing.wait(delay)
        except FleetdError as exc:
            if _is_fencing(exc):
                raise Fenced(str(exc)) from None
            if pid is not None and exc.status == 400:
                log.info("task %s: fleetd does not take the start in a finish report (%s); reporting it first",
                         label, exc)
                try:
                    client.task_start(task_id, epoch, pid)
                except FleetdError as start_exc:
                    if _is_fencing(start_exc):
                        raise Fenced(str(start_exc)) from None
                pid = None
                continue
            if lost and exc.status == 400:
                log.info("task %s: fleetd does not take 'lost' in a finish report (%s); reporting without it",
                         label, exc)
                lost = False
                continue
            log.error("task %s: fleetd refused the finish report: %s", label, exc)
            return True
    return False


class _Report:
    __slots__ = ("task_id", "body", "error", "sent", "done")

    def __init__(self, task_id, body):
        self.task_id = task_id
        self.body = body
        self.error = None  # what fleetd's answer raises for this report
        self.sent = False  # a call carried it; `done` set and not sent: its thread sends the next call
        self.done = threading.Event()


class FinishReports:
    """The finish reports of this host's tasks, sent together when they come together.

    A report goes out at once when no call is on its way; the reports that come meanwhile wait
    for that call and then go out in one (POST /agent/finish, up to MAX_FINISHES), sent by the
    thread of the first of them. Nothing waits for company: when fleetd answers fast each
    report goes alone, by API.md's route; when it is loaded it answers slower, more reports
    wait, and each call carries more of them (per-call cost is most of what fleetd spends on
    a finish). A fleetd without the route (404, 405) gets one call per report from then on.
    """

    def __init__(self):
        self.batch = True
        self._lock = threading.Lock()
        self._queue = []  # reports waiting for the next call
        self._sending = False  # a call is on its way; the queue waits for it

    def send(self, client, task_id, body):
        """Report one finish (a finish_body()); raises what a single finish call would."""
        report = _Report(task_id, body)
        with self._lock:
            self._queue.append(report)
            leading = not self._sending
            self._sending = True
        if not leading:
            # Until a call carried it, or it is this thread's turn to send one (the call before
            # always ends: its thread hands over in a finally).
            for _ in range(FOREVER):
                if report.done.wait(60):
                    break
        if not report.sent:  # leading: this thread sends the next call, its own report in it
            self._lead(client)
        if report.error is not None:
            raise report.error

    def _lead(self, client):
        with self._lock:
            batch = self._queue[:MAX_FINISHES]
            del self._queue[:MAX_FINISHES]
        try:
            self._deliver(client, batch)
        except BaseException as exc:  # a bug or an interrupt: no waiting report may hang on it
            for report in batch:
                report.error = exc if isinstance(exc, FleetdError) else Unreachable(f"finish report: {exc!r}")
            raise
        finally:
            with self._lock:
                if self._queue:  # the first waiting report sends the next call
                    self._queue[0].done.set()
                else:
                    self._sending = False
            for report in batch:
                report.sent = True
                report.done.set()

    def _deliver(self, client, batch):
        if len(batch) > 1 and self.batch:
            try:
                errors = client.task_finishes([(r.task_id, r.body) for r in batch])
            except (Unreachable, Rejected) as exc:
                for report in batch:
                    report.error = exc
                return
            except FleetdError as exc:  # answered one by one below; older fleetds lack the route
                if exc.status in (404, 405):
                    log.info("fleetd does not take finish reports together (%s); sending them one by one", exc)
                    self.batch = False
            else:
                for report, error in zip(batch, errors):
                    report.error = error
                return
        for report in batch:
            try:
                client.task_finish_body(report.task_id, report.body)
            except FleetdError as exc:
                report.error = exc


# ----------------------------------------------------------------------------------------------
# The runner


class Runner:
    """Every task on this host: accepts assignments, recovers after a restart, stops them all."""

    def __init__(self, state_dir, workers, client_factory, address, kill_grace_seconds=10.0,
                 rendezvous_timeout_seconds=600.0, report_retry_seconds=DEFAULT_REPORT_RETRY_SECONDS,
                 backoff_max_seconds=60.0, log_settings=None, limits=None):
        self.tasks_dir = os.path.join(state_dir, TASKS_DIR)
        self.dirs = TaskDirs(os.path.join(state_dir, SPARE_DIR))
        # Without a Limits from the daemon: env and isolation checks only, no cgroups, no MPS.
        self.limits = limits or Limits(LimitSettings(cgroup_parent=""), state_dir=state_dir)
        self.workers = workers
        self.new_client = client_factory  # callable() -> a FleetClient for one thread
        self.address = address
        self.kill_grace_seconds = kill_grace_seconds
        self.rendezvous_timeout_seconds = rendezvous_timeout_seconds
        self.report_retry_seconds = report_retry_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.log_settings = log_settings or LogSettings(backoff_max_seconds=backoff_max_seconds)
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._tasks = {}  # task_id -> Task
        self._idle_clients = []  # FleetClients with open keep-alive connections, for the next thread
        self._threads = []
        self.threads = Pool("task")  # supervisors, pipe readers and log shippers of tasks
        self.finishes = FinishReports()

    @classmethod
    def from_config(cls, config, state_dir, workers, client_factory, address, limits=None):
        """A Runner with the [tasks] settings of the agent config."""
        settings = LogSettings(batch_lines=config.tasks_log_batch_lines, batch_bytes=config.tasks_log_batch_bytes,
                               interval_seconds=config.tasks_log_interval_seconds,
                               buffer_bytes=config.tasks_log_buffer_bytes,
                               backoff_max_seconds=config.backoff_max_seconds)
        return cls(state_dir, workers, client_factory, address,
                   kill_grace_seconds=config.tasks_kill_grace_seconds,
                   rendezvous_timeout_seconds=config.tasks_rendezvous_timeout_seconds,
                   report_retry_seconds=config.tasks_report_retry_seconds,
                   backoff_max_seconds=config.backoff_max_seconds, log_settings=settings, limits=limits)

    def checkout_client(self):
        """A FleetClient for one thread's use (reused: short tasks need no new connection each)."""
        with self._lock:
            if self._idle_clients:
                return self._idle_clients.pop()
        return self.new_client()

    def checkin_client(self, client):
        """Hand a client back; beyond a few idle ones it is closed."""
        with self._lock:
            if len(self._idle_clients) < MAX_IDLE_CLIENTS and not self.closing.is_set():
                self._idle_clients.append(client)
                return
        client.close()

    def tasks(self):
        """The tasks this runner supervises now."""
        with self._lock:
            return list(self._tasks.values())

    def get(self, task_id):
        """The Task for an id, or None."""
        with self._lock:
            return self._tasks.get(task_id)

    def submit(self, data):
        """Run an assignment from acquire; returns its Task, or None when it is not run."""
        try:
            assignment = Assignment.from_wire(data)
        except ValueError as exc:
            log.error("invalid assignment from fleetd: %s", exc)
            self._refuse(data, f"invalid assignment: {exc}")
            return None
        with self._lock:
            if self.closing.is_set():
                log.warning("task %s/%s: not started, the agent is stopping", assignment.task_id, assignment.epoch)
                return None
            old = self._tasks.get(assignment.task_id)
            if old is not None and old.epoch >= assignment.epoch:
                log.warning("task %s: assignment for epoch %d ignored, epoch %d runs here", assignment.task_id,
                            assignment.epoch, old.epoch)
                return None
            task = Task(self, assignment)
            self._tasks[assignment.task_id] = task
        if old is not None:
            old.fence(f"superseded by epoch {assignment.epoch}")
        log.info("task %s: assigned (job %s, rank %d of %d, %d GPU(s))", task.label, assignment.job_id,
                 assignment.rank, assignment.num_nodes, len(assignment.gpus))
        task.start()
        return task

    def cancel(self, task_ids, reason):
        """Stop these tasks (fleetd said so): SIGTERM now, SIGKILL after the grace; each then reports
        its finish. Ids of tasks not running here are ignored."""
        for task_id in task_ids:
            task = self.get(task_id)
            if task is not None:
                log.warning("stopping task %s: %s", task.label, reason)
                task.cancel(reason)

    def _refuse(self, data, reason):
        """Report an assignment that cannot even be parsed as failed, when it names a task and epoch."""
        if not isinstance(data, dict) or not isinstance(data.get("task_id"), str) \
                or not isinstance(data.get("epoch"), int):
            return
        self._background(f"refuse-{data['task_id']}", self._report_orphan, None, data["task_id"], data["epoch"],
                         ("failed", None, reason))

    def forget(self, task):
        """The task's supervisor is done with it."""
        with self._lock:
            if self._tasks.get(task.a.task_id) is task:
                del self._tasks[task.a.task_id]

    # After a restart.

    def recover(self):
        """Kill the processes of tasks left from before a restart and report those tasks to fleetd.

        Returns [(task_id, epoch, killed pids)]; the reports go on in background threads.
        """
        try:
            entries = sorted(os.listdir(self.tasks_dir))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            path = os.path.join(self.tasks_dir, entry)
            try:
                record = read_state(os.path.join(path, STATE_FILE))
                task_id, epoch = record["task_id"], int(record["epoch"])
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("task directory %s has no usable state file; removing it", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            pids = find_task_processes(record)
            if pids:
                kill_pids(pids)
                if not wait_gone(pids, RECOVERY_KILL_WAIT_SECONDS):
                    log.error("task %s/%d: process(es) %s survived SIGKILL", task_id, epoch, pids)
            if record.get("cgroup") and os.path.isdir(record["cgroup"]):
                self.limits.cgroups.remove(record["cgroup"])  # kills what is left in it first
            lost = True  # the agent's restart ended it, not the task itself
            if record.get("outcome") in OUTCOMES:
                result = (record["outcome"], record.get("exit_code"), record.get("reason"))
                lost = bool(record.get("lost"))
            elif pids:
                result = ("failed", None, "fleet-agent restarted while the task ran; its processes were killed")
            else:
                result = ("failed", None, "fleet-agent restarted; the task's process had ended and its exit "
                                          "status is unknown")
            log.warning("task %s/%d: left from before the agent restarted; killed %d process(es); reporting %s",
                        task_id, epoch, len(pids), result[0])
            found.append((task_id, epoch, pids))
            self._background(f"recover-{task_id}", self._report_orphan, path, task_id, epoch, result, lost)
        return found

    def _report_orphan(self, path, task_id, epoch, result, lost=False):
        client = self.checkout_client()
        label = f"{task_id}/{epoch}"
        try:
            done = report_finish(client, self, task_id, epoch, result, label, lost=lost)
        except Fenced as exc:
            log.warning("task %s: %s; the task is no longer this node's (stale epoch), forgotten", label, exc)
            done = True
        finally:
            self.checkin_client(client)
        if done and path:
            self.dirs.remove(path, reuse=False)

    def _background(self, name, target, *args):
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    # Stopping.

    def shutdown(self, reason, timeout=None, lost=True):
        """Stop every task (SIGTERM, SIGKILL after the grace) and wait for their supervisors, bounded.

        The tasks are reported failed with `lost` (the agent stopped them). Finish reports get one
        more attempt; those not delivered stay in the state dir for the next start.
        """
        self.closing.set()
        tasks = self.tasks()
        for task in tasks:
            task.cancel(reason, outcome="failed", lost=lost)
            if task.shipper is not None:
                task.shipper.nudge()
        timeout = self.kill_grace_seconds + 15 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        for task in tasks:
            task.thread.join(max(0.1, deadline - time.monotonic()))
            if task.thread.is_alive():
                task.fence("the agent is stopping", keep_state=True)
                task.thread.join(5)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        with self._lock:
            idle, self._idle_clients = self._idle_clients, []
        for client in idle:
            client.close()
