"""Per-task cgroups (v2): the one module that writes cgroupfs.

A task's cgroup bounds its host CPU (cpu.max), memory (memory.max, no swap) and processes and
threads (pids.max) where the host has cgroup v2 with those controllers writable, and is the most
reliable way to find its processes: nothing a process does takes it out, short of root. Where no
cgroup can be made, `Cgroups.why` says why and the limits are reported "not enforced" (the pid
limit then falls back to RLIMIT_NPROC: agent/task/limits.py).
"""

import functools
import logging
import os
import signal
import subprocess
import time

from agent.procfs import cgroup_procs, cgroup_tree_pids, find_mount, read_bytes, signal_pids

log = logging.getLogger("agent.limits")  # the name operators filter on since before the split
CONTROLLERS = ("cpu", "memory", "pids")


def _read(path):
    data = read_bytes(path)
    return None if data is None else data.decode(errors="replace").strip()


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


class Cgroups:
    """Per-task cgroups under ``<cgroup2 mount>/<parent>``; `path` None where none can be made."""

    def __init__(self, parent="fleet-agent", mount=None):
        self.mount = mount if mount is not None else find_mount("cgroup2")
        self.parent = parent.strip("/")
        self.path = None
        self.controllers = set()
        self.why = ""
        if not self.parent:
            self.why = 'cgroups disabled by limits.cgroup_parent = ""'
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
        levels = (
            [self.mount]
            + [
                os.path.join(self.mount, *self.parent.split("/")[: i + 1])
                for i in range(len(self.parent.split("/")) - 1)
            ]
            + [path]
        )
        for level in levels:
            available = set((_read(os.path.join(level, "cgroup.controllers")) or "").split())
            for name in CONTROLLERS:
                if name in available:
                    try:
                        _write(os.path.join(level, "cgroup.subtree_control"), f"+{name}")
                    except OSError as exc:
                        log.info(
                            "cgroup v2: cannot enable %s below %s: %s",
                            name,
                            level,
                            exc.strerror or exc,
                        )
        enabled = set((_read(os.path.join(path, "cgroup.subtree_control")) or "").split())
        self.controllers = enabled & set(CONTROLLERS)
        if self.controllers != set(CONTROLLERS):
            missing = sorted(set(CONTROLLERS) - self.controllers)
            self.why = (
                f"cgroup v2 controller(s) {', '.join(missing)} not available at {self.mount} "
                f"(available: {_read(os.path.join(self.mount, 'cgroup.controllers')) or 'none'})"
            )
        log.info(
            "cgroup v2 at %s: task cgroups under %s, controllers %s",
            self.mount,
            path,
            ", ".join(sorted(self.controllers))
            or "none (processes are tracked, host limits not enforced)",
        )

    def relative(self, path):
        """The form /proc/<pid>/cgroup shows for `path`."""
        return "/" + os.path.relpath(path, self.mount) if path else None

    def create(self, name, cpus=None, memory_bytes=None, shared=False, pids=None):
        """(cgroup path or None, host-limits record) for one task; never raises. Unless `shared`, a
        cgroup of that name that already holds processes is refused (see below)."""
        record = {
            "cpus": {"limit": cpus, "enforced": False, "how": None},
            "memory_bytes": {"limit": memory_bytes, "enforced": False, "how": None},
            "pids": {"limit": pids, "enforced": False, "how": None},
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
                # Left by this agent before a crash (made, never used) it is empty and ours again.
                # With processes in it, it is someone else's: another agent on this host with the
                # same limits.cgroup_parent, given the same task id. Sharing it would let either
                # task's end kill the other, so the task runs without one.
                if not shared and cgroup_tree_pids(path):
                    raise OSError(
                        f"it already holds processes (does another agent on this host use "
                        f"limits.cgroup_parent = {self.parent!r}?)"
                    ) from None
            except FileNotFoundError:  # the parent went (an operator removed it): made again
                os.makedirs(path, exist_ok=True)
        except OSError as exc:
            log.warning("task cgroup %s not used: %s", path, exc.strerror or exc)
            for item in record.values():
                item["how"] = (
                    f"not enforced: cannot create {path}: {exc.strerror or exc}"
                    if item["limit"]
                    else "no limit"
                )
            return None, record
        settings = {
            "cpus": ("cpu", "cpu.max", lambda v: f"{max(1000, int(v * 100000))} 100000"),
            "memory_bytes": ("memory", "memory.max", lambda v: str(int(v))),
            "pids": ("pids", "pids.max", lambda v: str(int(v))),
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
    def oom_kills(path):
        """The memory controller's oom_kill count of a cgroup, or 0."""
        text = _read(os.path.join(path, "memory.events")) if path else None
        for line in (text or "").splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.isdigit():
                return int(value)
        return 0

    @staticmethod
    def move(pid, path):
        """Move a process into a cgroup (OSError when it cannot be)."""
        _write(os.path.join(path, "cgroup.procs"), str(pid))

    @staticmethod
    def kill(path):
        """SIGKILL everything in a cgroup (cgroup.kill where the kernel has it)."""
        if not path:
            return
        try:
            _write(os.path.join(path, "cgroup.kill"), "1")
            return
        except OSError:
            pass
        signal_pids(cgroup_procs(path), signal.SIGKILL)

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


def shim_command(cgroup_path, argv, status_path=None, nproc=None):
    """The command that first moves itself into the task cgroup (where there is one), then execs the
    task (same pid); with `status_path`, runs it instead as a child and writes its exit status
    there.

    That shell is root's and outlives an agent that dies, so the task cannot forge its outcome and
    the outcome is on disk for the agent's next start. It catches SIGTERM (a caught signal is the
    default again in the task, which gets its own SIGTERM as one of the group), so a stop ends with
    how the task ended. One shell for both: an exec less per task.

    `nproc`: (the shell's ulimit flag, limit): the shell sets RLIMIT_NPROC for what it starts (root,
    it is not bound itself; the task, once setpriv switched its uid, is, and cannot raise it).
    """
    procs = os.path.join(cgroup_path, "cgroup.procs") if cgroup_path else ""
    limit = "" if nproc is None else f"ulimit {nproc[0]} {int(nproc[1])} || exit 126; "
    if status_path is None:
        return [
            "/bin/sh",
            "-c",
            limit + 'echo 0 > "$0" || exit 126; exec "$@"' if procs else limit + 'exec "$@"',
            procs,
            *argv,
        ]
    script = (
        limit + '[ -z "$0" ] || echo 0 > "$0" || exit 126; s="$1"; shift; trap : TERM; "$@"; r=$?; '
        'echo "$r" > "$s"; exit "$r"'
    )
    return ["/bin/sh", "-c", script, procs, status_path, *argv]


@functools.lru_cache(maxsize=8)
def shell_nproc_flag(shell="/bin/sh"):
    """The flag of `shell`'s ulimit that sets RLIMIT_NPROC (bash and busybox: -u; dash: -p), or None
    when it has none (the agent then execs prlimit for it). Asked once per shell and process."""
    for flag, says in (("-u", None), ("-p", "process")):
        try:
            done = subprocess.run(
                [shell, "-c", f"ulimit {flag} && ulimit -a"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode == 0 and (
            says is None or any(line.startswith(says) for line in done.stdout.splitlines())
        ):
            return flag
    return None
