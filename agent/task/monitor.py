"""What the heartbeat says of a running instance, and its idle stop.

Read on a thread of the instance's own, never on the heartbeat's: the process tree's CPU and
memory from /proc every few seconds (a container's from `<runtime> stats --no-stream` every ten),
whose listener each host port has every few seconds (agent/ports.py port_states: a port reads
"ok" only while the instance's own processes, or its runtime's forwarder, hold it), the volume's
size every thirty (a walk of it), and each second the GPUs' utilisation from the device poller's
last reading, which the idle stop watches. Until a container exists it also looks each second
whether its env file can go.
"""

import os
import threading
import time

from agent.procfs import read_memory_total, read_usage
from agent.threads import UNTIL_STOPPED

TICK_SECONDS = 1.0
PROCESS_EVERY_SECONDS = 5.0
CONTAINER_EVERY_SECONDS = 10.0
PORTS_EVERY_SECONDS = 5.0
PORT_UNKNOWN = "unknown"  # before the first look
VOLUME_EVERY_SECONDS = 30.0
SCRATCH_EVERY_SECONDS = (
    10.0  # a run over its scratch size is stopped within this (and a walk's time)
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class IdleWatch:
    """Idle once every GPU reads below `threshold` percent for `seconds` in a row."""

    def __init__(self, threshold, seconds):
        self.threshold = threshold
        self.seconds = seconds
        self.since = None  # monotonic time since which every reading was below

    def reset(self):
        """Start counting again (a new process)."""
        self.since = None

    def observe(self, now, utils):
        """One reading per GPU (None: unknown, which is not idle); True once idle long enough."""
        if not utils or any(u is None or u >= self.threshold for u in utils):
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.seconds

    def reason(self):
        """The finish reason of an idle stop."""
        return (
            f"idle: GPU utilisation below {self.threshold:g}% on every GPU for {self.seconds:g}s; "
            "stopped by fleet-agent"
        )


class ProcessUsage:
    """CPU and memory percent of a set of processes, from /proc readings some seconds apart."""

    def __init__(self):
        self._last = None  # (monotonic, {pid: CPU ticks})

    def reset(self):
        """Forget the last reading (another process)."""
        self._last = None

    def sample(self, pids, now):
        """(CPU percent since the last sample or None on the first, memory percent of the
        host's)."""
        ticks, rss = {}, 0
        for pid in pids:
            usage = read_usage(pid)
            if usage is not None:
                ticks[pid], rss = usage[0], rss + usage[1]
        cpu = None
        if self._last is not None and now > self._last[0]:
            before = self._last[1]
            used = sum(max(0, t - before.get(pid, 0)) for pid, t in ticks.items())
            cpu = round(100.0 * used / CLOCK_TICKS / (now - self._last[0]), 2)
        self._last = (now, ticks)
        total = read_memory_total()
        return cpu, round(100.0 * rss / total, 3) if total else None


class InstanceMonitor:
    """The figures of one instance task, refreshed on its own thread until stop()."""

    def __init__(self, task):
        self.task = task
        spec = task.spec
        self.idle = (
            IdleWatch(spec.idle_below_percent, spec.idle_for_seconds)
            if spec.idle_below_percent is not None and task.assignment.gpus
            else None
        )
        self.cpu_percent = None
        self.memory_percent = None
        self.volume_used_bytes = None
        # host port -> state (agent/ports.py), from the last look (task.check_ports)
        self.port_states = {}
        self._usage = ProcessUsage()
        self.scratch_used_bytes = None
        self._due = {"process": 0.0, "volume": 0.0, "ports": 0.0, "scratch": 0.0}
        self._stop = threading.Event()
        self._job = None

    def start(self):
        """Refresh on one of the runner's threads (once)."""
        if self._job is None:
            self._job = self.task.runner.threads.run(self._run, name=f"monitor-{self.task.label}")

    def stop(self):
        """End the refreshing thread."""
        self._stop.set()

    def run_started(self):
        """A new process runs: its idle time and CPU count from now."""
        if self.idle is not None:
            self.idle.reset()
        self._usage.reset()
        self._due["process"] = self._due["ports"] = 0.0

    def _run(self):
        for _ in range(UNTIL_STOPPED):
            self.tick(time.monotonic())
            if self._stop.wait(TICK_SECONDS):
                return

    def tick(self, now):
        """One look: the idle watch, and the figures that are due."""
        task = self.task
        running = task.running()
        if task.container:
            task.settle_env_file()
        if running and self.idle is not None:
            if self.idle.observe(now, [g["gpu_util_percent"] for g in self.gpus()]):
                task.stop_idle(self.idle.reason())
        if running and now >= self._due["process"]:
            self._due["process"] = now + (
                CONTAINER_EVERY_SECONDS if task.container else PROCESS_EVERY_SECONDS
            )
            self._sample(now)
        if now >= self._due["ports"]:
            self._due["ports"] = now + PORTS_EVERY_SECONDS
            task.check_ports()  # sets port_states
        if now >= self._due["volume"]:
            self._due["volume"] = now + VOLUME_EVERY_SECONDS
            self.volume_used_bytes = task.runner.volumes.used_bytes(task.spec.id)
        if running and task.spec.scratch_bytes and now >= self._due["scratch"]:
            self._due["scratch"] = now + SCRATCH_EVERY_SECONDS
            self.scratch_used_bytes = task.check_scratch()

    def _sample(self, now):
        task = self.task
        if task.container:
            figures = task.container_stats()
            self.cpu_percent, self.memory_percent = figures if figures is not None else (None, None)
        else:
            self.cpu_percent, self.memory_percent = self._usage.sample(task.pids(), now)

    def gpus(self):
        """[{uuid, gpu_util_percent, memory_util_percent}] of the task's GPUs, from the device
        poller."""
        devices = getattr(self.task.runner.limits, "devices", None)
        inventory = devices.inventory if devices is not None else None
        out = []
        for grant in self.task.assignment.gpus:
            device = inventory.find(grant["uuid"]) if inventory is not None else None
            out.append(
                {
                    "uuid": grant["uuid"],
                    "gpu_util_percent": device.utilization_percent if device else None,
                    "memory_util_percent": device.memory_utilization_percent if device else None,
                }
            )
        return out

    def figures(self):
        """The heartbeat's `instances` entry of this task."""
        task = self.task
        return {
            "task_id": task.assignment.task_id,
            "epoch": task.assignment.epoch,
            "uptime_seconds": task.uptime_seconds(),
            "restarts": task.restarts,
            "gpus": self.gpus(),
            "container": {"cpu_percent": self.cpu_percent, "memory_percent": self.memory_percent},
            "volume_used_bytes": self.volume_used_bytes,
            "ports": [
                {
                    "port": port,
                    "host_port": host_port,
                    "state": self.port_states.get(host_port, PORT_UNKNOWN),
                }
                for port, host_port in sorted(task.ports.items())
            ],
        }
