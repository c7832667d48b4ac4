"""GPU limits enforced from the host: isolation, the VRAM watchdog, MPS, cgroups, GPU health.

Peers limit GPU memory by intercepting CUDA inside the task, which a task bypasses (a child that
unsets a variable, a nested container). Here everything is decided on the host, from NVML and
/proc, where the task cannot reach:

* **Isolation.** Every task sees only its GPUs (``CUDA_VISIBLE_DEVICES`` and
  ``NVIDIA_VISIBLE_DEVICES`` set to their UUIDs, by the runner). ``exclusive`` tasks own whole
  GPUs; ``shared`` tasks hold a slice (``memory_limit_bytes``, ``compute_percent``) that the
  watchdog enforces; ``mps`` tasks additionally run as clients of an MPS control daemon per GPU
  (started and supervised here when ``limits.mps_enabled``), with
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` set, so that the
  driver itself enforces the compute share and the memory limit.
* **Watchdog.** Every ``limits.poll_seconds`` (0.25 s, at most 0.5 s) NVML's per-process memory
  is read, each host PID is mapped to its task (:class:`ProcessMapper`) and summed per task per
  GPU. A task over ``memory_limit_bytes + limits.memory_tolerance_bytes`` on a GPU is stopped
  (SIGTERM to all its processes, SIGKILL ``limits.kill_grace_seconds`` later) and fails with
  ``gpu_memory_limit_exceeded: ...``; a task process on a GPU not given to the task fails it with
  ``gpu_not_assigned: ...``; a task on a GPU that became unhealthy (critical XID, uncorrectable
  ECC, lost) fails with ``gpu_unhealthy: ...``. GPU processes that belong to no task are
  reported (heartbeat metrics, local API) and killed when ``limits.foreign_processes = "kill"``.
* **Compute share.** Per-process SM utilisation from NVML is reported per worker. With MPS the
  driver enforces the share; without MPS it is *reported, not throttled*: the worker record says
  so and flags a task over its share while another process on the GPU is active.
* **Host CPU and memory** (``cpus``, ``memory_bytes`` of the JobSpec) through a cgroup v2 per task
  where the host has cgroup v2 with the cpu/memory controllers writable; where not, the worker's
  record says "not enforced" and why. The task cgroup, when it can be created at all, is also the
  most reliable way to find a task's processes.

The tolerance: NVML counts a process's whole footprint (CUDA context, allocator rounding to 2 MiB
pages), so usage over the limit by at most ``memory_tolerance_bytes`` (32 MiB by default) is
allowed; usage at ``limit + tolerance`` is within, one byte more is over.
"""

import collections
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import threading
import time

log = logging.getLogger("agent.limits")

ISOLATION_MODES = ("exclusive", "shared", "mps")
FOREIGN_MODES = ("report", "kill")
REASON_MEMORY = "gpu_memory_limit_exceeded"
REASON_NOT_ASSIGNED = "gpu_not_assigned"
REASON_UNHEALTHY = "gpu_unhealthy"
MAX_POLL_SECONDS = 0.5
MAX_ANCESTRY = 64  # ppid hops followed when mapping a pid to its task
MPS_SERVER_COMMS = ("nvidia-cuda-mps", "nvidia-cuda-mps-server", "nvidia-cuda-mps-control")
DETECTIONS_KEPT = 200
MIB = 1024 * 1024


class LimitError(Exception):
    """A task cannot run with its limits on this host; the message is the reason for fleetd."""


def _fmt_bytes(n):
    return f"{n} bytes ({n / MIB:.1f} MiB)"


# ----------------------------------------------------------------------------------------------
# /proc


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


def read_proc(pid):
    """ProcInfo of a live process, or None (gone, or a zombie)."""
    data = read_bytes(f"/proc/{pid}/stat")
    if data is None:
        return None
    try:
        fields = data[data.rindex(b")") + 2:].split()
        # proc(5): fields[0] is field 3 (state), then ppid, pgrp, session; starttime is field 22.
        info = ProcInfo(pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (ValueError, IndexError):
        return None
    return None if info.state in ("Z", "X") else info


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


def all_pids():
    """Every pid in /proc."""
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


@dataclasses.dataclass(frozen=True)
class TaskKey:
    """What identifies a task's processes on this host."""

    task_id: str
    epoch: int
    pgid: int | None = None  # the leader's pid = its session and process group (while not reaped)
    cgroup: str | None = None  # the task's cgroup v2 path relative to the mount, when it has one
    cgroup_dir: str | None = None  # the same cgroup's directory (absolute), to read its members


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
        return self._by_marker.get(read_markers(info.pid))


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
        return sorted(pid for pid in found
                      if pid != me and pid not in exclude and read_proc(pid) is not None)
    mapper = ProcessMapper([key])
    return sorted(pid for pid in all_pids() if pid != me and pid not in exclude and mapper.owner(pid) is key)


def cgroup_tree_pids(path):
    """Pids in a cgroup and in the cgroups below it; [] once it is gone (it can only go when empty).

    `cgroup.events` says in one read whether any process is left in the whole subtree, which is
    the usual answer once a task's leader has exited: no walk then.
    """
    if "populated 0" in (_read(os.path.join(path, "cgroup.events")) or ""):
        return []
    return [pid for root, _dirs, _files in os.walk(path) for pid in Cgroups.procs(root)]


def signal_pids(pids, sig):
    """Send `sig` to each pid that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


# ----------------------------------------------------------------------------------------------
# cgroup v2


def find_cgroup2_mount(mounts_path="/proc/self/mounts"):
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts)."""
    try:
        with open(mounts_path) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    return parts[1]
    except OSError:
        pass
    return None


def _read(path):
    data = read_bytes(path)
    return None if data is None else data.decode(errors="replace").strip()


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


class Cgroups:
    """Per-task cgroups under ``<cgroup2 mount>/<parent>``; `path` None where none can be made."""

    def __init__(self, parent="fleet-agent", mount=None):
        self.mount = mount if mount is not None else find_cgroup2_mount()
        self.parent = parent.strip("/")
        self.path = None
        self.controllers = set()
        self.why = ""
        if not self.parent:
            self.why = "cgroups disabled by limits.cgroup_parent = \"\""
        elif not self.mount:
            self.why = "no cgroup v2 hierarchy is mounted"
        else:
            self._setup()

    def _setup(self):
        path = os.path.join(self.mount, self.parent)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            self.why = f"cannot create {path}: {exc.strerror or exc}"
            return
        if not os.access(os.path.join(path, "cgroup.procs"), os.W_OK):
            self.why = f"{path}/cgroup.procs is not writable"
            return
        self.path = path
        # Each level hands the controllers down; the mount root is exempt from the "no internal
        # processes" rule, our parent holds no process itself.
        levels = [self.mount] + [os.path.join(self.mount, *self.parent.split("/")[:i + 1])
                                 for i in range(len(self.parent.split("/")) - 1)] + [path]
        for level in levels:
            available = set((_read(os.path.join(level, "cgroup.controllers")) or "").split())
            for name in ("cpu", "memory"):
                if name in available:
                    try:
                        _write(os.path.join(level, "cgroup.subtree_control"), f"+{name}")
                    except OSError as exc:
                        log.info("cgroup v2: cannot enable %s below %s: %s", name, level, exc.strerror or exc)
        enabled = set((_read(os.path.join(path, "cgroup.subtree_control")) or "").split())
        self.controllers = enabled & {"cpu", "memory"}
        if self.controllers != {"cpu", "memory"}:
            missing = sorted({"cpu", "memory"} - self.controllers)
            self.why = (f"cgroup v2 controller(s) {', '.join(missing)} not available at {self.mount} "
                        f"(available: {_read(os.path.join(self.mount, 'cgroup.controllers')) or 'none'})")
        log.info("cgroup v2 at %s: task cgroups under %s, controllers %s", self.mount, path,
                 ", ".join(sorted(self.controllers)) or "none (processes are tracked, host limits not enforced)")

    def relative(self, path):
        """The form /proc/<pid>/cgroup shows for `path`."""
        return "/" + os.path.relpath(path, self.mount) if path else None

    def create(self, name, cpus=None, memory_bytes=None):
        """(cgroup path or None, host-limits record) for one task; never raises."""
        record = {
            "cpus": {"limit": cpus, "enforced": False, "how": None},
            "memory_bytes": {"limit": memory_bytes, "enforced": False, "how": None},
        }
        if self.path is None:
            for item in record.values():
                item["how"] = "not enforced: " + self.why if item["limit"] else "no limit"
            return None, record
        path = os.path.join(self.path, name)
        try:
            try:
                os.mkdir(path)
            except FileExistsError:
                pass
            except FileNotFoundError:  # the parent went (an operator removed it): made again
                os.makedirs(path, exist_ok=True)
        except OSError as exc:
            for item in record.values():
                item["how"] = f"not enforced: cannot create {path}: {exc.strerror or exc}" if item["limit"] else \
                    "no limit"
            return None, record
        settings = {
            "cpus": ("cpu", "cpu.max", lambda v: f"{max(1000, int(v * 100000))} 100000"),
            "memory_bytes": ("memory", "memory.max", lambda v: str(int(v))),
        }
        for key, (controller, filename, render) in settings.items():
            item = record[key]
            if not item["limit"]:
                item["how"] = "no limit"
                continue
            if controller not in self.controllers:
                item["how"] = f"not enforced: {self.why}"
                continue
            value = render(item["limit"])
            try:
                _write(os.path.join(path, filename), value)
                if controller == "memory":
                    try:
                        _write(os.path.join(path, "memory.swap.max"), "0")
                    except OSError:
                        pass  # no swap accounting: memory.max alone still bounds the task
            except OSError as exc:
                item["how"] = f"not enforced: writing {filename}: {exc.strerror or exc}"
                continue
            item["enforced"] = True
            item["how"] = f"cgroup v2 {filename} = {value}"
        return path, record

    @staticmethod
    def procs(path):
        """Pids in a cgroup."""
        text = _read(os.path.join(path, "cgroup.procs")) if path else None
        return [int(p) for p in text.split()] if text else []

    @staticmethod
    def oom_kills(path):
        """The memory controller's oom_kill count of a cgroup, or 0."""
        text = _read(os.path.join(path, "memory.events")) if path else None
        for line in (text or "").splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.isdigit():
                return int(value)
        return 0

    def kill(self, path):
        """SIGKILL everything in a cgroup (cgroup.kill where the kernel has it)."""
        if not path:
            return
        try:
            _write(os.path.join(path, "cgroup.kill"), "1")
            return
        except OSError:
            pass
        signal_pids(self.procs(path), signal.SIGKILL)

    def remove(self, path, attempts=40):
        """rmdir a task cgroup once its processes are gone (bounded wait)."""
        if not path:
            return True
        for _ in range(attempts):
            try:
                os.rmdir(path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                self.kill(path)
                time.sleep(0.05)
        log.warning("cgroup %s could not be removed (processes still in it)", path)
        return False


def shim_command(cgroup_path, argv):
    """The command that first moves itself into the task cgroup, then execs the task (same pid)."""
    return ["/bin/sh", "-c", 'echo 0 > "$0" || exit 126; exec "$@"', os.path.join(cgroup_path, "cgroup.procs"),
            *argv]


# ----------------------------------------------------------------------------------------------
# MPS


def mps_dirs(base, uuid):
    """(pipe directory, log directory) of the MPS control daemon of one GPU."""
    root = os.path.join(base, uuid)
    return os.path.join(root, "pipe"), os.path.join(root, "log")


def mps_daemon_command(control, base, uuid, environ=None):
    """(argv, env) of the foreground MPS control daemon for one GPU, and the env of `quit`."""
    pipe, logs = mps_dirs(base, uuid)
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in ("PATH", "LANG", "LC_ALL", "HOME") if k in environ}
    env.update({"CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logs})
    return [control, "-f"], env


def mps_client_env(base, uuid, grant):
    """The variables an MPS client task gets for its one GPU (device 0 of what it sees)."""
    pipe, logs = mps_dirs(base, uuid)
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logs}
    if grant.get("compute_percent"):
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(100, int(round(float(grant["compute_percent"]))))))
    if grant.get("memory_limit_bytes"):
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, int(grant['memory_limit_bytes']) // MIB)}M"
    return env


class MpsSupervisor:
    """One MPS control daemon per GPU, started on first use, restarted when it dies, quit on close."""

    def __init__(self, control, base, restart_backoff_max=30.0):
        self.control = control
        self.base = base
        self.restart_backoff_max = restart_backoff_max
        self._lock = threading.Lock()
        self._daemons = {}  # uuid -> {"proc", "starts", "next_start", "last_error"}
        self._closed = False

    def command(self, uuid):
        """(argv, env) that runs the daemon of `uuid`."""
        return mps_daemon_command(self.control, self.base, uuid)

    def ensure(self, uuid):
        """Start the daemon of `uuid` unless it runs; LimitError when it cannot run."""
        with self._lock:
            if self._closed:
                raise LimitError("mps: the agent is stopping")
            entry = self._daemons.get(uuid)
            if entry is not None and entry["proc"] is not None and entry["proc"].poll() is None:
                return
            self._start(uuid, entry)

    def _start(self, uuid, entry):
        argv, env = self.command(uuid)
        if shutil.which(argv[0], path=env.get("PATH")) is None and not os.access(argv[0], os.X_OK):
            raise LimitError(f"mps: {argv[0]} not found on this host (limits.mps_control_command)")
        pipe, logs = mps_dirs(self.base, uuid)
        for path in (pipe, logs):
            os.makedirs(path, mode=0o755, exist_ok=True)
        try:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except OSError as exc:
            raise LimitError(f"mps: cannot start {argv[0]}: {exc.strerror or exc}") from None
        starts = (entry or {}).get("starts", 0) + 1
        self._daemons[uuid] = {"proc": proc, "starts": starts, "next_start": None, "argv": argv, "env": env}
        log.info("mps: control daemon for gpu %s started (pid %d, pipe %s)", uuid, proc.pid, pipe)

    def supervise(self):
        """Restart daemons that died (with backoff); called from the watchdog loop."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return
            for uuid, entry in list(self._daemons.items()):
                proc = entry["proc"]
                if proc is not None and proc.poll() is None:
                    continue
                if entry["next_start"] is None:
                    code = proc.returncode if proc is not None else None
                    delay = min(self.restart_backoff_max, 0.5 * 2 ** min(entry["starts"], 8))
                    entry["next_start"] = now + delay
                    log.error("mps: control daemon for gpu %s exited (%s); restarting in %.1fs", uuid, code, delay)
                    continue
                if now >= entry["next_start"]:
                    try:
                        self._start(uuid, entry)
                    except LimitError as exc:
                        entry["next_start"] = now + self.restart_backoff_max
                        log.error("mps: %s", exc)

    def status(self):
        """{uuid: {pid, running, starts, argv, env}} for the local API."""
        with self._lock:
            return {uuid: {"pid": e["proc"].pid if e["proc"] else None,
                           "running": e["proc"] is not None and e["proc"].poll() is None,
                           "starts": e["starts"], "argv": e["argv"], "env": e["env"]}
                    for uuid, e in self._daemons.items()}

    def close(self, timeout=5.0):
        """`quit` each daemon through its pipe, then SIGTERM, then SIGKILL; bounded."""
        with self._lock:
            self._closed = True
            daemons, self._daemons = self._daemons, {}
        for uuid, entry in daemons.items():
            proc = entry["proc"]
            if proc is None or proc.poll() is not None:
                continue
            try:
                subprocess.run([entry["argv"][0]], input=b"quit\n", env=entry["env"], timeout=timeout,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("mps: quit for gpu %s failed: %s", uuid, exc)
            for sig, wait in ((None, timeout), (signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
                if sig is not None:
                    try:
                        os.killpg(proc.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            log.info("mps: control daemon for gpu %s stopped", uuid)


# ----------------------------------------------------------------------------------------------
# Settings and per-task limits


@dataclasses.dataclass
class LimitSettings:
    """The [limits] settings of the agent config."""

    poll_seconds: float = 0.25
    memory_tolerance_bytes: int = 32 * MIB
    kill_grace_seconds: float = 0.5
    foreign_processes: str = "report"
    mps_enabled: bool = False
    mps_control_command: str = "nvidia-cuda-mps-control"
    mps_dir: str = ""  # empty: <state_dir>/mps
    cgroup_parent: str = "fleet-agent"  # empty: no task cgroups

    @classmethod
    def from_config(cls, config):
        """The settings from an agent Config."""
        return cls(poll_seconds=config.limits_poll_seconds,
                   memory_tolerance_bytes=config.limits_memory_tolerance_bytes,
                   kill_grace_seconds=config.limits_kill_grace_seconds,
                   foreign_processes=config.limits_foreign_processes,
                   mps_enabled=config.limits_mps_enabled, mps_control_command=config.limits_mps_control_command,
                   mps_dir=config.limits_mps_dir, cgroup_parent=config.limits_cgroup_parent)


@dataclasses.dataclass
class TaskLimits:
    """What the agent set up for one task: env, cgroup, limits, and how each is enforced."""

    task_id: str
    epoch: int
    isolation: str
    gpus: list  # [{uuid, memory_limit_bytes?, compute_percent?}]
    env: dict  # variables injected on top of the runner's
    cgroup: str | None = None  # absolute path of the task's cgroup
    cgroup_rel: str | None = None  # as /proc/<pid>/cgroup shows it
    host: dict = dataclasses.field(default_factory=dict)
    gpu_enforcement: dict = dataclasses.field(default_factory=dict)  # uuid -> {memory, compute}
    tolerance_bytes: int = 0
    kill_grace_seconds: float = 0.5

    def describe(self):
        """The `limits` part of the local API's worker record."""
        return {
            "isolation": self.isolation,
            "memory_tolerance_bytes": self.tolerance_bytes,
            "limit_kill_grace_seconds": self.kill_grace_seconds,
            "gpus": [dict(g, **self.gpu_enforcement.get(g["uuid"], {})) for g in self.gpus],
            "host": self.host,
            "cgroup": self.cgroup,
        }


def _grant_number(grant, key):
    value = grant.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return value


class Limits:
    """Sets up each task's limits and runs the watchdog over all of them."""

    def __init__(self, settings=None, devices=None, workers=None, state_dir=None, cgroups=None):
        self.settings = settings or LimitSettings()
        self.devices = devices
        self.workers = workers
        base = self.settings.mps_dir or os.path.join(state_dir or ".", "mps")
        self.mps = MpsSupervisor(self.settings.mps_control_command, os.path.abspath(base)) \
            if self.settings.mps_enabled else None
        self.mps_base = os.path.abspath(base)
        self.cgroups = cgroups if cgroups is not None else Cgroups(self.settings.cgroup_parent)
        self._lock = threading.Lock()
        self.polls = 0
        self.foreign = []  # the last poll's GPU processes that belong to no task
        self.detections = collections.deque(maxlen=DETECTIONS_KEPT)
        self._within = {}  # (task_id, epoch, uuid) -> last poll number at which usage was within the limit
        self._killed_foreign = {}  # pid -> (start ticks, SIGTERM time): SIGKILL follows after the grace
        self._warned = set()

    # Per task.

    def prepare(self, assignment):
        """TaskLimits for an assignment; LimitError when it cannot run here as asked."""
        isolation = assignment.isolation if assignment.isolation in ISOLATION_MODES else None
        if isolation is None:
            raise LimitError(f"unknown isolation {assignment.isolation!r}: use exclusive, shared or mps")
        gpus = [dict(g) for g in assignment.gpus]
        env, enforcement = {}, {}
        for grant in gpus:
            memory = _grant_number(grant, "memory_limit_bytes")
            compute = _grant_number(grant, "compute_percent")
            enforcement[grant["uuid"]] = {
                "memory_enforcement": "none: whole GPU" if memory is None else "watchdog (NVML per-process memory)",
                "compute_enforcement": "none: whole GPU" if compute is None else
                "reported, not throttled (no MPS): per-process SM utilisation is reported per worker",
            }
        if isolation == "mps":
            if len(gpus) != 1:
                raise LimitError(f"mps isolation needs exactly one GPU per task (got {len(gpus)}): "
                                 "there is one MPS control daemon per GPU")
            uuid = gpus[0]["uuid"]
            if self.mps is None:
                enforcement[uuid]["mps"] = "not enabled on this node (limits.mps_enabled = false): run as shared"
            else:
                self.mps.ensure(uuid)
                env.update(mps_client_env(self.mps_base, uuid, gpus[0]))
                if "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in env:
                    enforcement[uuid]["compute_enforcement"] = \
                        f"MPS: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={env['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE']}"
                if "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in env:
                    pinned = env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
                    enforcement[uuid]["memory_enforcement"] = \
                        f"MPS: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={pinned}, and the watchdog"
                enforcement[uuid]["mps"] = "client of the MPS control daemon of this GPU"
        name = f"task-{assignment.task_id}.{assignment.epoch}"
        cpus = getattr(assignment, "cpus", None)
        memory_bytes = getattr(assignment, "memory_bytes", None)
        path, host = self.cgroups.create(name, cpus=cpus, memory_bytes=memory_bytes)
        return TaskLimits(task_id=assignment.task_id, epoch=assignment.epoch, isolation=isolation, gpus=gpus,
                          env=env, cgroup=path, cgroup_rel=self.cgroups.relative(path), host=host,
                          gpu_enforcement=enforcement, tolerance_bytes=self.settings.memory_tolerance_bytes,
                          kill_grace_seconds=self.settings.kill_grace_seconds)

    def command(self, task_limits, argv):
        """The argv to spawn: through the cgroup shim when the task has a cgroup."""
        if task_limits is None or not task_limits.cgroup:
            return list(argv)
        return shim_command(task_limits.cgroup, argv)

    def release(self, task_limits):
        """After the task: remove its cgroup (the supervisor read its OOM kills before, if it failed).

        True when the cgroup is gone, which the kernel allows only once no process is left in it:
        nothing the task started still runs. False without a cgroup, or when one is left.
        """
        if task_limits is not None and task_limits.cgroup:
            return self.cgroups.remove(task_limits.cgroup)
        return False

    def close(self):
        """Stop the MPS daemons."""
        if self.mps is not None:
            self.mps.close()

    # The watchdog.

    def run(self, stop, beat=None):
        """Poll until `stop` is set; `beat(seconds)` promises the next poll to the systemd watchdog."""
        interval = min(self.settings.poll_seconds, MAX_POLL_SECONDS)
        log.info("limits watchdog: every %.2fs, tolerance %s, foreign processes: %s, MPS %s", interval,
                 _fmt_bytes(self.settings.memory_tolerance_bytes), self.settings.foreign_processes,
                 "enabled" if self.mps is not None else "disabled")
        while not stop.is_set():
            if beat is not None:
                beat(interval + 60)
            started = time.monotonic()
            try:
                self.poll_once()
            except Exception:  # one bad reading must not end enforcement for every task
                log.exception("limits watchdog: poll failed")
            if self.mps is not None:
                self.mps.supervise()
            stop.wait(max(0.0, interval - (time.monotonic() - started)))

    def poll_once(self):
        """One watchdog pass: read, map, sum, enforce, report. Returns the violations acted on."""
        readings = self.devices.gpu_processes() if self.devices is not None else {}
        workers = self.workers.all() if self.workers is not None else []
        with self._lock:
            self.polls += 1
            poll = self.polls
        keys = {}
        for worker in workers:
            key = TaskKey(worker.task_id, worker.epoch, worker.pgid, worker.cgroup)
            keys[key] = worker
        mapper = ProcessMapper(keys)
        me = os.getpid()
        usage = {w.task_id: {} for w in workers}  # task_id -> uuid -> {used, processes}
        foreign = []
        for uuid, reading in readings.items():
            if reading.get("error"):
                self._warn_once(("error", uuid), "limits: GPU %s: %s; memory limits on it cannot be enforced",
                                uuid, reading["error"])
            for proc in reading["processes"]:
                pid = proc["pid"]
                key = mapper.owner(pid) if pid != me else None
                entry = {"pid": pid, "used_memory_bytes": proc["used_memory_bytes"],
                         "sm_util_percent": reading["sm_util"].get(pid)}
                if key is None:
                    if pid != me and read_comm(pid) not in MPS_SERVER_COMMS:
                        foreign.append(dict(entry, gpu_uuid=uuid, command=read_command(pid),
                                            visible=os.path.exists(f"/proc/{pid}")))
                    continue
                slot = usage[key.task_id].setdefault(uuid, {"used_memory_bytes": 0, "sm_util_percent": None,
                                                            "processes": []})
                if proc["used_memory_bytes"] is None:
                    # NVML would not say (permissions, some vGPU/MIG setups): the sum is a lower bound.
                    slot["memory_unknown"] = True
                    self._warn_once(("unknown", pid), "limits: NVML does not report the memory of pid %d on GPU %s "
                                                      "(task %s): its memory limit cannot be enforced", pid, uuid,
                                    key.task_id)
                slot["used_memory_bytes"] += proc["used_memory_bytes"] or 0
                if entry["sm_util_percent"] is not None:
                    slot["sm_util_percent"] = (slot["sm_util_percent"] or 0) + entry["sm_util_percent"]
                slot["processes"].append(entry)
        acted = []
        for worker in workers:
            report, violation = self._assess(worker, usage[worker.task_id], readings, poll)
            worker.gpu_usage = report
            if violation is not None and worker.state == "running" and not worker.limit_violation:
                acted.append(self._stop(worker, violation, poll))
        self._handle_foreign(foreign)
        present = {(w.task_id, w.epoch) for w in workers}
        with self._lock:
            self.foreign = foreign
            for key in [k for k in self._within if k[:2] not in present]:
                del self._within[key]
        return acted

    def _warn_once(self, key, message, *args):
        if key in self._warned:
            return
        if len(self._warned) > 10000:
            self._warned.clear()
        self._warned.add(key)
        log.warning(message, *args)

    def _assess(self, worker, usage, readings, poll):
        """(per-GPU usage report, the violation to act on or None).

        When several apply, an unhealthy GPU comes first (the task is not at fault), then a GPU
        the task was not given, then memory over the limit.
        """
        granted = {g["uuid"]: g for g in worker.gpus}
        tolerance = self.settings.memory_tolerance_bytes
        report, found = {}, {}
        active = {uuid: sum(1 for p in r["processes"] if (r["sm_util"].get(p["pid"]) or 0) > 0)
                  for uuid, r in readings.items()}
        for uuid, grant in granted.items():
            slot = usage.get(uuid, {"used_memory_bytes": 0, "sm_util_percent": None, "processes": []})
            limit = _grant_number(grant, "memory_limit_bytes")
            share = _grant_number(grant, "compute_percent")
            used = slot["used_memory_bytes"]
            key = (worker.task_id, worker.epoch, uuid)
            over = limit is not None and used > limit + tolerance
            if not over:
                self._within[key] = poll
            mine = sum(1 for p in slot["processes"] if (p["sm_util_percent"] or 0) > 0)
            report[uuid] = dict(slot, memory_limit_bytes=limit, compute_percent=share, over_memory_limit=over,
                                over_compute_share=bool(share is not None and slot["sm_util_percent"] is not None
                                                        and slot["sm_util_percent"] > share
                                                        and active.get(uuid, 0) > mine))
            reading = readings.get(uuid)
            if reading is not None and reading.get("error"):
                report[uuid]["error"] = reading["error"]
            if reading is not None and not reading["healthy"] and REASON_UNHEALTHY not in found:
                found[REASON_UNHEALTHY] = {
                    "kind": REASON_UNHEALTHY, "gpu_uuid": uuid, "used": used, "limit": limit,
                    "reason": f"{REASON_UNHEALTHY}: GPU {uuid} is unhealthy: {reading['reason']}"}
            if over and REASON_MEMORY not in found:
                found[REASON_MEMORY] = {
                    "kind": REASON_MEMORY, "gpu_uuid": uuid, "used": used, "limit": limit,
                    "last_within_poll": self._within.get(key),
                    "reason": f"{REASON_MEMORY}: GPU {uuid} limit {_fmt_bytes(limit)} + tolerance "
                              f"{_fmt_bytes(tolerance)}, used {_fmt_bytes(used)}"}
        for uuid, slot in usage.items():
            if uuid in granted:
                continue
            report[uuid] = dict(slot, memory_limit_bytes=0, compute_percent=None, over_memory_limit=True,
                                not_assigned=True)
            if REASON_NOT_ASSIGNED not in found:
                pids = ", ".join(str(p["pid"]) for p in slot["processes"])
                found[REASON_NOT_ASSIGNED] = {
                    "kind": REASON_NOT_ASSIGNED, "gpu_uuid": uuid, "used": slot["used_memory_bytes"], "limit": 0,
                    "reason": f"{REASON_NOT_ASSIGNED}: GPU {uuid} is not assigned to the task (assigned: "
                              f"{', '.join(granted) or 'none'}); pid(s) {pids} use "
                              f"{_fmt_bytes(slot['used_memory_bytes'])} on it"}
        for kind in (REASON_UNHEALTHY, REASON_NOT_ASSIGNED, REASON_MEMORY):
            if kind in found:
                return report, found[kind]
        return report, None

    def _stop(self, worker, violation, poll):
        detection = dict(violation, task_id=worker.task_id, epoch=worker.epoch, poll=poll,
                         detected_monotonic=time.monotonic(), detected_at=time.time())
        worker.limit_violation = detection
        with self._lock:
            self.detections.append(detection)
        log.error("limits: task %s/%d stopped at poll %d (last within limit at poll %s): %s", worker.task_id,
                  worker.epoch, poll, violation.get("last_within_poll"), violation["reason"])
        if worker.stop is not None:
            worker.stop(violation["reason"], outcome="failed", grace=self.settings.kill_grace_seconds)
        return detection

    def _handle_foreign(self, foreign):
        """Report every foreign GPU process; with foreign_processes = "kill", SIGTERM then SIGKILL after the grace."""
        now = time.monotonic()
        seen = set()
        for entry in foreign:
            pid = entry["pid"]
            info = read_proc(pid)
            if self.settings.foreign_processes != "kill" or pid <= 1:
                entry["action"] = "reported"
                continue
            marked = self._killed_foreign.get(pid)
            if info is None:
                if marked is not None:
                    seen.add(pid)
                    entry["action"] = "killed: exited"
                elif os.path.exists(f"/proc/{pid}"):
                    entry["action"] = "exited: a zombie its parent has not reaped"
                else:
                    entry["action"] = "reported: not visible in this PID namespace, cannot be killed"
                continue
            seen.add(pid)
            if marked is None or marked[0] != info.start_ticks:
                log.warning("limits: foreign process %d (%s) uses %s on GPU %s; killing it "
                            "(limits.foreign_processes = \"kill\")", pid, entry["command"],
                            _fmt_bytes(entry["used_memory_bytes"] or 0), entry["gpu_uuid"])
                signal_pids([pid], signal.SIGTERM)
                self._killed_foreign[pid] = (info.start_ticks, now)
                entry["action"] = "killed: SIGTERM sent"
            elif now - marked[1] >= self.settings.kill_grace_seconds:
                signal_pids([pid], signal.SIGKILL)
                entry["action"] = "killed: SIGKILL sent"
            else:
                entry["action"] = "killed: SIGTERM sent"
        for pid in list(self._killed_foreign):
            if pid not in seen:
                del self._killed_foreign[pid]

    def report(self):
        """The node-level picture for the heartbeat's metrics and the local API."""
        with self._lock:
            foreign = [dict(e) for e in self.foreign]
            polls = self.polls
        out = {"polls": polls, "poll_seconds": min(self.settings.poll_seconds, MAX_POLL_SECONDS),
               "foreign_processes": foreign, "foreign_policy": self.settings.foreign_processes,
               "cgroups": {"path": self.cgroups.path, "controllers": sorted(self.cgroups.controllers),
                           "note": self.cgroups.why},
               "mps": self.mps.status() if self.mps is not None else "disabled"}
        return out

    def recent_detections(self):
        """The last violations acted on (newest last)."""
        with self._lock:
            return list(self.detections)
