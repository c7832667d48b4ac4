"""Processes, from /proc: every /proc read and every signal the agent sends to a pid or group.

The one module that reads /proc (as agent/nvml.py is the one that imports pynvml): the parse
of /proc/<pid>/stat, the FLEET_TASK_* markers of an environment, which processes belong to
a supervised workload, the signals that stop them, and which sockets listen on a TCP port and
which processes hold them (/proc/net/tcp{,6}, /proc/<pid>/fd), each written once.
"""

import dataclasses
import functools
import os
import time

MAX_ANCESTRY = 64  # ppid hops followed when mapping a pid to its workload


@dataclasses.dataclass(frozen=True)
class ProcInfo:
    """The fields of /proc/<pid>/stat that map a process to a task."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start_ticks: int


def read_bytes(path):
    """The bytes of a small file (/proc, cgroupfs), or None when it cannot be read.

    Plain os.open and os.read: a Python file object costs three more syscalls (fstat, the
    isatty ioctl, lseek) and the object itself, and the agent reads several of these per task.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        for _ in range(1 << 20):  # proc and cgroup files may answer a page per read
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat_fields(pid):
    """The fields of /proc/<pid>/stat after the command name (fields[0] is proc(5)'s field 3), or
    None."""
    data = read_bytes(f"/proc/{pid}/stat")
    if data is None or b")" not in data:
        return None
    return data[data.rindex(b")") + 2 :].split()


def read_stat(pid):
    """ProcInfo of a process, zombies included, or None when there is none."""
    fields = _stat_fields(pid)
    try:
        # proc(5): state (field 3), then ppid, pgrp, session; starttime is field 22.
        return ProcInfo(
            pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])
        )
    except (TypeError, ValueError, IndexError):
        return None


def read_usage(pid):
    """(CPU time in clock ticks, resident memory in bytes) of a live process, or None."""
    fields = _stat_fields(pid)
    try:
        if fields[0] in (b"Z", b"X"):
            return None
        # proc(5): utime and stime are fields 14 and 15, rss (pages) field 24.
        return int(fields[11]) + int(fields[12]), int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    except (TypeError, ValueError, IndexError):
        return None


def read_proc(pid):
    """ProcInfo of a live process, or None (gone, or a zombie)."""
    info = read_stat(pid)
    return None if info is None or info.state in ("Z", "X") else info


def read_cgroup(pid):
    """The cgroup v2 path of a process ("/fleet-agent/task-x.1"), or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            for line in fh:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def read_markers(pid):
    """(FLEET_TASK_ID, FLEET_TASK_EPOCH) from a process's environment, or None."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            entries = fh.read().split(b"\0")
    except OSError:
        return None
    task_id = epoch = None
    for entry in entries:
        if entry.startswith(b"FLEET_TASK_ID="):
            task_id = entry[14:].decode("utf-8", "replace")
        elif entry.startswith(b"FLEET_TASK_EPOCH="):
            epoch = entry[17:].decode("utf-8", "replace")
    return (task_id, epoch) if task_id is not None and epoch is not None else None


def proc_uid(pid):
    """The (effective) uid a process runs as, or None once it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def read_command(pid):
    """A process's command line (for reports), or its comm, or ""."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
        if raw:
            return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")[:300]
        with open(f"/proc/{pid}/comm") as fh:
            return f"[{fh.read().strip()}]"
    except OSError:
        return ""


def read_comm(pid):
    """/proc/<pid>/comm, or ""."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def is_visible(pid):
    """True while /proc has an entry for `pid` (zombies included)."""
    return os.path.exists(f"/proc/{pid}")


def read_memory_total():
    """MemTotal of /proc/meminfo in bytes (0 when it has none), or None when it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return 0


def find_mount(fstype, mounts_path="/proc/self/mounts"):
    """Where a file system of `fstype` is mounted (the first such mount), or None.

    For cgroup2: /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts.
    """
    try:
        with open(mounts_path) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == fstype:
                    return parts[1]
    except OSError:
        pass
    return None


def all_pids():
    """Every pid in /proc."""
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def find_processes(comm):
    """The pids whose comm is `comm` (e.g. docker-proxy)."""
    return [pid for pid in all_pids() if read_comm(pid) == comm]


def read_pid_max():
    """/proc/sys/kernel/pid_max, or None when it cannot be read."""
    data = read_bytes("/proc/sys/kernel/pid_max")
    try:
        return int(data) if data is not None else None
    except ValueError:
        return None


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


# ----------------------------------------------------------------------------------------------
# Which processes are a workload's


@dataclasses.dataclass(frozen=True)
class TaskKey:
    """What identifies a task's processes on this host."""

    task_id: str
    epoch: int
    pgid: int | None = None  # the leader's pid = its session and process group (while not reaped)
    cgroup: str | None = None  # the task's cgroup v2 path relative to the mount, when it has one
    cgroup_dir: str | None = None  # the same cgroup's directory (absolute), to read its members
    uid: int | None = (
        None  # the task's uid: a process of another uid never counts as the task's by its markers
    )


class ProcessMapper:
    """Maps host PIDs to tasks, in this order of trust:

    1. the task's cgroup v2 (nothing a process does takes it out, short of root);
    2. the task's session or process group (the leader runs in its own session);
    3. the FLEET_TASK_ID/FLEET_TASK_EPOCH the runner injects (survives setsid and double forks);
    4. the parent chain (a child that left the session and cleared its environment).

    One mapper serves one poll: /proc readings are cached for its lifetime.
    """

    def __init__(self, keys):
        self.keys = list(keys)
        self._by_cgroup = {k.cgroup: k for k in self.keys if k.cgroup}
        self._by_sid = {k.pgid: k for k in self.keys if k.pgid}
        self._by_marker = {(k.task_id, str(k.epoch)): k for k in self.keys}
        self._cache = {}

    def owner(self, pid):
        """The TaskKey that `pid` belongs to, or None."""
        chain = []
        found = None
        for _ in range(MAX_ANCESTRY):
            if pid in self._cache:
                found = self._cache[pid]
                break
            chain.append(pid)
            info = read_proc(pid)
            if info is None:
                break
            found = self._direct(info)
            if found is not None or info.ppid <= 1:
                break
            pid = info.ppid
        for seen in chain:
            self._cache[seen] = found
        return found

    def _direct(self, info):
        if self._by_cgroup:
            cgroup = read_cgroup(info.pid)
            if cgroup in self._by_cgroup:
                return self._by_cgroup[cgroup]
        key = self._by_sid.get(info.session) or self._by_sid.get(info.pgrp)
        if key is not None:
            return key
        key = self._by_marker.get(read_markers(info.pid))
        # Markers are only the environment, which any process may set: another tenant's process
        # that copies them must not count as this task's (it could get the task stopped for its GPU
        # use).
        if key is not None and key.uid is not None and proc_uid(info.pid) != key.uid:
            return None
        return key


def task_pids(key, exclude=()):
    """Every live process of one task.

    Where the task has a cgroup, its members are the answer (only root can move a process out),
    plus the leader until its shim has moved itself in: a few small reads, where the /proc scan
    of a task without a cgroup reads up to three files of every process on the host (its
    group/session, its environment markers, its parent chain).
    """
    me = os.getpid()
    if key.cgroup_dir:
        found = set(cgroup_tree_pids(key.cgroup_dir))
        if key.pgid:
            found.add(key.pgid)
        return sorted(
            pid for pid in found if pid != me and pid not in exclude and read_proc(pid) is not None
        )
    mapper = ProcessMapper([key])
    return sorted(
        pid for pid in all_pids() if pid != me and pid not in exclude and mapper.owner(pid) is key
    )


def recorded_pids(record):
    """Live pids of the task a journal record from before a restart describes.

    Found as task_pids finds a running task's (session or process group, FLEET_TASK_* markers,
    parent chain), by the recorded group only while the group's leader, if still there, is the
    very process started (by its start ticks). Processes started before the task was created are
    never its own (a recorded pgid may have been reused since).
    """
    if record.get("boot_id") and record["boot_id"] != read_boot_id():
        return []
    pgid = record.get("pgid")
    leader = read_stat(pgid) if pgid else None
    group_is_ours = bool(pgid) and (
        leader is None or leader.start_ticks == record.get("start_ticks")
    )
    run_as = record.get("run_as") if isinstance(record.get("run_as"), dict) else {}
    uid = run_as.get("uid") if isinstance(run_as.get("uid"), int) else None
    key = TaskKey(record["task_id"], record["epoch"], pgid if group_is_ours else None, uid=uid)
    created = record.get("created_ticks") or 0
    return [
        pid
        for pid in task_pids(key)
        if (info := read_stat(pid)) is not None and info.start_ticks >= created
    ]


def group_pids(pgid, exclude=()):
    """Live (not zombie) processes of a process group."""
    out = []
    for pid in all_pids():
        info = read_stat(pid)
        if info and info.pgrp == pgid and info.state != "Z" and pid not in exclude:
            out.append(pid)
    return out


def cgroup_procs(path):
    """Pids in one cgroup (its cgroup.procs), [] when it has none or is gone."""
    data = read_bytes(os.path.join(path, "cgroup.procs")) if path else None
    return [int(p) for p in data.split()] if data else []


def cgroup_tree_pids(path):
    """Pids in a cgroup and in the cgroups below it; [] once it is gone (it can only go when empty).

    `cgroup.events` says in one read whether any process is left in the whole subtree, which is
    the usual answer once a task's leader has exited: no walk then.
    """
    if b"populated 0" in (read_bytes(os.path.join(path, "cgroup.events")) or b""):
        return []
    return [pid for root, _dirs, _files in os.walk(path) for pid in cgroup_procs(root)]


# ----------------------------------------------------------------------------------------------
# Signals


def signal_pids(pids, sig):
    """Send `sig` to each pid that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_group(pgid, sig):
    """Send `sig` to a process group, if it still exists."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_gone(pids, timeout):
    """True once none of `pids` is alive (zombies count as gone); bounded by `timeout`."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.05) + 1):
        if not [p for p in pids if read_proc(p) is not None]:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return False


# ----------------------------------------------------------------------------------------------
# Listening sockets and who holds them

NET_TCP_FILES = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN = b"0A"  # the `st` column of a listening socket (include/net/tcp_states.h)


def tcp_listeners(ports, paths=NET_TCP_FILES):
    """{port: inodes of the sockets listening on TCP `port`, on any address} for each of `ports`, in
    this network namespace (the agent's, the host's); a port nothing listens on has an empty set."""
    wanted: dict[int, set[int]] = {int(port): set() for port in ports}
    for path in paths:
        data = read_bytes(path)
        for line in data.splitlines()[1:] if data else ():
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            try:
                port, inode = int(fields[1].rsplit(b":", 1)[1], 16), int(fields[9])
            except (IndexError, ValueError):
                continue
            if port in wanted and inode:
                wanted[port].add(inode)
    return wanted


def socket_inodes(pid):
    """The inodes of the sockets process `pid` holds open (empty once it is gone or cannot be
    read)."""
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return set()
    inodes = set()
    for name in names:
        try:
            target = os.readlink(f"{base}/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]") and target[8:-1].isdigit():
            inodes.add(int(target[8:-1]))
    return inodes
