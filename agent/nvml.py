"""The one place that talks to NVML (pynvml, or its fake chosen by configuration).

Required readings (uuid, name, total memory) raise `DeviceError`; optional readings
degrade to None when NVML raises. Nothing here decides health or formats output: that is
`agent.devices`.
"""

import importlib
import logging
import os
import threading
import typing

log = logging.getLogger("agent.nvml")

FAKE_PREFIX = "fake:"


class NvmlUnavailable(Exception):
    """NVML cannot be used on this host (no driver, no library); the message says why."""


class DeviceError(Exception):
    """A required reading of one GPU failed; the message is NVML's reason (e.g. "GPU is lost").

    `lost` is True when NVML says the GPU is gone or needs a reset (not when a call is merely
    unsupported or not permitted).
    """

    def __init__(self, message, lost=False):
        super().__init__(message)
        self.lost = lost


def load_backend(spec):
    """The pynvml module for `nvml`, or the fake pointed at a shape file for `fake:<path>`."""
    if spec == "nvml":
        try:
            return importlib.import_module("pynvml")
        except ImportError as exc:
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from None
    if spec.startswith(FAKE_PREFIX):
        path = spec[len(FAKE_PREFIX) :]
        if not os.path.isfile(path):
            raise ValueError(f"fake device shape {path!r} does not exist")
        from agent import fake_nvml

        fake_nvml.use_shape(path)
        return fake_nvml
    raise ValueError(f"unknown devices.backend {spec!r}: use 'nvml' or 'fake:<path to shape json>'")


# The GPU instance profiles fleetd places (NVML_GPU_INSTANCE_PROFILE_<name>) and their compute
# slices; 1_SLICE_REV2 is the one-slice profile with two memory slots (1g.10gb on an A100 40GB).
_GPU_INSTANCE_SLICES = (
    ("1_SLICE", 1),
    ("2_SLICE", 2),
    ("3_SLICE", 3),
    ("4_SLICE", 4),
    ("7_SLICE", 7),
    ("1_SLICE_REV2", 1),
)


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


class Unread:
    """A reading NVML did not give: why, and whether the GPU or driver does not support it (which a
    validation reports rather than fails)."""

    def __init__(self, reason, not_supported):
        self.reason = reason
        self.not_supported = not_supported

    def __repr__(self):
        return f"Unread({self.reason!r})"


# Clock event (throttle) reasons, NVML's bit values: (name, bit). Idle, an applications-clocks
# setting and a display clock setting are not slowdowns.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)


# NVML's levels of the closest common ancestor of two GPUs (nvmlGpuTopologyLevel_t), by constant
# name, and the link class each is (two GPUs of one board, INTERNAL, sit behind its own switch).
COMMON_ANCESTOR_CLASSES = (
    ("NVML_TOPOLOGY_INTERNAL", "pcie_switch"),
    ("NVML_TOPOLOGY_SINGLE", "pcie_switch"),
    ("NVML_TOPOLOGY_MULTIPLE", "pcie_switch"),
    ("NVML_TOPOLOGY_HOSTBRIDGE", "host_bridge"),
    ("NVML_TOPOLOGY_NODE", "numa"),
    ("NVML_TOPOLOGY_SYSTEM", "system"),
)


class NvLink(typing.NamedTuple):
    """An active NVLink of a GPU: what it reaches (a PCI bus id) and whether NVML says that is an
    NVSwitch (None: this NVML cannot say)."""

    link: int
    remote_bus_id: str
    to_switch: bool | None


class Nvml:
    """An initialised NVML session over one backend module."""

    def __init__(self, backend):
        self.nv = backend
        self.is_fake = getattr(backend, "__name__", "").endswith("fake_nvml")
        self._open = False

    def open(self):
        """nvmlInit; a host without a usable driver raises NvmlUnavailable with the reason."""
        try:
            self.nv.nvmlInit()
        except self.nv.NVMLError as exc:
            raise NvmlUnavailable(f"no NVIDIA driver: NVML init failed: {exc}") from None
        except OSError as exc:
            raise NvmlUnavailable(f"no NVIDIA driver: {exc}") from None
        self._open = True

    def close(self):
        """nvmlShutdown, once."""
        if self._open:
            self._open = False
            try:
                self.nv.nvmlShutdown()
            except self.nv.NVMLError as exc:
                log.warning("nvml shutdown failed: %s", exc)

    def _required(self, fn, *args):
        try:
            return getattr(self.nv, fn)(*args)
        except self.nv.NVMLError as exc:
            gone = tuple(
                c
                for c in (
                    getattr(self.nv, "NVMLError_GpuIsLost", None),
                    getattr(self.nv, "NVMLError_ResetRequired", None),
                )
                if c is not None
            )
            raise DeviceError(str(exc), lost=bool(gone) and isinstance(exc, gone)) from None

    def _optional(self, fn, *args):
        func = getattr(self.nv, fn, None)
        if func is None:  # an older nvidia-ml-py without this call
            return None
        try:
            return func(*args)
        except self.nv.NVMLError:
            return None

    def _reading(self, fn, *args):
        """The value, or an Unread saying why not (NotSupported, an older library without the call,
        ...)."""
        func = getattr(self.nv, fn, None)
        if func is None:
            return Unread(f"{fn} is not in this NVML library", True)
        try:
            return func(*args)
        except self.nv.NVMLError as exc:
            unsupported = getattr(self.nv, "NVMLError_NotSupported", None)
            return Unread(str(exc), unsupported is not None and isinstance(exc, unsupported))

    def board(self, handle):
        """{serial, board_part_number, vbios}, None where NVML cannot say."""
        out = {}
        for key, fn in (
            ("serial", "nvmlDeviceGetSerial"),
            ("board_part_number", "nvmlDeviceGetBoardPartNumber"),
            ("vbios", "nvmlDeviceGetVbiosVersion"),
        ):
            value = self._optional(fn, handle)
            text = _text(value).strip() if value is not None else ""
            out[key] = text[:64] if text and text not in ("N/A", "0") else None
        return out

    def validation_readings(self, handle):
        """What a validation reads of one GPU: each value, or an Unread (agent/validation.py
        decides)."""
        nv = self.nv
        ecc = self._reading("nvmlDeviceGetEccMode", handle)
        mig = self._reading("nvmlDeviceGetMigMode", handle)
        reasons = self._reading("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if isinstance(reasons, Unread) and "not in this NVML library" in reasons.reason:
            reasons = self._reading("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        rows = self._reading("nvmlDeviceGetRemappedRows", handle)
        retired = self._reading("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        persistence = self._reading("nvmlDeviceGetPersistenceMode", handle)
        return {
            "persistence_mode": persistence
            if isinstance(persistence, Unread)
            else persistence == nv.NVML_FEATURE_ENABLED,
            "ecc_mode": ecc if isinstance(ecc, Unread) else [bool(ecc[0]), bool(ecc[1])],
            "retired_pages_pending": retired
            if isinstance(retired, Unread)
            else retired == nv.NVML_FEATURE_ENABLED,
            "remapped_rows": rows
            if isinstance(rows, Unread)
            else {
                "correctable": int(rows[0]),
                "uncorrectable": int(rows[1]),
                "pending": bool(rows[2]),
                "failure": bool(rows[3]),
            },
            "ecc_uncorrected_volatile": self._reading(
                "nvmlDeviceGetTotalEccErrors",
                handle,
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nv.NVML_VOLATILE_ECC,
            ),
            "pcie_max_gen": self._reading("nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "pcie_gpu_max_gen": self._reading("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle),
            "pcie_max_width": self._reading("nvmlDeviceGetMaxPcieLinkWidth", handle),
            "pcie_gen": self._reading("nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "pcie_width": self._reading("nvmlDeviceGetCurrPcieLinkWidth", handle),
            "pcie_replays": self._reading("nvmlDeviceGetPcieReplayCounter", handle),
            "clock_event_reasons": reasons
            if isinstance(reasons, Unread)
            else [name for name, bit in CLOCK_EVENT_REASONS if int(reasons) & bit],
            "temperature_c": self._reading(
                "nvmlDeviceGetTemperature", handle, nv.NVML_TEMPERATURE_GPU
            ),
            "slowdown_temperature_c": self._reading(
                "nvmlDeviceGetTemperatureThreshold", handle, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            "mig_mode": mig
            if isinstance(mig, Unread)
            else ["enabled" if m == nv.NVML_DEVICE_MIG_ENABLE else "disabled" for m in mig[:2]],
        }

    def system(self):
        """{driver_version, cuda_version} with None for what NVML cannot say."""
        driver = self._optional("nvmlSystemGetDriverVersion")
        cuda = self._optional("nvmlSystemGetCudaDriverVersion_v2")
        return {
            "driver_version": _text(driver) if driver is not None else None,
            "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        }

    def count(self):
        """Number of GPUs NVML enumerated at init."""
        return self._required("nvmlDeviceGetCount")

    def handle(self, index):
        """Device handle by index (raises DeviceError for a GPU that is lost)."""
        return self._required("nvmlDeviceGetHandleByIndex", index)

    def identity(self, handle):
        """Required readings: uuid, name, total memory. Raises DeviceError."""
        memory = self._required("nvmlDeviceGetMemoryInfo", handle)
        return {
            "uuid": _text(self._required("nvmlDeviceGetUUID", handle)),
            "name": _text(self._required("nvmlDeviceGetName", handle)),
            "memory_total_bytes": int(memory.total),
        }

    def properties(self, handle):
        """Static optional readings: PCI bus id, NUMA node, compute capability, cores, max SM clock,
        MIG."""
        pci = self._optional("nvmlDeviceGetPciInfo", handle)
        bus_id = _text(pci.busId) if pci is not None else None
        numa = self._optional("nvmlDeviceGetNumaNodeId", handle)
        if numa is None and bus_id and not self.is_fake:
            numa = _sysfs_numa_node(bus_id)
        if numa is not None and numa < 0:
            numa = None
        cc = self._optional("nvmlDeviceGetCudaComputeCapability", handle)
        mig = self._optional("nvmlDeviceGetMigMode", handle)
        mig_mode = None
        if mig is not None:
            mig_mode = "enabled" if mig[0] == self.nv.NVML_DEVICE_MIG_ENABLE else "disabled"
        return {
            "pci_bus_id": bus_id,
            "numa_node": numa,
            "compute_capability": tuple(cc) if cc is not None else None,
            "cuda_cores": self._optional("nvmlDeviceGetNumGpuCores", handle),
            "max_sm_clock_mhz": self._optional(
                "nvmlDeviceGetMaxClockInfo", handle, self.nv.NVML_CLOCK_SM
            ),
            "mig_mode": mig_mode,
            "mig_devices": self._mig_devices(handle) if mig_mode == "enabled" else [],
        }

    def _mig_devices(self, handle):
        out = []
        for i in range(self._optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
            mig = self._optional("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            if mig is None:
                continue
            uuid = self._optional("nvmlDeviceGetUUID", mig)
            memory = self._optional("nvmlDeviceGetMemoryInfo", mig)
            out.append(
                {
                    "uuid": _text(uuid) if uuid is not None else None,
                    "memory_total_bytes": int(memory.total) if memory is not None else None,
                    "memory_used_bytes": int(memory.used) if memory is not None else None,
                    **self._gpu_instance(handle, mig),
                }
            )
        return out

    def _gpu_instance(self, handle, mig):
        """{compute, start, size} of a MIG device's GPU instance: its compute slices (None for a
        profile fleetd does not place: +me, +gfx, no-me) and its placement in the GPU's memory
        slots; {} when NVML does not say (an older library or driver, too few privileges)."""
        gi_id = self._optional("nvmlDeviceGetGpuInstanceId", mig)
        gi = (
            None if gi_id is None else self._optional("nvmlDeviceGetGpuInstanceById", handle, gi_id)
        )
        info = None if gi is None else self._optional("nvmlGpuInstanceGetInfo", gi)
        if info is None:
            return {}
        # info.profileId is the profile's id on this GPU (nvidia-smi's "Profile ID": 19 for an
        # A100's 1g.5gb), not the NVML_GPU_INSTANCE_PROFILE_* index the table names: the GPU says
        # which id each index has.
        slices = {}
        for name, count in _GPU_INSTANCE_SLICES:
            index = getattr(self.nv, f"NVML_GPU_INSTANCE_PROFILE_{name}", None)
            profile = (
                None
                if index is None
                else self._optional("nvmlDeviceGetGpuInstanceProfileInfo", handle, index)
            )
            if profile is not None:
                slices[int(profile.id)] = count
        return {
            "compute": slices.get(int(info.profileId)),
            "start": int(info.placement.start),
            "size": int(info.placement.size),
        }

    def live(self, handle):
        """Live optional readings: memory used, utilization (SM and memory), temperature, power draw
        and limit, processes."""
        memory = self._optional("nvmlDeviceGetMemoryInfo", handle)
        util = self._optional("nvmlDeviceGetUtilizationRates", handle)
        power = self._optional("nvmlDeviceGetPowerUsage", handle)
        limit = self._optional("nvmlDeviceGetEnforcedPowerLimit", handle)
        procs = self._optional("nvmlDeviceGetComputeRunningProcesses", handle)
        return {
            "memory_used_bytes": int(memory.used) if memory is not None else None,
            "utilization_percent": int(util.gpu) if util is not None else None,
            "memory_utilization_percent": int(util.memory) if util is not None else None,
            "temperature_c": self._optional(
                "nvmlDeviceGetTemperature", handle, self.nv.NVML_TEMPERATURE_GPU
            ),
            "power_w": round(power / 1000, 1) if power is not None else None,
            "power_limit_w": round(limit / 1000, 1) if limit is not None else None,
            "processes": None
            if procs is None
            else [{"pid": int(p.pid), "used_memory_bytes": _process_memory(p)} for p in procs],
        }

    def processes(self, handle):
        """[{pid, used_memory_bytes}] of the compute processes on a GPU; raises DeviceError.

        Required for the VRAM watchdog: a GPU whose processes cannot be read is not silently
        reported as empty.
        """
        procs = self._required("nvmlDeviceGetComputeRunningProcesses", handle)
        return [{"pid": int(p.pid), "used_memory_bytes": _process_memory(p)} for p in procs]

    def process_utilization(self, handle, since_us=0):
        """{pid: SM utilisation percent} from samples newer than `since_us` (NVML's timestamps); {}
        when none."""
        samples = self._optional("nvmlDeviceGetProcessUtilization", handle, since_us)
        out: dict[int, int] = {}
        for sample in samples or []:
            pid = int(sample.pid)
            out[pid] = max(out.get(pid, 0), int(sample.smUtil))
        return out

    def health(self, handle):
        """Health readings; each is None where the GPU does not support it."""
        ecc = self._optional(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            self.nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            self.nv.NVML_VOLATILE_ECC,
        )
        retired = self._optional("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        rows = self._optional("nvmlDeviceGetRemappedRows", handle)
        return {
            "ecc_uncorrected_volatile": ecc,
            "retired_pages_pending": None
            if retired is None
            else retired == self.nv.NVML_FEATURE_ENABLED,
            "remapped_rows_pending": None if rows is None else bool(rows[2]),
            "remapped_rows_failure": None if rows is None else bool(rows[3]),
            "slowdown_temperature_c": self._optional(
                "nvmlDeviceGetTemperatureThreshold",
                handle,
                self.nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            ),
        }

    def common_ancestor(self, handle1, handle2):
        """The link class of the PCIe path between two GPUs (COMMON_ANCESTOR_CLASSES), or an Unread
        saying why NVML did not tell."""
        level = self._reading("nvmlDeviceGetTopologyCommonAncestor", handle1, handle2)
        if isinstance(level, Unread):
            return level
        for name, link_class in COMMON_ANCESTOR_CLASSES:
            if getattr(self.nv, name, None) == level:
                return link_class
        return Unread(f"unknown topology level {level}", False)

    def nvlinks(self, handle):
        """The GPU's active NVLinks ([NvLink]; [] for a GPU without NVLink, where NVML answers
        NotSupported), or an Unread when no link could be read for another reason."""
        nv = self.nv
        out = []
        failed = None
        read_any = False
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 0)):
            state = self._reading("nvmlDeviceGetNvLinkState", handle, link)
            if isinstance(state, Unread):
                if link == 0 and state.not_supported:
                    return []
                failed = failed or state  # a link number beyond the GPU's own links, or worse
                continue
            read_any = True
            if state != nv.NVML_FEATURE_ENABLED:
                continue
            pci = self._reading("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            if isinstance(pci, Unread):
                failed = failed or pci
                continue
            kind = self._reading("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            switch = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", None)
            to_switch = None if isinstance(kind, Unread) or switch is None else kind == switch
            out.append(NvLink(link, _text(pci.busId), to_switch))
        if not read_any and failed is not None and not failed.not_supported:
            return failed
        return out

    def fake_pci_devices(self):
        """The fake backend's PCIe devices, where a real host has sysfs (agent.fake_nvml); None
        with the real library."""
        return self.nv.fake_pci_devices() if self.is_fake else None

    def watch_xids(self, handles, on_event, stop, timeout_ms=250):
        """Block until `stop` is set, calling on_event(index, xid) for each critical XID event.

        `handles` is {index: handle}. Returns at once (with a log line) where event sets are
        not supported, e.g. on GPUs without XID event support.
        """
        try:
            event_set = self.nv.nvmlEventSetCreate()
        except self.nv.NVMLError as exc:
            log.warning("xid events unavailable: %s", exc)
            return
        by_handle = {}
        try:
            for index, handle in handles.items():
                try:
                    self.nv.nvmlDeviceRegisterEvents(
                        handle, self.nv.nvmlEventTypeXidCriticalError, event_set
                    )
                    by_handle[id(handle)] = index
                except self.nv.NVMLError as exc:
                    log.info("xid events not supported on gpu %d: %s", index, exc)
            if not by_handle:
                return
            while not stop.is_set():
                try:
                    event = self.nv.nvmlEventSetWait_v2(event_set, timeout_ms)
                except self.nv.NVMLError_Timeout:
                    continue
                except self.nv.NVMLError as exc:
                    log.warning("xid event wait failed: %s", exc)
                    stop.wait(timeout_ms / 1000)
                    continue
                index = by_handle.get(id(event.device))
                if index is None:
                    index = self._optional("nvmlDeviceGetIndex", event.device)
                on_event(index, int(event.eventData))
        finally:
            try:
                self.nv.nvmlEventSetFree(event_set)
            except self.nv.NVMLError:
                pass


def _process_memory(proc):
    used = getattr(proc, "usedGpuMemory", None)
    # NVML reports "not available" (e.g. without permission) as a huge sentinel value.
    if used is None or used >= 2**63:
        return None
    return int(used)


def _sysfs_numa_node(bus_id):
    """NUMA node from sysfs when NVML lacks nvmlDeviceGetNumaNodeId (older drivers)."""
    domain, _, rest = bus_id.lower().partition(":")
    path = f"/sys/bus/pci/devices/{domain[-4:]}:{rest}/numa_node"
    try:
        with open(path) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def start_xid_thread(nvml, handles, on_event):
    """Run watch_xids in a daemon thread; returns (thread, stop event)."""
    stop = threading.Event()
    thread = threading.Thread(
        target=nvml.watch_xids, args=(handles, on_event, stop), name="xid-events", daemon=True
    )
    thread.start()
    return thread, stop


# Creating and destroying one GPU instance on a GPU whose MIG mode is already enabled (used by
# scripts/gpu_mig_check.py). Nothing here enables or disables MIG mode: that takes a GPU reset.


class CreatedInstance(typing.NamedTuple):
    """A GPU instance create_gpu_instance made: NVML's handles of it and of its one compute
    instance, and its id (nvidia-smi's GPU instance ID)."""

    gpu_instance: typing.Any
    compute_instance: typing.Any
    id: int


def create_gpu_instance(nvml, handle, profile, start, size):
    """Create a GPU instance of NVML's GPU instance profile `profile` (the name after
    NVML_GPU_INSTANCE_PROFILE_: "1_SLICE", "1_SLICE_REV2", ...) at the memory slots [start, start +
    size), with one compute instance taking all its compute slices (engines shared). Raises
    DeviceError with NVML's reason; a GPU instance whose compute instance could not be made is
    destroyed before that."""
    import ctypes  # pynvml takes the placement by pointer, as NVML does

    nv = nvml.nv
    profile_index = getattr(nv, f"NVML_GPU_INSTANCE_PROFILE_{profile}", None)
    if profile_index is None:
        raise DeviceError(f"this NVML library has no GPU instance profile {profile}")
    info = nvml._required("nvmlDeviceGetGpuInstanceProfileInfo", handle, profile_index)
    placement = nv.c_nvmlGpuInstancePlacement_t(start, size)
    gpu_instance = nvml._required(
        "nvmlDeviceCreateGpuInstanceWithPlacement", handle, info.id, ctypes.byref(placement)
    )
    try:
        gi_id = int(nvml._required("nvmlGpuInstanceGetInfo", gpu_instance).id)
        ci_index = getattr(nv, f"NVML_COMPUTE_INSTANCE_PROFILE_{info.sliceCount}_SLICE", None)
        if ci_index is None:
            raise DeviceError(f"this NVML library has no {info.sliceCount}-slice compute profile")
        ci_info = nvml._required(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            gpu_instance,
            ci_index,
            nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
        compute_instance = nvml._required(
            "nvmlGpuInstanceCreateComputeInstance", gpu_instance, ci_info.id
        )
    except BaseException:
        try:
            nvml._required("nvmlGpuInstanceDestroy", gpu_instance)
        except DeviceError as exc:
            log.warning("could not destroy the GPU instance just created: %s", exc)
        raise
    return CreatedInstance(gpu_instance, compute_instance, gi_id)


def destroy_gpu_instance(nvml, instance):
    """Destroy a GPU instance create_gpu_instance made: its compute instance first, then the GPU
    instance. Raises DeviceError with NVML's reason."""
    if instance.compute_instance is not None:
        nvml._required("nvmlComputeInstanceDestroy", instance.compute_instance)
    nvml._required("nvmlGpuInstanceDestroy", instance.gpu_instance)


def existing_gpu_instances(nvml, handle):
    """The GPU instances of a GPU in MIG mode that hold a MIG device, as CreatedInstance (with
    their compute instance), for destroy_gpu_instance: each found through its MIG device (GPU
    instance id, then compute instance id). Raises DeviceError with NVML's reason."""
    found = []
    for i in range(nvml._required("nvmlDeviceGetMaxMigDeviceCount", handle)):
        mig = nvml._optional("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
        if mig is None:
            continue
        gi_id = int(nvml._required("nvmlDeviceGetGpuInstanceId", mig))
        ci_id = int(nvml._required("nvmlDeviceGetComputeInstanceId", mig))
        gpu_instance = nvml._required("nvmlDeviceGetGpuInstanceById", handle, gi_id)
        compute = nvml._required("nvmlGpuInstanceGetComputeInstanceById", gpu_instance, ci_id)
        found.append(CreatedInstance(gpu_instance, compute, gi_id))
    return found
