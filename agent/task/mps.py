"""MPS: one control daemon per GPU for `mps` tasks, and the variables that make a task its
client."""

import logging
import os
import shutil
import signal
import subprocess
import threading
import time

from agent.procfs import signal_group
from agent.task.errors import LimitError

log = logging.getLogger("agent.limits")

MIB = 1024 * 1024


def mps_dirs(base, uuid):
    """(pipe directory, log directory) of the MPS control daemon of one GPU."""
    root = os.path.join(base, uuid)
    return os.path.join(root, "pipe"), os.path.join(root, "log")


def mps_daemon_command(control, base, uuid, environ=None):
    """(argv, env) of the foreground MPS control daemon for one GPU, and the env of `quit`."""
    pipe, logs = mps_dirs(base, uuid)
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in ("PATH", "LANG", "LC_ALL", "HOME") if k in environ}
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": pipe,
            "CUDA_MPS_LOG_DIRECTORY": logs,
        }
    )
    return [control, "-f"], env


def mps_client_env(base, uuid, grant):
    """The variables an MPS client task gets for its one GPU (device 0 of what it sees)."""
    pipe, logs = mps_dirs(base, uuid)
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logs}
    if grant.get("compute_percent"):
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(
            max(1, min(100, int(round(float(grant["compute_percent"])))))
        )
    if grant.get("memory_limit_bytes"):
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = (
            f"0={max(1, int(grant['memory_limit_bytes']) // MIB)}M"
        )
    return env


class MpsSupervisor:
    """One MPS control daemon per GPU, started on first use, restarted when it dies, quit on
    close."""

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
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise LimitError(f"mps: cannot start {argv[0]}: {exc.strerror or exc}") from None
        starts = (entry or {}).get("starts", 0) + 1
        self._daemons[uuid] = {
            "proc": proc,
            "starts": starts,
            "next_start": None,
            "argv": argv,
            "env": env,
        }
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
                    log.error(
                        "mps: control daemon for gpu %s exited (%s); restarting in %.1fs",
                        uuid,
                        code,
                        delay,
                    )
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
            return {
                uuid: {
                    "pid": e["proc"].pid if e["proc"] else None,
                    "running": e["proc"] is not None and e["proc"].poll() is None,
                    "starts": e["starts"],
                    "argv": e["argv"],
                    "env": e["env"],
                }
                for uuid, e in self._daemons.items()
            }

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
                subprocess.run(
                    [entry["argv"][0]],
                    input=b"quit\n",
                    env=entry["env"],
                    timeout=timeout,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("mps: quit for gpu %s failed: %s", uuid, exc)
            for sig, wait in (
                (None, timeout),
                (signal.SIGTERM, timeout),
                (signal.SIGKILL, timeout),
            ):
                if sig is not None:
                    signal_group(proc.pid, sig)
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            log.info("mps: control daemon for gpu %s stopped", uuid)
