"""The VRAM watchdog: every poll, NVML's GPU processes mapped to tasks, summed, checked, acted on.

A task over its GPU memory limit (plus the tolerance), on a GPU it was not given, or on a GPU
that became unhealthy is stopped; GPU processes of no task are reported, or killed with
limits.foreign_processes = "kill". Restarts MPS daemons that died between polls.
"""

import collections
import logging
import os
import signal
import threading
import time

from agent.procfs import (
    ProcessMapper,
    TaskKey,
    is_visible,
    read_comm,
    read_command,
    read_proc,
    signal_pids,
)
from agent.task.mps import MIB

log = logging.getLogger("agent.limits")

REASON_MEMORY = "gpu_memory_limit_exceeded"
REASON_NOT_ASSIGNED = "gpu_not_assigned"
REASON_UNHEALTHY = "gpu_unhealthy"
MAX_POLL_SECONDS = 0.5
MPS_SERVER_COMMS = ("nvidia-cuda-mps", "nvidia-cuda-mps-server", "nvidia-cuda-mps-control")
DETECTIONS_KEPT = 200


def _fmt_bytes(n):
    return f"{n} bytes ({n / MIB:.1f} MiB)"


def grant_number(grant, key):
    """A positive number from a GPU grant, or None."""
    value = grant.get(key)
    if (
        value is None
        or isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value <= 0
    ):
        return None
    return value


def hardware_limits(grant):
    """(None, None) for a grant of a MIG device (the GPU's hardware isolates it: no memory limit or
    compute share to watch, whatever the grant says), else None."""
    return (None, None) if grant.get("mig_device") else None


class Watchdog:
    """Polls the GPUs' processes and stops the tasks over their limits."""

    def __init__(self, settings, devices, workers, mps=None):
        self.settings = settings
        self.devices = devices
        self.workers = workers
        self.mps = mps
        self._lock = threading.Lock()
        self.polls = 0
        self.foreign = []  # the last poll's GPU processes that belong to no task
        self.detections: collections.deque[dict] = collections.deque(maxlen=DETECTIONS_KEPT)
        # (task_id, epoch, uuid) -> last poll number at which usage was within the limit
        self._within = {}
        # pid -> (start ticks, SIGTERM time): SIGKILL follows after the grace
        self._killed_foreign = {}
        self._warned = set()

    def run(self, stop, beat=None):
        """Poll until `stop` is set; `beat(seconds)` promises the next poll to the systemd
        watchdog."""
        interval = min(self.settings.poll_seconds, MAX_POLL_SECONDS)
        log.info(
            "limits watchdog: every %.2fs, tolerance %s, foreign processes: %s, MPS %s",
            interval,
            _fmt_bytes(self.settings.memory_tolerance_bytes),
            self.settings.foreign_processes,
            "enabled" if self.mps is not None else "disabled",
        )
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
            task_key = TaskKey(
                worker.task_id,
                worker.epoch,
                worker.pgid,
                worker.cgroup,
                uid=(worker.run_as or {}).get("uid"),
            )
            keys[task_key] = worker
        mapper = ProcessMapper(keys)
        me = os.getpid()
        usage: dict[str, dict[str, dict]] = {
            w.task_id: {} for w in workers
        }  # task_id -> uuid -> {used, processes}
        foreign: list[dict] = []
        for uuid, reading in readings.items():
            if reading.get("error"):
                self._warn_once(
                    ("error", uuid),
                    "limits: GPU %s: %s; memory limits on it cannot be enforced",
                    uuid,
                    reading["error"],
                )
            for proc in reading["processes"]:
                pid = proc["pid"]
                key = mapper.owner(pid) if pid != me else None
                entry = {
                    "pid": pid,
                    "used_memory_bytes": proc["used_memory_bytes"],
                    "sm_util_percent": reading["sm_util"].get(pid),
                }
                if key is None:
                    if pid != me and read_comm(pid) not in MPS_SERVER_COMMS:
                        foreign.append(
                            dict(
                                entry,
                                gpu_uuid=uuid,
                                command=read_command(pid),
                                visible=is_visible(pid),
                            )
                        )
                    continue
                slot = usage[key.task_id].setdefault(
                    uuid, {"used_memory_bytes": 0, "sm_util_percent": None, "processes": []}
                )
                if proc["used_memory_bytes"] is None:
                    # NVML would not say (permissions, some vGPU/MIG setups): the sum is a lower
                    # bound.
                    slot["memory_unknown"] = True
                    self._warn_once(
                        ("unknown", pid),
                        "limits: NVML does not report the memory of pid %d on GPU %s "
                        "(task %s): its memory limit cannot be enforced",
                        pid,
                        uuid,
                        key.task_id,
                    )
                slot["used_memory_bytes"] += proc["used_memory_bytes"] or 0
                if entry["sm_util_percent"] is not None:
                    slot["sm_util_percent"] = (slot["sm_util_percent"] or 0) + entry[
                        "sm_util_percent"
                    ]
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
        active = {
            uuid: sum(1 for p in r["processes"] if (r["sm_util"].get(p["pid"]) or 0) > 0)
            for uuid, r in readings.items()
        }
        for uuid, grant in granted.items():
            slot = usage.get(
                uuid, {"used_memory_bytes": 0, "sm_util_percent": None, "processes": []}
            )
            # A MIG device is isolated by the hardware: its processes show on its parent GPU, whose
            # memory it does not share, and no software limit applies (hardware_limits).
            limit, share = hardware_limits(grant) or (
                grant_number(grant, "memory_limit_bytes"),
                grant_number(grant, "compute_percent"),
            )
            used = slot["used_memory_bytes"]
            key = (worker.task_id, worker.epoch, uuid)
            over = limit is not None and used > limit + tolerance
            if not over:
                self._within[key] = poll
            mine = sum(1 for p in slot["processes"] if (p["sm_util_percent"] or 0) > 0)
            report[uuid] = dict(
                slot,
                memory_limit_bytes=limit,
                compute_percent=share,
                over_memory_limit=over,
                over_compute_share=bool(
                    share is not None
                    and slot["sm_util_percent"] is not None
                    and slot["sm_util_percent"] > share
                    and active.get(uuid, 0) > mine
                ),
            )
            reading = readings.get(uuid)
            if reading is not None and reading.get("error"):
                report[uuid]["error"] = reading["error"]
            if reading is not None and not reading["healthy"] and REASON_UNHEALTHY not in found:
                found[REASON_UNHEALTHY] = {
                    "kind": REASON_UNHEALTHY,
                    "gpu_uuid": uuid,
                    "used": used,
                    "limit": limit,
                    "reason": f"{REASON_UNHEALTHY}: GPU {uuid} is unhealthy: {reading['reason']}",
                }
            if over and REASON_MEMORY not in found:
                found[REASON_MEMORY] = {
                    "kind": REASON_MEMORY,
                    "gpu_uuid": uuid,
                    "used": used,
                    "limit": limit,
                    "last_within_poll": self._within.get(key),
                    "reason": f"{REASON_MEMORY}: GPU {uuid} limit {_fmt_bytes(limit)} + tolerance "
                    f"{_fmt_bytes(tolerance)}, used {_fmt_bytes(used)}",
                }
        for uuid, slot in usage.items():
            if uuid in granted:
                continue
            report[uuid] = dict(
                slot,
                memory_limit_bytes=0,
                compute_percent=None,
                over_memory_limit=True,
                not_assigned=True,
            )
            if REASON_NOT_ASSIGNED not in found:
                pids = ", ".join(str(p["pid"]) for p in slot["processes"])
                found[REASON_NOT_ASSIGNED] = {
                    "kind": REASON_NOT_ASSIGNED,
                    "gpu_uuid": uuid,
                    "used": slot["used_memory_bytes"],
                    "limit": 0,
                    "reason": (
                        f"{REASON_NOT_ASSIGNED}: GPU {uuid} is not assigned to the task (assigned: "
                        f"{', '.join(granted) or 'none'}); pid(s) {pids} use "
                        f"{_fmt_bytes(slot['used_memory_bytes'])} on it"
                    ),
                }
        for kind in (REASON_UNHEALTHY, REASON_NOT_ASSIGNED, REASON_MEMORY):
            if kind in found:
                return report, found[kind]
        return report, None

    def _stop(self, worker, violation, poll):
        detection = dict(
            violation,
            task_id=worker.task_id,
            epoch=worker.epoch,
            poll=poll,
            detected_monotonic=time.monotonic(),
            detected_at=time.time(),
        )
        worker.limit_violation = detection
        with self._lock:
            self.detections.append(detection)
        log.error(
            "limits: task %s/%d stopped at poll %d (last within limit at poll %s): %s",
            worker.task_id,
            worker.epoch,
            poll,
            violation.get("last_within_poll"),
            violation["reason"],
        )
        if worker.stop is not None:
            worker.stop(
                violation["reason"], outcome="failed", grace=self.settings.kill_grace_seconds
            )
        return detection

    def _handle_foreign(self, foreign):
        """Report every foreign GPU process; with foreign_processes = "kill", SIGTERM then SIGKILL
        after the grace."""
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
                elif is_visible(pid):
                    entry["action"] = "exited: a zombie its parent has not reaped"
                else:
                    entry["action"] = (
                        "reported: not visible in this PID namespace, cannot be killed"
                    )
                continue
            seen.add(pid)
            if marked is None or marked[0] != info.start_ticks:
                log.warning(
                    "limits: foreign process %d (%s) uses %s on GPU %s; killing it "
                    '(limits.foreign_processes = "kill")',
                    pid,
                    entry["command"],
                    _fmt_bytes(entry["used_memory_bytes"] or 0),
                    entry["gpu_uuid"],
                )
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

    def last_poll(self):
        """(number of polls so far, the last poll's foreign GPU processes)."""
        with self._lock:
            return self.polls, [dict(e) for e in self.foreign]

    def recent_detections(self):
        """The last violations acted on (newest last)."""
        with self._lock:
            return list(self.detections)
