"""A supervised process: started in its own session (and cgroup), watched until reaped, stopped with
a grace.

What a task and any other supervised workload on this host share: the process is the leader of
a new session, so its pid is its process group's id until it is reaped (`waitid(WNOWAIT)` and a
pidfd see the exit without reaping); its output is read line by line on one thread, or goes into
files the owner opened (a process that must outlive the agent); stopping is SIGTERM to every
process of it, then SIGKILL after a grace; and it is found again after an agent restart from the
journal record of it (`procfs.recorded_pids`): killed, or, for a workload that outlives the agent,
adopted (`adopt`: watched through a pidfd, since it is no child of this agent any more). What a
stop or an exit means (an outcome, a restart) is the owner's business, not this module's.
"""

import dataclasses
import logging
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time

from agent.procfs import (
    group_pids,
    read_proc,
    read_stat,
    signal_group,
    signal_pids,
    task_pids,
    uptime_ticks,
    wait_gone,
)
from agent.task.errors import TaskError
from agent.threads import UNTIL_STOPPED
from agent.watch import Watch

log = logging.getLogger("agent.runner")

MAX_FOUND_IN_PATH = 1024
_FOUND_IN_PATH: dict[
    tuple[str, str], str | None
] = {}  # (program, PATH) -> where shutil.which last found it
EXIT_WAIT_SECONDS = 30  # after SIGKILL; longer means the process is stuck in the kernel
ADOPTED_POLL_SECONDS = (
    0.5  # how often an adopted process is looked at where the kernel has no pidfd
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def check_executable(program, cwd, path):
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


def describe_exit(code):
    """(exit code as a shell reports it, how the process ended) for a Popen returncode."""
    if code >= 0:
        return code, f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return 128 - code, f"killed by {name}"


def read_exit_status(path):
    """The exit status a wrapper shell wrote into `path` (see agent/task/instance.py), or None."""
    try:
        with open(path) as fh:
            text = fh.read(32).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class Adopted:
    """The Popen face of a process left from before an agent restart (no child of this agent): its
    exit status is what its wrapper wrote into `status_path`, None when nothing was written."""

    def __init__(self, pid, status_path):
        self.pid = pid
        self.status_path = status_path
        self.stdout = self.stderr = None
        self.returncode = None

    def wait(self):
        """The exit status the wrapper recorded (it exited), or None when unknown."""
        self.returncode = read_exit_status(self.status_path)
        return self.returncode


class Supervisor:
    """One process of a workload, from its start to its reaping, and every process it starts.

    `identity` is the TaskKey of the workload (its FLEET_TASK_* markers, its cgroup) without a
    pgid: the supervisor adds the leader's while it is not reaped. `cgroups` kills a cgroup at
    once where the kernel can. `lock` guards the process state; owners may take it around their
    own checks, never the other way round.
    """

    def __init__(self, label, threads, cgroups=None, on_reaped=None, exits=None):
        self.label = label
        # An agent.watch.ExitWatcher: where the process writes into files, the exit is seen there
        # rather than on a watcher thread of its own.
        self.exits = exits
        self.on_reaped = on_reaped  # called (holding `lock`) once the leader's pid may be reused
        self.threads = (
            threads  # a threads.Pool for the watcher (and the exit waiter before Linux 5.3)
        )
        self.cgroups = cgroups
        self.identity = None  # a TaskKey: the owner sets it as it makes the supervisor
        self.lock = threading.Lock()
        self.wake = (
            threading.Event()
        )  # set on the exit and by owners: the supervising loop re-checks
        self.exited = threading.Event()  # the leader exited (not yet reaped)
        self.proc: subprocess.Popen[bytes] | Adopted | None = None  # the leader (spawn, adopt)
        self.pgid = None
        self.reaped = False
        self.kill_at = None  # monotonic time of the SIGKILL that follows a SIGTERM
        self.grace = None  # of the stop asked for
        self.started_monotonic = None
        self.watcher = None  # the PoolWork that reads the pipes (and sees the exit)
        self.adopted = False  # the process is no child of this agent (found again after a restart)
        self._unwatch = None  # (read, write) ends of a pipe that ends the watcher: see release()
        self._unwatch_lock = threading.Lock()  # the pipe is written only while it is open
        self.released = threading.Event()
        # pid -> start ticks of every process seen as the workload's (they may leave its tree)
        self._seen = {}

    def key(self):
        """The TaskKey that finds the processes (with the group while the leader is not reaped)."""
        identity = self.identity
        assert (
            identity is not None
        )  # set by the owner as it makes the supervisor, before any process
        return dataclasses.replace(identity, pgid=None if self._pid_free() else self.pgid)

    def _leader(self) -> "subprocess.Popen[bytes] | Adopted":
        """The process spawn() or adopt() started: the callers of this run only after one of
        them."""
        assert self.proc is not None, f"task {self.label}: no process started"
        return self.proc

    def _pid_free(self):
        """True once the leader's pid may be another process's: reaped, or, adopted, exited (init
        reaps it)."""
        return self.reaped or (self.adopted and self.exited.is_set())

    def spawn(self, argv, cwd, env, on_output=None, output=None):
        """Start `argv` in a new session, its output read into `on_output`; the caller holds `lock`.

        `on_output(buffered bytes, "stdout" | "stderr", eof)` takes what it can (whole lines) and
        returns the rest. With `output` (stdout and stderr file descriptors the owner opened) the
        process writes there instead, and the watcher can be released (`release`) while it runs.
        OSError when it cannot start. From the return on, the process is watched.
        """
        stdout, stderr = output if output is not None else (subprocess.PIPE, subprocess.PIPE)
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
        )
        self.pgid = self.proc.pid  # start_new_session: the leader's pid is the session and group id
        self.started_monotonic = time.monotonic()
        # The watcher first: from here on nothing may leave the process unwatched.
        try:
            pidfd = os.pidfd_open(self.proc.pid)  # readable once the leader exits; reaps nothing
        except (AttributeError, OSError):  # Linux before 5.3: a thread waits for the exit instead
            pidfd = None
            self.threads.run(self._wait_exit, name=f"wait-{self.label}")
        if output is not None and pidfd is not None and self.exits is not None:
            self.watcher = self.exits.watch(pidfd, self._saw_exit)  # no pipe to read: no thread
            return
        if output is not None:
            self._unwatch = os.pipe2(os.O_CLOEXEC)
        self.watcher = self.threads.run(self._watch, pidfd, on_output, name=f"watch-{self.label}")

    def adopt(self, pid, start_ticks, status_path):
        """Watch a process this agent started before a restart (the leader of its session, writing
        its output into files, its exit status into `status_path`); the caller holds `lock`.

        False when `pid` is not that process any more (it ended, or the pid is another's now). The
        pidfd is opened before the start time is compared, so that it is the compared process's.
        """
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        info = read_proc(pid)
        if info is None or info.start_ticks != start_ticks:
            if pidfd is not None:
                os.close(pidfd)
            return False
        self.proc = Adopted(pid, status_path)
        self.pgid = pid
        self.adopted = True
        try:
            ran = max(0.0, (uptime_ticks() - start_ticks) / CLOCK_TICKS)
        except OSError:
            ran = 0.0
        self.started_monotonic = time.monotonic() - ran
        if pidfd is not None and self.exits is not None:
            self.watcher = self.exits.watch(pidfd, self._saw_exit)
            return True
        self._unwatch = os.pipe2(os.O_CLOEXEC)
        if pidfd is None:  # Linux before 5.3: looked at twice a second instead
            self.threads.run(self._poll_exit, start_ticks, name=f"wait-{self.label}")
        self.watcher = self.threads.run(self._watch, pidfd, None, name=f"watch-{self.label}")
        return True

    def release(self):
        """Stop watching a process that writes into files, leaving it running (the agent stops)."""
        self.released.set()
        if isinstance(self.watcher, Watch):
            self.watcher.cancel()
        with self._unwatch_lock:
            if self._unwatch is not None:
                os.write(self._unwatch[1], b"x")

    def start_ticks(self):
        """The leader's start time in clock ticks (zombie or not), or None once it is gone."""
        info = read_stat(self._leader().pid)
        return info.start_ticks if info else None

    # Signals; called with `lock` held.

    def signal(self, sig):
        """Signal the process group, and the processes that left it (setsid) but are still the
        workload's.

        The processes are listed before the group is signalled: once the leader dies, a child
        that left its session and environment is reparented and only its cgroup, or this
        supervisor having seen it before, still ties it to the workload.
        """
        # Only while the leader is not reaped: until then its pid (the pgid) cannot be reused.
        key = self.key()
        others = self.remember(task_pids(key))
        if not self._pid_free():
            signal_group(self.pgid, sig)
        if sig == signal.SIGKILL and self.cgroups is not None and key.cgroup_dir:
            self.cgroups.kill(key.cgroup_dir)
        signal_pids(others, sig)

    def terminate(self, grace):
        """SIGTERM now and SIGKILL after `grace`, if the leader runs; True when it was signalled."""
        self.grace = grace
        if self.pgid and not self.reaped:  # an adopted leader that exited: its group's stragglers
            self.signal(signal.SIGTERM)
            self.kill_at = time.monotonic() + grace
            return True
        return False

    def kill(self):
        """SIGKILL now, if the leader is not reaped."""
        if self.pgid and not self.reaped:
            self.signal(signal.SIGKILL)

    def kill_if_due(self, now):
        """SIGKILL once the grace after a SIGTERM is over; returns when the next one is due, or
        None."""
        if self.kill_at is not None and now >= self.kill_at:
            log.warning("task %s: still running %gs after SIGTERM; SIGKILL", self.label, self.grace)
            self.signal(signal.SIGKILL)
            self.kill_at = None
        return self.kill_at

    def remember(self, pids):
        """Remember `pids` as the workload's; returns every remembered process still alive (same
        start time)."""
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

    # From any thread.

    def pids(self):
        """The live processes: the group and session, the cgroup, the FLEET_TASK_* environment."""
        with self.lock:
            if self.proc is None:
                return []
            key = self.key()
        pids = task_pids(key)
        with self.lock:
            return self.remember(pids)

    # The end.

    def end_group(self, grace_seconds, abandon):
        """The leader exited: let the rest of the group end within what is left of a grace, then
        SIGKILL it.

        `abandon()` True cuts the wait short.
        """
        with self.lock:
            kill_at = self.kill_at
        if kill_at is not None:
            for _ in range(int(grace_seconds / 0.05) + 2):
                if (
                    abandon()
                    or time.monotonic() >= kill_at
                    or not group_pids(self.pgid, exclude=(self._leader().pid,))
                ):
                    break
                time.sleep(0.05)
        with self.lock:
            if not self.reaped:
                self.signal(signal.SIGKILL)  # whatever is left of the group ends with the leader
            self.kill_at = None

    def reap(self):
        """Wait for the leader's exit status (it exited); the pgid may be reused from now on."""
        with self.lock:
            code = self._leader().wait()
            self.reaped = True
            if self.on_reaped is not None:
                self.on_reaped()
        return code

    def kill_and_reap(self):
        """However the owner ends, the process group does not outlive it."""
        if self.proc is None or self.reaped:
            return
        with self.lock:
            self.signal(signal.SIGKILL)
        if self.exited.wait(EXIT_WAIT_SECONDS):
            self.reap()
        else:
            log.error("task %s: pid %d did not exit after SIGKILL", self.label, self.proc.pid)

    def kill_leftovers(self):
        """SIGKILL whatever is left of the workload outside its group (after the leader was reaped);
        returns the pids signalled."""
        if self.proc is None:
            return []
        pids = task_pids(dataclasses.replace(self.key(), pgid=None))
        with self.lock:
            left = self.remember(pids)
            signal_pids(left, signal.SIGKILL)
        return left

    # The watcher's thread.

    def _watch(self, pidfd, on_output):
        """Read stdout and stderr into `on_output` and, given a pidfd, notice the leader's exit: one
        thread per process instead of three. Ends once both pipes are closed and the exit was seen,
        or when released."""
        proc = self._leader()
        selector = selectors.DefaultSelector()
        pending = {}
        try:
            for pipe, stream in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
                if pipe is None:  # output into files
                    continue
                os.set_blocking(pipe.fileno(), False)
                selector.register(pipe.fileno(), selectors.EVENT_READ, stream)
                pending[pipe.fileno()] = b""
            if pidfd is not None:
                selector.register(pidfd, selectors.EVENT_READ, None)
            if self._unwatch is not None:
                selector.register(self._unwatch[0], selectors.EVENT_READ, "release")
            for _ in range(UNTIL_STOPPED):
                if not [key for key in selector.get_map().values() if key.data != "release"]:
                    return
                for key, _mask in selector.select():
                    if key.data == "release":
                        return
                    if key.data is None:  # the pidfd: the leader exited (a zombie until reaped)
                        selector.unregister(pidfd)
                        os.close(pidfd)
                        pidfd = None
                        self._saw_exit()
                        continue
                    try:
                        chunk = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    pending[key.fd] = on_output(pending[key.fd] + chunk, key.data, not chunk)
                    if not chunk:
                        selector.unregister(key.fd)
        finally:
            if pidfd is not None:
                os.close(pidfd)
            selector.close()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            with self._unwatch_lock:
                if self._unwatch is not None:
                    for fd in self._unwatch:
                        os.close(fd)
                    self._unwatch = None

    def _wait_exit(self):
        # WNOWAIT leaves the leader a zombie, so its pid (= the pgid) stays reserved until we reap
        # it.
        try:
            os.waitid(os.P_PID, self._leader().pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        self._saw_exit()

    def _poll_exit(self, start_ticks):
        pid = self._leader().pid
        for _ in range(UNTIL_STOPPED):
            info = read_proc(pid)
            if info is None or info.start_ticks != start_ticks:
                break
            if self.released.wait(ADOPTED_POLL_SECONDS):
                return
        self._saw_exit()

    def _saw_exit(self):
        self.exited.set()
        self.wake.set()


def kill_recorded(record, pids, cgroups, wait_seconds):
    """Kill the processes of a workload left from before a restart and remove its cgroup; False when
    some survived."""
    survived = False
    if pids:
        signal_pids(pids, signal.SIGKILL)
        survived = not wait_gone(pids, wait_seconds)
    if record.get("cgroup") and os.path.isdir(record["cgroup"]):
        cgroups.remove(record["cgroup"])  # kills what is left in it first
    return not survived
