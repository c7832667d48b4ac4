"""Dynamic MIG on the node (issue 50): the target layouts fleetd sends on a heartbeat answer
(`mig_layouts`, fleetwire.mig.MigLayout) applied to their GPUs through agent/nvml.py, and what came
of each (`mig_events`, MigEvent) kept until a heartbeat carrying it is answered.

Applying one layout: if a task of this node holds any MIG device of the GPU, nothing is touched
and the result says `busy` (fleetd placed nothing there since it planned, so this is a last guard);
if the GPU already has the layout, nothing changes; else every GPU instance of the GPU is destroyed
(compute instance first) and the layout's instances are made at their placements, each with one
compute instance over all its slices. An NVML error stops there and is reported (fleetd blocks
that GPU); the devices are read anew either way, so the next heartbeat reports what is left.
MIG mode itself is never switched (that takes a GPU reset).
"""

from __future__ import annotations

import collections
import logging
import threading

from agent.nvml import (
    DeviceError,
    create_gpu_instance,
    destroy_gpu_instance,
    existing_gpu_instances,
)
from fleetwire.mig import MigEvent, MigLayout

log = logging.getLogger("agent.mig")

# NVML's GPU instance profile (the name after NVML_GPU_INSTANCE_PROFILE_) of (compute slices,
# memory slots); the two-slot 1g is REV2.
NVML_PROFILES = {
    (1, 1): "1_SLICE",
    (1, 2): "1_SLICE_REV2",
    (2, 2): "2_SLICE",
    (3, 4): "3_SLICE",
    (4, 4): "4_SLICE",
    (7, 8): "7_SLICE",
}
REMEMBERED_PLANS = 256  # plans applied lately: a target repeated by fleetd is applied once


def compute_of(profile):
    """The compute slices of a profile name (`3g.40gb`: 3)."""
    return int(profile.split("g.", 1)[0])


def held_mig_devices(workers, runner):
    """The MIG devices tasks of this node hold: those of its workers and of the assignments its
    runner took and has not started yet."""
    held = {g.get("mig_device") for w in workers.all() for g in w.gpus}
    if runner is not None:
        held |= {g.get("mig_device") for t in runner.tasks() for g in t.assignment.gpus}
    held.discard(None)
    return held


def apply_layout(nvml, handle, layout: MigLayout, held) -> MigEvent:
    """Make GPU `handle`'s MIG instances `layout`'s (see the module's text); the result."""

    def result(ok, detail="", busy=False):
        return MigEvent(layout.gpu_uuid, layout.plan, ok, detail, busy)

    readings = nvml.properties(handle)["mig_devices"]
    busy = sorted(r["uuid"] for r in readings if r.get("uuid") in held)
    if busy:
        return result(False, f"a task on this node holds {', '.join(busy)}", busy=True)
    want = sorted((i.start, i.size, compute_of(i.profile)) for i in layout.instances)
    have = sorted((r.get("start"), r.get("size"), r.get("compute")) for r in readings)
    if want == have:
        return result(True, "the GPU had the layout already")
    step = "reading its GPU instances"
    try:
        for instance in existing_gpu_instances(nvml, handle):
            step = f"destroying GPU instance {instance.id}"
            destroy_gpu_instance(nvml, instance)
        for i in layout.instances:
            step = f"creating {i.profile} at slot {i.start}"
            name = NVML_PROFILES.get((compute_of(i.profile), i.size))
            if name is None:
                raise DeviceError(f"no NVML GPU instance profile of {i.profile} ({i.size} slots)")
            create_gpu_instance(nvml, handle, name, i.start, i.size)
    except DeviceError as exc:
        return result(False, f"{step}: {exc}")
    return result(True)


class MigChanges:
    """Applies the layouts of heartbeat answers, each plan once, and keeps the results to send."""

    def __init__(self, devices, held):
        self.devices = devices  # agent.devices.DeviceManager
        self.held = held  # () -> the MIG device uuids tasks hold now
        self._lock = threading.Lock()
        self._results: dict[str, MigEvent] = {}  # plan -> result not yet taken by fleetd
        self._applied: collections.deque[str] = collections.deque(maxlen=REMEMBERED_PLANS)

    def follow(self, layouts):
        """Apply each layout not applied before (in the heartbeat's thread: a few NVML calls per
        instance)."""
        for layout in layouts:
            with self._lock:
                if layout.plan in self._applied:
                    continue
            try:
                held = self.held()
                event = self.devices.change_mig(
                    layout.gpu_uuid, lambda nvml, handle: apply_layout(nvml, handle, layout, held)
                )
            except DeviceError as exc:
                event = MigEvent(layout.gpu_uuid, layout.plan, False, str(exc))
            (log.info if event.ok or event.busy else log.error)(
                "MIG layout %s on GPU %s: %s%s",
                layout.plan,
                layout.gpu_uuid,
                "applied" if event.ok else ("left as it was" if event.busy else "failed"),
                f" ({event.detail})" if event.detail else "",
            )
            with self._lock:
                self._applied.append(layout.plan)
                self._results[layout.plan] = event

    def events(self):
        """The results to send with the next heartbeat."""
        with self._lock:
            return tuple(self._results.values())

    def sent(self, events):
        """A heartbeat carrying these was answered: fleetd has them."""
        with self._lock:
            for event in events:
                self._results.pop(event.plan, None)
