"""A fake `pynvml` built from a JSON host shape, for tests and demos.

It implements the pynvml functions that `agent.nvml` calls, with the same names, constants,
return shapes and error classes (``NVMLError(value)`` maps to ``NVMLError_GpuIsLost`` and so
on). It is selected only by ``devices.backend = "fake:<path>"``, never as a fallback.

A shape file looks like::

    {"driver_version": "550.54.15", "cuda_driver_version": 12040,
     "gpus": [{"uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": ...,
               "pci_bus_id": "00000000:18:00.0", "numa_node": 0, "compute_capability": [9, 0],
               "cuda_cores": 16896, "max_sm_clock_mhz": 1980, ...}]}

Per GPU, optional keys: ``memory_used_bytes``, ``utilization_percent``,
``memory_utilization_percent``, ``temperature_c``,
``slowdown_temperature_c``, ``power_draw_w``, ``power_limit_w``, ``mig_mode``
("enabled"/"disabled"/null for not supported), ``mig_devices`` ([{uuid, memory_total_bytes,
profile?, start?, size?}]: a device with a profile and its placement in memory slots answers the GPU
instance calls; one without answers them NotFound),
``ecc_uncorrected_volatile``, ``retired_pages_pending``, ``remapped_rows`` ({correctable,
uncorrectable, pending, failure}), ``serial``, ``board_part_number``, ``vbios``,
``persistence_mode`` (bool), ``ecc_mode`` and ``ecc_mode_pending`` ("enabled"/"disabled"), ``pcie``
({gen, max_gen, gpu_max_gen, width, max_width, replays}), ``clock_event_reasons`` (["gpu_idle",
"hw_slowdown", ...]), ``mig_mode_pending`` (what validation reads; a key left out answers
NotSupported), ``processes`` ([{pid, used_bytes, sm_util?}]), ``xid_events`` ([xid, ...] delivered
once each through event sets), ``lost`` (every call on the GPU raises GpuIsLost) and ``errors``
({"nvmlDeviceGetPowerUsage": "NotSupported", ...}). A top-level ``"no_driver": true`` makes
``nvmlInit`` fail as on a host without the NVIDIA driver.

The file is read at ``nvmlInit``; when its modification time changes, live readings and
health fields are reloaded at the next ``nvmlDeviceGetCount`` (the device set changes only at
the next ``nvmlInit``, as with the real library). Tests in the same process can also call
``add_process``, ``inject_xid`` and ``update_gpu``.
"""

import ctypes
import json
import os
import queue
import sys
import threading
import time
from types import SimpleNamespace

from agent import fake_topology
from fleetwire.mig import profile_at

# Constants, with the values pynvml uses.
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_GPU = 0
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1
NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9  # one compute slice with two memory slots
NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0
NVML_TOPOLOGY_INTERNAL = fake_topology.NVML_TOPOLOGY_INTERNAL
NVML_TOPOLOGY_SINGLE = fake_topology.NVML_TOPOLOGY_SINGLE
NVML_TOPOLOGY_MULTIPLE = fake_topology.NVML_TOPOLOGY_MULTIPLE
NVML_TOPOLOGY_HOSTBRIDGE = fake_topology.NVML_TOPOLOGY_HOSTBRIDGE
NVML_TOPOLOGY_NODE = fake_topology.NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_CPU = NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM = fake_topology.NVML_TOPOLOGY_SYSTEM
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = fake_topology.NVML_NVLINK_DEVICE_TYPE_GPU
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = fake_topology.NVML_NVLINK_DEVICE_TYPE_SWITCH
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksEventReasonDisplayClockSetting = 0x100
_CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_UNKNOWN = 999

_ERROR_NAMES = {
    NVML_ERROR_UNINITIALIZED: ("Uninitialized", "Uninitialized"),
    NVML_ERROR_INVALID_ARGUMENT: ("InvalidArgument", "Invalid Argument"),
    NVML_ERROR_NOT_SUPPORTED: ("NotSupported", "Not Supported"),
    NVML_ERROR_NO_PERMISSION: ("NoPermission", "Insufficient Permissions"),
    NVML_ERROR_ALREADY_INITIALIZED: ("AlreadyInitialized", "Already Initialized"),
    NVML_ERROR_NOT_FOUND: ("NotFound", "Not Found"),
    NVML_ERROR_DRIVER_NOT_LOADED: ("DriverNotLoaded", "Driver Not Loaded"),
    NVML_ERROR_TIMEOUT: ("Timeout", "Timeout"),
    NVML_ERROR_LIBRARY_NOT_FOUND: ("LibraryNotFound", "NVML Shared Library Not Found"),
    NVML_ERROR_FUNCTION_NOT_FOUND: ("FunctionNotFound", "Function Not Found"),
    NVML_ERROR_GPU_IS_LOST: ("GpuIsLost", "GPU is lost"),
    NVML_ERROR_RESET_REQUIRED: ("ResetRequired", "GPU requires restart"),
    NVML_ERROR_IN_USE: ("InUse", "In use by another client"),
    NVML_ERROR_INSUFFICIENT_RESOURCES: ("InsufficientResources", "Insufficient resources"),
    NVML_ERROR_UNKNOWN: ("Unknown", "Unknown Error"),
}


class NVMLError(Exception):
    """Same contract as pynvml.NVMLError: ``NVMLError(code)`` returns the code's subclass."""

    _valClassMapping: dict[int, type] = {}

    def __new__(cls, value):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return _ERROR_NAMES.get(self.value, ("", f"NVML Error with code {self.value}"))[1]

    def __eq__(self, other):
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _make_error_classes():
    module = sys.modules[__name__]
    for code, (name, _text) in _ERROR_NAMES.items():
        cls = type(f"NVMLError_{name}", (NVMLError,), {})
        cls.__module__ = __name__
        setattr(module, cls.__name__, cls)
        NVMLError._valClassMapping[code] = cls


_make_error_classes()
_ERROR_CODES = {name: code for code, (name, _text) in _ERROR_NAMES.items()}

_DYNAMIC_KEYS_EXCLUDED = ("uuid", "name", "pci_bus_id", "mig_devices")

_lock = threading.RLock()
_shape_path = None
_shape = None
_mtime = None
_initialized = 0
_devices: list = []
_event_sets: list = []


class _Handle:
    """A device handle; `gpu` is the live dict from the shape."""

    def __init__(self, index, gpu, mig=None):
        self.index = index
        self.gpu = gpu
        self.mig = mig
        self.xids_delivered = 0

    def __repr__(self):
        return f"<fake nvmlDevice {self.index}{' mig' if self.mig else ''}>"


def use_shape(path):
    """Point the fake at a shape file; takes effect at the next nvmlInit."""
    global _shape_path
    with _lock:
        _shape_path = os.fspath(path)


def _read_shape(path):
    with open(path, "rb") as fh:
        data = json.load(fh)
    return data, os.stat(path).st_mtime_ns


def _reload_if_changed():
    global _shape, _mtime
    if _shape_path is None:
        return
    try:
        mtime = os.stat(_shape_path).st_mtime_ns
    except OSError:
        return
    if mtime == _mtime:
        return
    try:
        data, mtime = _read_shape(_shape_path)
    except (OSError, ValueError):
        return  # a half-written file: keep the last good shape
    _shape, _mtime = data, mtime
    for handle, gpu in zip(_devices, data.get("gpus", [])):
        for key, value in gpu.items():
            if key not in _DYNAMIC_KEYS_EXCLUDED:
                handle.gpu[key] = value
        for key in list(handle.gpu):
            if key not in gpu and key not in _DYNAMIC_KEYS_EXCLUDED:
                del handle.gpu[key]


def _check_init():
    if not _initialized:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _loaded_shape() -> dict:
    """The shape nvmlInit loaded; NVMLError as the real library's while it is not initialized."""
    _check_init()
    if _shape is None:  # reset() came between
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _shape


def _call(handle, function):
    """Raise what the shape says this function raises on this GPU."""
    _check_init()
    if not isinstance(handle, _Handle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = handle.gpu
    if gpu.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    error = (gpu.get("errors") or {}).get(function)
    if error:
        raise NVMLError(_ERROR_CODES[error])
    return gpu


def _call_gpu(gpu, function):
    """As _call, for a handle of a GPU instance or compute instance (of the GPU dict `gpu`)."""
    return _call(_Handle(gpu.get("index", 0), gpu), function)


def _optional(gpu, key):
    value = gpu.get(key)
    if value is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return value


# Library and system.


def nvmlInit():
    """Load the shape; fails like the real library when the shape says there is no driver."""
    global _initialized, _shape, _mtime, _devices
    with _lock:
        if _shape_path is None:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        if not _initialized:
            data, mtime = _read_shape(_shape_path)
            if data.get("no_driver"):
                raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
            _shape, _mtime = data, mtime
            _devices = [_Handle(i, dict(gpu)) for i, gpu in enumerate(data.get("gpus", []))]
        _initialized += 1


def nvmlShutdown():
    """Balance one nvmlInit; the last one forgets the devices."""
    global _initialized, _devices
    with _lock:
        _check_init()
        _initialized -= 1
        if not _initialized:
            _devices = []


def nvmlSystemGetDriverVersion():
    return _loaded_shape().get("driver_version", "")


def nvmlSystemGetCudaDriverVersion_v2():
    return int(_optional(_loaded_shape(), "cuda_driver_version"))


def nvmlSystemGetCudaDriverVersion():
    return nvmlSystemGetCudaDriverVersion_v2()


def nvmlDeviceGetCount():
    with _lock:
        _check_init()
        _reload_if_changed()
        return len(_devices)


def nvmlDeviceGetHandleByIndex(index):
    with _lock:
        _check_init()
        if not 0 <= index < len(_devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        handle = _devices[index]
        if handle.gpu.get("lost") and handle.gpu.get("lost_handle", False):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return handle


# Device identity and static properties.


def nvmlDeviceGetUUID(handle):
    if handle.mig:
        _call(handle, "nvmlDeviceGetUUID")
        return handle.mig["uuid"]
    return _call(handle, "nvmlDeviceGetUUID")["uuid"]


def nvmlDeviceGetName(handle):
    return _call(handle, "nvmlDeviceGetName")["name"]


def nvmlDeviceGetIndex(handle):
    _call(handle, "nvmlDeviceGetIndex")
    return handle.index


def _pci_info(bus_id):
    return SimpleNamespace(busId=bus_id, busIdLegacy=bus_id[4:])


def nvmlDeviceGetPciInfo(handle):
    gpu = _call(handle, "nvmlDeviceGetPciInfo")
    bus_id = gpu.get("pci_bus_id", f"00000000:{handle.index:02X}:00.0")
    return _pci_info(bus_id)


def nvmlDeviceGetPciInfo_v3(handle):
    return nvmlDeviceGetPciInfo(handle)


def nvmlDeviceGetNumaNodeId(handle):
    return int(_optional(_call(handle, "nvmlDeviceGetNumaNodeId"), "numa_node"))


def nvmlDeviceGetCudaComputeCapability(handle):
    major, minor = _optional(
        _call(handle, "nvmlDeviceGetCudaComputeCapability"), "compute_capability"
    )
    return (major, minor)


def nvmlDeviceGetNumGpuCores(handle):
    return int(_optional(_call(handle, "nvmlDeviceGetNumGpuCores"), "cuda_cores"))


def nvmlDeviceGetMaxClockInfo(handle, type):  # noqa: A002 - pynvml's parameter name
    gpu = _call(handle, "nvmlDeviceGetMaxClockInfo")
    if type != NVML_CLOCK_SM:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(_optional(gpu, "max_sm_clock_mhz"))


def nvmlDeviceGetSerial(handle):
    return str(_optional(_call(handle, "nvmlDeviceGetSerial"), "serial"))


def nvmlDeviceGetBoardPartNumber(handle):
    return str(_optional(_call(handle, "nvmlDeviceGetBoardPartNumber"), "board_part_number"))


def nvmlDeviceGetVbiosVersion(handle):
    return str(_optional(_call(handle, "nvmlDeviceGetVbiosVersion"), "vbios"))


def nvmlDeviceGetPersistenceMode(handle):
    enabled = _optional(_call(handle, "nvmlDeviceGetPersistenceMode"), "persistence_mode")
    return NVML_FEATURE_ENABLED if enabled else NVML_FEATURE_DISABLED


def nvmlDeviceGetEccMode(handle):
    """[current, pending], as NVML: a change of ECC mode waits for a reboot."""
    gpu = _call(handle, "nvmlDeviceGetEccMode")
    current = _optional(gpu, "ecc_mode") == "enabled"
    pending = gpu.get("ecc_mode_pending", gpu["ecc_mode"]) == "enabled"
    return [
        NVML_FEATURE_ENABLED if current else NVML_FEATURE_DISABLED,
        NVML_FEATURE_ENABLED if pending else NVML_FEATURE_DISABLED,
    ]


def _pcie(handle, function, key):
    return int(_optional(_optional(_call(handle, function), "pcie"), key))


def nvmlDeviceGetCurrPcieLinkGeneration(handle):
    return _pcie(handle, "nvmlDeviceGetCurrPcieLinkGeneration", "gen")


def nvmlDeviceGetMaxPcieLinkGeneration(handle):
    """The link's maximum (the GPU's and the slot's together): a degraded slot shows here."""
    return _pcie(handle, "nvmlDeviceGetMaxPcieLinkGeneration", "max_gen")


def nvmlDeviceGetGpuMaxPcieLinkGeneration(handle):
    return _pcie(handle, "nvmlDeviceGetGpuMaxPcieLinkGeneration", "gpu_max_gen")


def nvmlDeviceGetCurrPcieLinkWidth(handle):
    return _pcie(handle, "nvmlDeviceGetCurrPcieLinkWidth", "width")


def nvmlDeviceGetMaxPcieLinkWidth(handle):
    return _pcie(handle, "nvmlDeviceGetMaxPcieLinkWidth", "max_width")


def nvmlDeviceGetPcieReplayCounter(handle):
    return _pcie(handle, "nvmlDeviceGetPcieReplayCounter", "replays")


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    """A bit mask; the shape lists the reasons by name (``clock_event_reasons``: ["gpu_idle"],
    ...)."""
    reasons = _optional(
        _call(handle, "nvmlDeviceGetCurrentClocksEventReasons"), "clock_event_reasons"
    )
    mask = 0
    for name in reasons:
        mask |= _CLOCK_EVENT_BITS[name]
    return mask


def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
    return nvmlDeviceGetCurrentClocksEventReasons(handle)


# Live readings.


def nvmlDeviceGetMemoryInfo(handle, version=None):
    gpu = _call(handle, "nvmlDeviceGetMemoryInfo")
    if handle.mig:
        total = handle.mig["memory_total_bytes"]
        used = handle.mig.get("memory_used_bytes", 0)
    else:
        total = gpu["memory_total_bytes"]
        used = gpu.get("memory_used_bytes", 0) + sum(
            p["used_bytes"] for p in gpu.get("processes", [])
        )
    used = min(used, total)
    return SimpleNamespace(total=total, used=used, free=total - used, reserved=0)


def nvmlDeviceGetUtilizationRates(handle):
    gpu = _call(handle, "nvmlDeviceGetUtilizationRates")
    return SimpleNamespace(
        gpu=int(_optional(gpu, "utilization_percent")),
        memory=int(gpu.get("memory_utilization_percent", 0)),
    )


def nvmlDeviceGetTemperature(handle, sensor):
    gpu = _call(handle, "nvmlDeviceGetTemperature")
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(_optional(gpu, "temperature_c"))


def nvmlDeviceGetTemperatureThreshold(handle, threshold):
    gpu = _call(handle, "nvmlDeviceGetTemperatureThreshold")
    if threshold != NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(_optional(gpu, "slowdown_temperature_c"))


def nvmlDeviceGetPowerUsage(handle):
    """Milliwatts, as NVML reports."""
    return int(
        round(float(_optional(_call(handle, "nvmlDeviceGetPowerUsage"), "power_draw_w")) * 1000)
    )


def nvmlDeviceGetEnforcedPowerLimit(handle):
    """Milliwatts, as NVML reports."""
    return int(
        round(
            float(_optional(_call(handle, "nvmlDeviceGetEnforcedPowerLimit"), "power_limit_w"))
            * 1000
        )
    )


def nvmlDeviceGetComputeRunningProcesses(handle):
    gpu = _call(handle, "nvmlDeviceGetComputeRunningProcesses")
    return [
        SimpleNamespace(
            pid=p["pid"],
            usedGpuMemory=p["used_bytes"],
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )
        for p in gpu.get("processes", [])
    ]


def nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp):
    """One sample per process that has an ``sm_util`` in the shape; NotFound when there is none, as
    NVML."""
    gpu = _call(handle, "nvmlDeviceGetProcessUtilization")
    now_us = int(time.time() * 1e6)
    samples = [
        SimpleNamespace(
            pid=p["pid"],
            timeStamp=now_us,
            smUtil=int(p["sm_util"]),
            memUtil=int(p.get("mem_util", 0)),
            encUtil=0,
            decUtil=0,
        )
        for p in gpu.get("processes", [])
        if p.get("sm_util") is not None
    ]
    if not samples:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return samples


# Health.


def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):
    gpu = _call(handle, "nvmlDeviceGetTotalEccErrors")
    if errorType != NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        return int(gpu.get("ecc_corrected_volatile", 0))
    return int(
        _optional(
            gpu,
            "ecc_uncorrected_volatile"
            if counterType == NVML_VOLATILE_ECC
            else "ecc_uncorrected_aggregate",
        )
    )


def nvmlDeviceGetRetiredPagesPendingStatus(handle):
    pending = _optional(
        _call(handle, "nvmlDeviceGetRetiredPagesPendingStatus"), "retired_pages_pending"
    )
    return NVML_FEATURE_ENABLED if pending else NVML_FEATURE_DISABLED


def nvmlDeviceGetRemappedRows(handle):
    rows = _optional(_call(handle, "nvmlDeviceGetRemappedRows"), "remapped_rows")
    return (
        int(rows.get("correctable", 0)),
        int(rows.get("uncorrectable", 0)),
        int(bool(rows.get("pending"))),
        int(bool(rows.get("failure"))),
    )


# MIG.


def nvmlDeviceGetMigMode(handle):
    gpu = _call(handle, "nvmlDeviceGetMigMode")
    mode = _optional(gpu, "mig_mode")
    pending = gpu.get("mig_mode_pending", mode)
    return [
        NVML_DEVICE_MIG_ENABLE if m == "enabled" else NVML_DEVICE_MIG_DISABLE
        for m in (mode, pending)
    ]


def nvmlDeviceGetMaxMigDeviceCount(handle):
    gpu = _call(handle, "nvmlDeviceGetMaxMigDeviceCount")
    if gpu.get("mig_mode") is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(device, index):
    gpu = _call(device, "nvmlDeviceGetMigDeviceHandleByIndex")
    migs = gpu.get("mig_devices") or []
    if gpu.get("mig_mode") != "enabled" or not 0 <= index < len(migs):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _Handle(index, gpu, mig=migs[index])


# NVML_GPU_INSTANCE_PROFILE_* index -> (the profile's id on an A100 or H100, as nvidia-smi's
# "Profile ID" shows it, compute slices, memory slots): an id is not its index.
_GI_PROFILES = {
    NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, 1, 1),
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (15, 1, 2),
    NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, 2, 2),
    NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, 3, 4),
    NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, 4, 4),
    NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, 7, 8),
}


def _gpu_instance_profile(compute, size):
    """The profile id of a plain GPU instance profile of `compute` slices and `size` slots."""
    for profile_id, slices, slots in _GI_PROFILES.values():
        if (slices, slots) == (compute, size):
            return profile_id
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetGpuInstanceProfileInfo(device, profile, version=2):
    """{id, sliceCount, memorySizeMB} of a GPU instance profile (an NVML_GPU_INSTANCE_PROFILE_*
    index) on a GPU in MIG mode."""
    gpu = _call(device, "nvmlDeviceGetGpuInstanceProfileInfo")
    if gpu.get("mig_mode") != "enabled" or profile not in _GI_PROFILES:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    profile_id, slices, slots = _GI_PROFILES[profile]
    memory_mb = gpu["memory_total_bytes"] // 8 * slots // 2**20
    return SimpleNamespace(id=profile_id, sliceCount=slices, memorySizeMB=memory_mb)


class _GpuInstance:
    """A GPU instance handle: the GPU and the MIG device dict it is."""

    def __init__(self, gpu, mig):
        self.gpu = gpu
        self.mig = mig


def nvmlDeviceGetGpuInstanceId(device):
    """The GPU instance id of a MIG device: its position in the GPU's mig_devices, from 1."""
    _call(device, "nvmlDeviceGetGpuInstanceId")
    if not device.mig or "start" not in device.mig:
        raise NVMLError(NVML_ERROR_NOT_FOUND if device.mig else NVML_ERROR_INVALID_ARGUMENT)
    return device.gpu["mig_devices"].index(device.mig) + 1


def nvmlDeviceGetGpuInstanceById(device, gpu_instance_id):
    gpu = _call(device, "nvmlDeviceGetGpuInstanceById")
    migs = gpu.get("mig_devices") or []
    if gpu.get("mig_mode") != "enabled" or not 1 <= gpu_instance_id <= len(migs):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _GpuInstance(gpu, migs[gpu_instance_id - 1])


def nvmlGpuInstanceGetInfo(gpu_instance):
    """{id, profileId, placement: {start, size}} as pynvml's c_nvmlGpuInstanceInfo_t reads."""
    mig, gpu = gpu_instance.mig, gpu_instance.gpu
    made = gpu.get("mig_devices", []) + gpu.get("_pending_instances", [])  # with compute or not
    return SimpleNamespace(
        id=made.index(mig) + 1,
        profileId=_gpu_instance_profile(int(mig["profile"].split("g.")[0]), mig["size"]),
        placement=SimpleNamespace(start=mig["start"], size=mig["size"]),
    )


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):  # noqa: N801 - pynvml's name
    """A placement, as pynvml's ctypes structure of the same name."""

    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


def nvmlDeviceCreateGpuInstanceWithPlacement(device, profileId, placement):  # noqa: N803
    """A GPU instance of the profile `profileId` at `placement` (pynvml passes it by pointer);
    NVML_ERROR_INSUFFICIENT_RESOURCES where it overlaps one that exists. It holds no MIG device
    until a compute instance is made in it."""
    gpu = _call(device, "nvmlDeviceCreateGpuInstanceWithPlacement")
    place = getattr(placement, "_obj", placement)
    start, size = int(place.start), int(place.size)
    profile = next((p for p in _GI_PROFILES.values() if p[0] == profileId), None)
    if gpu.get("mig_mode") != "enabled" or profile is None or profile[2] != size:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    with _lock:
        taken = gpu.setdefault("mig_devices", []) + gpu.setdefault("_pending_instances", [])
        if (
            start < 0
            or start + size > 8
            or any(start < m["start"] + m["size"] and m["start"] < start + size for m in taken)
        ):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        name = profile_at(gpu["name"], profile[1], size, gpu["memory_total_bytes"])
        instance = {"profile": name, "start": start, "size": size, "compute": profile[1]}
        gpu["_pending_instances"].append(instance)
    return _GpuInstance(gpu, instance)


def nvmlGpuInstanceGetComputeInstanceProfileInfo(device, profile, engProfile, version=2):  # noqa: N803
    """{id, sliceCount} of a compute instance profile of a GPU instance (`device` in pynvml)."""
    _call_gpu(device.gpu, "nvmlGpuInstanceGetComputeInstanceProfileInfo")
    slices = {0x0: 1, 0x1: 2, 0x2: 3, 0x3: 4, 0x4: 7}.get(profile)
    if slices is None or slices > device.mig.get("compute", 0):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return SimpleNamespace(id=profile, sliceCount=slices)


def nvmlGpuInstanceCreateComputeInstance(gpuInstance, profileId):  # noqa: N803
    """A compute instance over the whole GPU instance: the MIG device appears (a new uuid)."""
    gpu_instance = gpuInstance
    gpu = _call_gpu(gpu_instance.gpu, "nvmlGpuInstanceCreateComputeInstance")
    mig = gpu_instance.mig
    with _lock:
        if mig not in gpu.get("_pending_instances", []):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)  # it has one already
        gpu["_pending_instances"].remove(mig)
        slots = mig["size"]
        mig.update(
            uuid=f"MIG-{gpu['uuid'][4:12]}-{mig['start']:04x}-4000-8000-{len(gpu['mig_devices']):012x}",
            memory_total_bytes=gpu["memory_total_bytes"] // 8 * slots,
        )
        gpu["mig_devices"].append(mig)
    return SimpleNamespace(gpu_instance=gpu_instance)


def nvmlDeviceGetComputeInstanceId(device):
    """The compute instance id of a MIG device: 0, its GPU instance's only one."""
    _call(device, "nvmlDeviceGetComputeInstanceId")
    if not device.mig or "start" not in device.mig:
        raise NVMLError(NVML_ERROR_NOT_FOUND if device.mig else NVML_ERROR_INVALID_ARGUMENT)
    return 0


def nvmlGpuInstanceGetComputeInstanceById(gpuInstance, computeInstanceId):  # noqa: N803
    """The compute instance of a GPU instance (each has one, id 0, while its MIG device exists)."""
    gpu = _call_gpu(gpuInstance.gpu, "nvmlGpuInstanceGetComputeInstanceById")
    if computeInstanceId != 0 or gpuInstance.mig not in gpu.get("mig_devices", []):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return SimpleNamespace(gpu_instance=gpuInstance)


def nvmlComputeInstanceDestroy(computeInstance):  # noqa: N803
    """The compute instance goes, and its MIG device with it; its GPU instance stays."""
    gpu_instance = computeInstance.gpu_instance
    gpu = _call_gpu(gpu_instance.gpu, "nvmlComputeInstanceDestroy")
    with _lock:
        if gpu_instance.mig not in gpu.get("mig_devices", []):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu["mig_devices"].remove(gpu_instance.mig)
        gpu.setdefault("_pending_instances", []).append(gpu_instance.mig)


def nvmlGpuInstanceDestroy(gpuInstance):  # noqa: N803
    """A GPU instance without a compute instance goes (NVML refuses one that still has one)."""
    gpu_instance = gpuInstance
    gpu = _call_gpu(gpu_instance.gpu, "nvmlGpuInstanceDestroy")
    with _lock:
        if gpu_instance.mig in gpu.get("mig_devices", []):
            raise NVMLError(NVML_ERROR_IN_USE)
        if gpu_instance.mig not in gpu.get("_pending_instances", []):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu["_pending_instances"].remove(gpu_instance.mig)


# Topology and NVLink.


def nvmlDeviceGetTopologyCommonAncestor(device1, device2):
    """NVML's level of the closest common ancestor of two GPUs' PCIe paths (NVML_TOPOLOGY_*)."""
    _call(device1, "nvmlDeviceGetTopologyCommonAncestor")
    _call(device2, "nvmlDeviceGetTopologyCommonAncestor")
    with _lock:
        level = fake_topology.common_ancestor(_loaded_shape(), device1.index, device2.index)
    if level is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return level


def _nvlink(handle, function, link):
    """(remote bus id, remote type), or None for an inactive link; raises as NVML does for a GPU
    without NVLink (NotSupported) or a link it does not have (InvalidArgument)."""
    _call(handle, function)
    with _lock:
        links = fake_topology.nvlinks(_loaded_shape(), handle.index)
    if links is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not 0 <= link < len(links):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return links[link]


def nvmlDeviceGetNvLinkState(device, link):
    """NVML_FEATURE_ENABLED for an active link, else NVML_FEATURE_DISABLED."""
    active = _nvlink(device, "nvmlDeviceGetNvLinkState", link) is not None
    return NVML_FEATURE_ENABLED if active else NVML_FEATURE_DISABLED


def nvmlDeviceGetNvLinkRemotePciInfo(device, link):
    """The PCI info of what the link reaches (a GPU, or an NVSwitch on a bus of no GPU)."""
    remote = _nvlink(device, "nvmlDeviceGetNvLinkRemotePciInfo", link)
    if remote is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _pci_info(remote[0])


def nvmlDeviceGetNvLinkRemoteDeviceType(handle, link):
    """NVML_NVLINK_DEVICE_TYPE_GPU or _SWITCH."""
    remote = _nvlink(handle, "nvmlDeviceGetNvLinkRemoteDeviceType", link)
    if remote is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return remote[1]


def fake_pci_devices():
    """Not pynvml: the host's PCIe as the shape describes it, which the real agent reads from sysfs.
    {"gpus": {bus id: (path, numa node)}, "nics": [{name, kind, pci_bus_id, numa_node, pcie}]}."""
    with _lock:
        shape = _loaded_shape()
        gpus = {}
        for index, gpu in enumerate(shape.get("gpus", [])):
            path = fake_topology.pcie_path(shape, index)
            if path is not None and gpu.get("pci_bus_id"):
                gpus[gpu["pci_bus_id"]] = (path, gpu.get("numa_node"))
        return {"gpus": gpus, "nics": fake_topology.nics(shape)}


# Events.


class _EventSet:
    def __init__(self):
        self.handles = []
        self.queue: queue.Queue[SimpleNamespace] = queue.Queue()


def nvmlEventSetCreate():
    _check_init()
    event_set = _EventSet()
    with _lock:
        _event_sets.append(event_set)
    return event_set


def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
    _call(handle, "nvmlDeviceRegisterEvents")
    if eventTypes & nvmlEventTypeXidCriticalError:
        with _lock:
            eventSet.handles.append(handle)


def _pending_xids(event_set):
    with _lock:
        _reload_if_changed()
        for handle in event_set.handles:
            xids = handle.gpu.get("xid_events") or []
            for xid in xids[handle.xids_delivered :]:
                event_set.queue.put(
                    SimpleNamespace(
                        device=handle,
                        eventType=nvmlEventTypeXidCriticalError,
                        eventData=int(xid),
                        gpuInstanceId=0xFFFFFFFF,
                        computeInstanceId=0xFFFFFFFF,
                    )
                )
            handle.xids_delivered = len(xids)


def nvmlEventSetWait_v2(eventSet, timeoutms):
    """The next XID event, or NVMLError_Timeout after `timeoutms`."""
    _check_init()
    _pending_xids(eventSet)
    try:
        return eventSet.queue.get(timeout=max(0, timeoutms) / 1000)
    except queue.Empty:
        raise NVMLError(NVML_ERROR_TIMEOUT) from None


def nvmlEventSetWait(eventSet, timeoutms):
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet):
    with _lock:
        if eventSet in _event_sets:
            _event_sets.remove(eventSet)


# Helpers for tests in the same process.


def _device(index):
    with _lock:
        _check_init()
        return _devices[index]


def add_process(index, pid, used_bytes, sm_util=None):
    """Say that process `pid` now uses `used_bytes` on GPU `index` (0 bytes removes it), at
    `sm_util` percent."""
    with _lock:
        gpu = _device(index).gpu
        procs = [p for p in gpu.get("processes", []) if p["pid"] != pid]
        if used_bytes:
            entry = {"pid": pid, "used_bytes": int(used_bytes)}
            if sm_util is not None:
                entry["sm_util"] = int(sm_util)
            procs.append(entry)
        gpu["processes"] = procs


def inject_xid(index, xid):
    """Queue an XID event on GPU `index` for every event set watching it."""
    with _lock:
        gpu = _device(index).gpu
        gpu["xid_events"] = list(gpu.get("xid_events") or []) + [int(xid)]


def update_gpu(index, **fields):
    """Change readings or health fields of GPU `index` (e.g. lost=True, temperature_c=95)."""
    with _lock:
        _device(index).gpu.update(fields)


def reset():
    """Forget all state (between tests in one process)."""
    global _shape_path, _shape, _mtime, _initialized, _devices
    with _lock:
        _shape_path, _shape, _mtime, _initialized, _devices = None, None, None, 0, []
        _event_sets.clear()
