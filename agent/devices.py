"""GPU discovery and health: NVML readings in, dataclasses out.

`Gpu` is exactly the wire format of the agent protocol (register and heartbeat `gpus`);
`Device` adds the details that only the local API and `fleet-agent devices` show.

max_tflops is the peak dense FP16/BF16 tensor-core throughput at the maximum SM clock:
``sm_count x max_sm_clock x dense FP16 FLOP per clock per SM`` for the architecture, with
``sm_count = cuda_cores / cores per SM``. It is an upper bound meant for ranking GPUs
(datasheets quote a lower boost clock: an H100 SXM reads 1070 here, 989 on the datasheet;
an A100 312; an L4 121). Unknown architectures, or GPUs that do not report their cores or
clock, get None.
"""

import dataclasses
import datetime as dt
import logging
import threading
import time

from agent.nvml import DeviceError, Nvml, NvmlUnavailable, load_backend, start_xid_thread
from agent.topology import read_topology
from fleetwire.mig import MIG_UUID, MigDevice, profile_at

log = logging.getLogger("agent.devices")

# (major, minor) -> (CUDA cores per SM, dense FP16 tensor FLOP per clock per SM).
ARCHITECTURES = {
    (7, 0): (64, 1024),  # Volta V100
    (7, 2): (64, 1024),  # Xavier
    (7, 5): (64, 1024),  # Turing T4
    (8, 0): (64, 2048),  # Ampere A100, A30
    (8, 6): (128, 1024),  # Ampere A10, A40, RTX A6000
    (8, 7): (128, 1024),  # Orin
    (8, 9): (128, 1024),  # Ada L4, L40S
    (9, 0): (128, 4096),  # Hopper H100, H200
    (10, 0): (128, 8192),  # Blackwell B200
    (10, 3): (128, 8192),  # Blackwell B300
    (12, 0): (128, 1024),  # Blackwell RTX
}

# XIDs caused by the application rather than the GPU (the list NVIDIA's Kubernetes device
# plugin also skips); every other critical XID marks the GPU unhealthy until the agent
# restarts, because they need a reset or a reboot to clear.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

HEALTH_REASON_MAX = 500


def max_tflops(compute_capability, cuda_cores, max_sm_clock_mhz):
    """Peak dense FP16 tensor TFLOPS, or None when the architecture or a reading is unknown."""
    if not (compute_capability and cuda_cores and max_sm_clock_mhz):
        return None
    arch = ARCHITECTURES.get(tuple(compute_capability))
    if arch is None:
        return None
    cores_per_sm, flop_per_clock = arch
    sm_count = cuda_cores // cores_per_sm
    return round(sm_count * max_sm_clock_mhz * 1e6 * flop_per_clock / 1e12, 1)


def sm_count(compute_capability, cuda_cores):
    """Streaming multiprocessors, derived from the CUDA core count."""
    arch = ARCHITECTURES.get(tuple(compute_capability)) if compute_capability else None
    if arch is None or not cuda_cores:
        return None
    return cuda_cores // arch[0]


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as the agent protocol carries it (register and heartbeat)."""

    uuid: str
    index: int
    vendor: str
    model: str
    memory_total_bytes: int
    numa_node: int | None
    max_tflops: float | None
    healthy: bool
    health_reason: str
    mig_mode: str | None
    serial: str | None = None  # the board's: its history in fleetd follows it across hosts
    board_part_number: str | None = None
    vbios: str | None = None
    xids: tuple = ()  # critical XIDs seen since the agent started
    ecc_uncorrected: int | None = None  # uncorrectable ECC errors since the driver loaded
    mig_devices: tuple[MigDevice, ...] = ()  # with MIG enabled: its slices, profile and placement

    def to_wire(self):
        """The dict sent to fleetd: exactly the keys the server accepts."""
        out = dataclasses.asdict(self)
        out["xids"] = list(self.xids)
        out["mig_devices"] = [device.to_wire() for device in self.mig_devices]
        return out


@dataclasses.dataclass
class Device:
    """A GPU with the details and live readings shown locally."""

    gpu: Gpu
    pci_bus_id: str | None = None
    compute_capability: str | None = None
    sm_count: int | None = None
    max_sm_clock_mhz: int | None = None
    memory_used_bytes: int | None = None
    utilization_percent: int | None = None
    memory_utilization_percent: int | None = None  # NVML's memory (bandwidth) utilisation
    temperature_c: int | None = None
    slowdown_temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    processes: list | None = None
    mig_devices: list = dataclasses.field(default_factory=list)
    health: dict = dataclasses.field(default_factory=dict)
    xids: list = dataclasses.field(default_factory=list)

    def to_dict(self):
        """Gpu fields plus details, flat, for the local API."""
        out = self.gpu.to_wire()
        out.update(
            {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "gpu"}
        )
        return out


@dataclasses.dataclass
class Inventory:
    """What one discovery or poll saw."""

    backend: str
    devices: list
    driver_version: str | None = None
    cuda_version: str | None = None
    reason: str = ""  # why there are no GPUs (no driver), empty otherwise
    discovered_at: str = ""
    # {gpus, links, nvlink_count, nics} as registration reports it (agent.topology), read once per
    # discovery; None when it could not be read
    topology: dict | None = None

    def wire_gpus(self):
        """The `gpus` list for register and heartbeat."""
        return [d.gpu.to_wire() for d in self.devices]

    def find(self, uuid):
        """The Device with this uuid, or None."""
        return next((d for d in self.devices if d.gpu.uuid == uuid), None)

    def to_dict(self):
        """The whole inventory as plain data."""
        return {
            "backend": self.backend,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "reason": self.reason,
            "discovered_at": self.discovered_at,
            "gpus": [d.to_dict() for d in self.devices],
            "topology": self.topology,
        }

    def metrics(self):
        """Live readings for the heartbeat's free-form `metrics`."""
        out: dict[str, object] = {
            "gpus": {
                d.gpu.uuid: {
                    "memory_used_bytes": d.memory_used_bytes,
                    "utilization_percent": d.utilization_percent,
                    "temperature_c": d.temperature_c,
                    "power_w": d.power_w,
                }
                for d in self.devices
            }
        }
        if self.reason:
            out["devices_reason"] = self.reason
        return out


def mig_devices(ident, readings):
    """The MIG devices of a GPU (its identity: name and memory) as the wire carries them, from
    Nvml.properties' readings: the profile named from the compute slices and memory slots its GPU
    instance takes (None when the model has no such profile, or NVML did not say). A device whose
    uuid could not be read is left out: nothing could be given to a task on it."""
    out = []
    for reading in readings:
        uuid = reading.get("uuid")
        if not uuid or not MIG_UUID.match(uuid):
            continue
        start, size, compute = reading.get("start"), reading.get("size"), reading.get("compute")
        profile = (
            profile_at(ident["name"], compute, size, ident["memory_total_bytes"])
            if compute is not None and size is not None
            else None
        )
        out.append(MigDevice(uuid, reading.get("memory_total_bytes"), profile, start, size))
    return tuple(out)


def _critical_xids(health, temperature_c, xids):
    critical = [x for x in xids if x not in APPLICATION_XIDS]
    return "critical XID " + ", ".join(str(x) for x in sorted(set(critical))) if critical else None


def _reading(key, reason):
    """A problem named by one health reading: `reason` (its value in place of {}) when the reading
    is set."""

    def problem(health, temperature_c, xids):
        return reason.format(health[key]) if health.get(key) else None

    return problem


def _too_hot(health, temperature_c, xids):
    slowdown = health.get("slowdown_temperature_c")
    if temperature_c is not None and slowdown and temperature_c >= slowdown:
        return f"temperature {temperature_c} C at or above the slowdown threshold {slowdown} C"
    return None


# Every health problem, in the order reasons name them: (problem, fatal). A problem takes
# (health, temperature_c, xids) and returns its reason, or None when the GPU does not have it. Each
# one makes a GPU unhealthy (assess_health); a fatal one stops its running tasks too (fatal_health).
HEALTH_PROBLEMS = (
    (_critical_xids, True),
    (_reading("ecc_uncorrected_volatile", "{} uncorrectable ECC error(s) since driver load"), True),
    (_reading("retired_pages_pending", "retired pages pending: GPU reset required"), False),
    (_reading("remapped_rows_failure", "row remapping failed"), True),
    (_reading("remapped_rows_pending", "remapped rows pending: GPU reset required"), False),
    (_too_hot, False),
)


def _health_reasons(health, temperature_c, xids, fatal_only):
    reasons = (
        problem(health, temperature_c, xids)
        for problem, fatal in HEALTH_PROBLEMS
        if fatal or not fatal_only
    )
    return [reason for reason in reasons if reason]


def assess_health(health, temperature_c, xids):
    """(healthy, reason) from health readings, the current temperature and critical XIDs seen."""
    reasons = _health_reasons(health, temperature_c, xids, fatal_only=False)
    return not reasons, "; ".join(reasons)[:HEALTH_REASON_MAX]


def fatal_health(health, xids):
    """Why running tasks on a GPU must stop ("" when they need not).

    Narrower than assess_health (the fatal problems of HEALTH_PROBLEMS): a hot GPU or a pending
    row remap is not schedulable but its running tasks are fine; critical XIDs, uncorrectable ECC
    errors and a failed row remap are not.
    """
    return "; ".join(_health_reasons(health, None, xids, fatal_only=True))[:HEALTH_REASON_MAX]


def _now():
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class DeviceManager:
    """Owns the NVML session: discovery, periodic polls, XID watching, the latest inventory.

    `poll()` re-reads live values and health with the current NVML session; `discover()`
    re-initialises NVML so that a driver installed or a GPU replaced since start is seen.
    """

    def __init__(self, backend_spec="nvml", watch_xids=True, sysfs_root="/sys"):
        self.backend_spec = backend_spec
        self.watch_xids = watch_xids
        self.sysfs_root = sysfs_root  # where NICs and PCIe paths are read (tests: a tree of theirs)
        self._topology = None  # of this NVML session (read at discovery: it changes with hardware)
        self._lock = threading.RLock()
        self._nvml = None
        self._reason = ""
        self._static = {}  # uuid -> static properties (read once per NVML session)
        self._known = {}  # index -> last identity seen, for GPUs that become unreadable
        self._xids = {}  # uuid -> critical XIDs seen by this process
        self._xid_lock = (
            threading.Lock()
        )  # not self._lock: discover() joins the XID thread holding it
        self._xid_thread = None
        self._xid_stop = None
        self._inventory = None
        self.version = 0  # bumped whenever the wire form of the inventory changes
        self.discovered_monotonic = None

    @property
    def inventory(self):
        """The latest Inventory, or None before the first discovery."""
        with self._lock:
            return self._inventory

    def discover(self):
        """(Re)initialise NVML and take a full snapshot."""
        with self._lock:
            self._close_session()
            self._static.clear()
            self._topology = None
            try:
                nvml = Nvml(load_backend(self.backend_spec))
                nvml.open()
            except NvmlUnavailable as exc:
                self._reason = str(exc)
                log.warning("no GPUs: %s", exc)
            else:
                self._nvml = nvml
                self._reason = ""
            self.discovered_monotonic = time.monotonic()
            inventory = self._snapshot()
            if self._nvml is not None:
                self._topology = inventory.topology = read_topology(
                    self._nvml, inventory.devices, self.sysfs_root
                )
            if self._nvml is not None and self.watch_xids:
                self._start_xid_watch(self._nvml)
            return inventory

    def poll(self):
        """Refresh live readings and health with the current session (discovers first if needed)."""
        with self._lock:
            if self._inventory is None:
                return self.discover()
            return self._snapshot()

    def gpu_processes(self):
        """The VRAM watchdog's reading: {uuid: {index, healthy, reason, processes, sm_util}}.

        Lighter than poll(): per GPU only the process list and per-process utilisation (samples of
        the last few seconds). Health combines the last inventory with critical XIDs seen since.
        A GPU NVML cannot read now is unhealthy here at once.
        """
        with self._lock:
            nvml = self._nvml
            if nvml is None:
                return {}
            inventory = self._inventory
            with self._xid_lock:
                xids = {uuid: list(v) for uuid, v in self._xids.items()}
            out = {}
            try:
                count = nvml.count()
            except DeviceError:
                return {}
            since = int((time.time() - 5) * 1e6)  # NVML timestamps are microseconds since the epoch
            for index in range(count):
                known = self._known.get(index)
                try:
                    handle = nvml.handle(index)
                    if known is None:
                        known = self._known[index] = nvml.identity(handle)
                    processes = nvml.processes(handle)
                except DeviceError as exc:
                    if known is not None and exc.lost:
                        out[known["uuid"]] = {
                            "index": index,
                            "healthy": False,
                            "processes": [],
                            "sm_util": {},
                            "reason": f"GPU {index} unavailable: {exc}",
                        }
                    elif known is not None:
                        # Processes not readable (not supported, no permission): nothing to enforce
                        # on this GPU, which is said, but its tasks are not failed for it.
                        out[known["uuid"]] = {
                            "index": index,
                            "healthy": True,
                            "processes": [],
                            "sm_util": {},
                            "reason": "",
                            "error": f"cannot read its processes: {exc}",
                        }
                    continue
                uuid = known["uuid"]
                device = inventory.find(uuid) if inventory is not None else None
                reason = fatal_health(
                    device.health if device is not None else {}, xids.get(uuid, [])
                )
                healthy = not reason
                out[uuid] = {
                    "index": index,
                    "healthy": healthy,
                    "reason": reason,
                    "processes": processes,
                    "sm_util": nvml.process_utilization(handle, since),
                }
            return out

    def validation_readings(self):
        """(inventory, {index: readings or a DeviceError's text}) for a validation
        (agent/validation.py): a fresh poll, then what NVML says of each GPU's link, ECC, clocks and
        modes."""
        with self._lock:
            inventory = self.poll()
            nvml = self._nvml
            out: dict[int, dict | str] = {}
            if nvml is None:
                return inventory, out
            for device in inventory.devices:
                index = device.gpu.index
                try:
                    out[index] = nvml.validation_readings(nvml.handle(index))
                except DeviceError as exc:
                    out[index] = str(exc)
            return inventory, out

    def change_mig(self, uuid, change):
        """`change(nvml, handle)` on GPU `uuid` under the NVML session's lock (dynamic MIG:
        agent/mig.py), then its MIG devices read anew: the next heartbeat reports what it left.
        Returns what `change` returns; DeviceError where there is no such GPU or no NVML."""
        with self._lock:
            nvml, inventory = self._nvml, self._inventory
            if nvml is None:
                raise DeviceError(self._reason or "NVML is not available")
            devices = inventory.devices if inventory else ()
            index = next((d.gpu.index for d in devices if d.gpu.uuid == uuid), None)
            if index is None:
                raise DeviceError(f"no GPU {uuid} on this node")
            try:
                return change(nvml, nvml.handle(index))
            finally:
                self._static.pop(uuid, None)  # its MIG devices are static readings: read again
                self._snapshot()

    def close(self):
        """Stop the XID watcher and shut NVML down."""
        with self._lock:
            self._close_session()

    def _close_session(self):
        if (
            self._xid_stop is not None and self._xid_thread is not None
        ):  # set together (_start_xid_watch)
            self._xid_stop.set()
            self._xid_thread.join(timeout=5)
            self._xid_thread = self._xid_stop = None
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def _start_xid_watch(self, nvml):
        handles = {}
        for index in range(nvml.count()):
            try:
                handles[index] = nvml.handle(index)
            except DeviceError:
                continue
        if handles:
            self._xid_thread, self._xid_stop = start_xid_thread(nvml, handles, self._on_xid)

    def _on_xid(self, index, xid):
        known = self._known.get(index)
        uuid = known["uuid"] if known else f"unknown-gpu-{index}"
        if xid in APPLICATION_XIDS:
            log.info(
                "gpu %s (index %s) reported application XID %d; health unchanged", uuid, index, xid
            )
            return
        log.error(
            "gpu %s (index %s) reported critical XID %d; marking it unhealthy", uuid, index, xid
        )
        with self._xid_lock:
            self._xids.setdefault(uuid, []).append(xid)

    def _snapshot(self):
        nvml = self._nvml
        devices = []
        system = {"driver_version": None, "cuda_version": None}
        if nvml is not None:
            system = nvml.system()
            try:
                count = nvml.count()
            except DeviceError as exc:
                count = 0
                self._reason = f"NVML could not count GPUs: {exc}"
            for index in range(count):
                devices.append(self._read_device(nvml, index))
        inventory = Inventory(
            backend=self.backend_spec,
            devices=devices,
            reason=self._reason,
            discovered_at=_now(),
            topology=self._topology,
            **system,
        )
        previous = self._inventory
        if previous is None or previous.wire_gpus() != inventory.wire_gpus():
            self.version += 1
            self._log_changes(previous, inventory)
        self._inventory = inventory
        return inventory

    def _read_device(self, nvml, index):
        try:
            handle = nvml.handle(index)
            ident = nvml.identity(handle)
        except DeviceError as exc:
            return self._unavailable(index, str(exc))
        self._known[index] = ident
        static = self._static.get(ident["uuid"])
        if static is None:
            static = self._static[ident["uuid"]] = dict(
                nvml.properties(handle), **nvml.board(handle)
            )
        live = nvml.live(handle)
        health = nvml.health(handle)
        with self._xid_lock:
            xids = list(self._xids.get(ident["uuid"], []))
        healthy, reason = assess_health(health, live["temperature_c"], xids)
        cc = static["compute_capability"]
        gpu = Gpu(
            uuid=ident["uuid"],
            index=index,
            vendor="nvidia",
            model=ident["name"],
            memory_total_bytes=ident["memory_total_bytes"],
            numa_node=static["numa_node"],
            max_tflops=max_tflops(cc, static["cuda_cores"], static["max_sm_clock_mhz"]),
            healthy=healthy,
            health_reason=reason,
            mig_mode=static["mig_mode"],
            serial=static["serial"],
            board_part_number=static["board_part_number"],
            vbios=static["vbios"],
            xids=tuple(xids),
            ecc_uncorrected=health["ecc_uncorrected_volatile"],
            mig_devices=mig_devices(ident, static["mig_devices"]),
        )
        return Device(
            gpu=gpu,
            pci_bus_id=static["pci_bus_id"],
            compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
            sm_count=sm_count(cc, static["cuda_cores"]),
            max_sm_clock_mhz=static["max_sm_clock_mhz"],
            memory_used_bytes=live["memory_used_bytes"],
            utilization_percent=live["utilization_percent"],
            memory_utilization_percent=live["memory_utilization_percent"],
            temperature_c=live["temperature_c"],
            slowdown_temperature_c=health["slowdown_temperature_c"],
            power_w=live["power_w"],
            power_limit_w=live["power_limit_w"],
            processes=live["processes"],
            mig_devices=static["mig_devices"],
            health=health,
            xids=xids,
        )

    def _unavailable(self, index, error):
        """An unhealthy entry for a GPU NVML cannot read, keeping its last known identity."""
        known = self._known.get(index) or {}
        return Device(
            gpu=Gpu(
                uuid=known.get("uuid") or f"unknown-gpu-{index}",
                index=index,
                vendor="nvidia",
                model=known.get("name") or "unknown",
                memory_total_bytes=known.get("memory_total_bytes") or 0,
                numa_node=None,
                max_tflops=None,
                healthy=False,
                health_reason=f"GPU {index} unavailable: {error}"[:HEALTH_REASON_MAX],
                mig_mode=None,
            )
        )

    def _log_changes(self, previous, current):
        before = {d.gpu.uuid: d.gpu for d in previous.devices} if previous else {}
        for device in current.devices:
            gpu, old = device.gpu, before.pop(device.gpu.uuid, None)
            if old is None:
                log.info(
                    "gpu %s found: index %d, %s, %s",
                    gpu.uuid,
                    gpu.index,
                    gpu.model,
                    "healthy" if gpu.healthy else "unhealthy: " + gpu.health_reason,
                )
            elif old.healthy != gpu.healthy or old.health_reason != gpu.health_reason:
                level = logging.INFO if gpu.healthy else logging.ERROR
                log.log(
                    level,
                    "gpu %s health changed: %s",
                    gpu.uuid,
                    "healthy" if gpu.healthy else "unhealthy: " + gpu.health_reason,
                )
        for uuid in before:
            log.warning("gpu %s is gone", uuid)
