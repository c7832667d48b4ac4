"""The built-in validation checks: NVML readings in, one result per check and GPU out.

fleetd sends a suite (which checks, and what to expect: the GPU count, the fleet's driver and CUDA
versions or a pin, the MIG mode, the hottest idle temperature, the PCIe width); agent/validator.py
reads the GPUs (DeviceManager.validation_readings), runs DCGM and the fleet's command, and posts
what these functions decide. A reading the driver answers NotSupported is reported
(`not_supported`), never failed; a reading that fails otherwise fails its check, saying why.

A result: {name, gpu (index, or None for the node), uuid?, serial?, status: passed | failed |
not_supported | skipped, detail}.
"""

import dataclasses

from agent.nvml import Unread

# Clock event reasons that are not slowdowns: an idle GPU drops its clocks, an operator may set
# applications clocks, a display may ask for its clock.
HARMLESS_CLOCK_REASONS = frozenset(
    {"gpu_idle", "applications_clocks_setting", "display_clock_setting"}
)
DEFAULT_PCIE_WIDTH = 16


def result(name, status, detail, device=None):
    """One check's result, for a GPU (`device`, an agent.devices.Device) or the node."""
    out = {"name": name, "gpu": None, "status": status, "detail": detail}
    if device is not None:
        out.update(gpu=device.gpu.index, uuid=device.gpu.uuid)
        if device.gpu.serial:
            out["serial"] = device.gpu.serial
    return out


def _unread(name, value, device):
    """The result for a reading NVML did not give."""
    if value.not_supported:
        return result(
            name, "not_supported", f"not supported by this GPU or driver ({value.reason})", device
        )
    return result(name, "failed", f"NVML could not read it: {value.reason}", device)


def check_gpus_present(suite, inventory, readings):
    """Every expected GPU is there and NVML can read each."""
    count, expected = len(inventory.devices), suite.expected_gpus
    unreadable = [f"GPU {i}: {why}" for i, why in sorted(readings.items()) if isinstance(why, str)]
    unreadable += [
        f"GPU {d.gpu.index}: {d.gpu.health_reason}"
        for d in inventory.devices
        if d.gpu.index not in readings
        and not d.gpu.healthy
        and "unavailable" in d.gpu.health_reason
    ]
    if inventory.reason and not count:
        return [
            result(
                "gpus_present",
                "failed" if expected else "passed",
                f"no GPU: {inventory.reason}" + (f"; expected {expected}" if expected else ""),
            )
        ]
    if count < expected:
        return [result("gpus_present", "failed", f"{count} GPU(s) found, {expected} expected")]
    if unreadable:
        return [result("gpus_present", "failed", "; ".join(unreadable))]
    return [
        result("gpus_present", "passed", f"{count} GPU(s) found, {expected} expected, all readable")
    ]


def check_gpu_health(suite, inventory, readings):
    """No critical XID since the agent started."""
    out = []
    for device in inventory.devices:
        xids = sorted(set(device.gpu.xids))
        out.append(
            result(
                "gpu_health",
                "failed" if xids else "passed",
                f"critical XID {', '.join(map(str, xids))} since the agent started"
                if xids
                else "no critical XID",
                device,
            )
        )
    return out


def _version_check(name, have, want, pinned):
    label = name.replace("_", " ")
    if have is None:
        return [result(name, "not_supported", f"NVML does not report the {label}")]
    if not want:
        return [
            result(
                name, "passed", f"{label} {have} (no validated node of the fleet to compare with)"
            )
        ]
    if have != want:
        source = "pinned by the fleet" if pinned else "what the fleet's validated nodes run"
        return [result(name, "failed", f"{label} {have}, expected {want} ({source})")]
    return [result(name, "passed", f"{label} {have}")]


def check_driver_version(suite, inventory, readings):
    """The driver is the fleet's (its pin, else what most of its validated nodes run)."""
    return _version_check(
        "driver_version", inventory.driver_version, suite.driver_version, suite.driver_pinned
    )


def check_cuda_version(suite, inventory, readings):
    """The CUDA driver version is the fleet's."""
    return _version_check(
        "cuda_version", inventory.cuda_version, suite.cuda_version, suite.cuda_pinned
    )


def _per_gpu(name, inventory, readings, key, decide):
    """decide(value) -> (status, detail) for each readable GPU's reading `key`."""
    out = []
    for device in inventory.devices:
        reading = readings.get(device.gpu.index)
        if not isinstance(reading, dict):
            continue  # unreadable: gpus_present says so
        value = reading.get(key)
        if isinstance(value, Unread):
            out.append(_unread(name, value, device))
        else:
            status, detail = decide(value, reading)
            out.append(result(name, status, detail, device))
    return out


def check_persistence_mode(suite, inventory, readings):
    """Persistence mode is on (the driver stays loaded between processes)."""
    return _per_gpu(
        "persistence_mode",
        inventory,
        readings,
        "persistence_mode",
        lambda on, _r: (
            ("passed", "persistence mode on")
            if on
            else ("failed", "persistence mode off (run nvidia-persistenced, or nvidia-smi -pm 1)")
        ),
    )


def check_ecc_mode(suite, inventory, readings):
    """ECC is on, with no change waiting for a reboot."""

    def decide(mode, _r):
        current, pending = mode
        if not current:
            return "failed", "ECC is off"
        if pending != current:
            return "failed", "an ECC mode change is pending: reboot"
        return "passed", "ECC on"

    return _per_gpu("ecc_mode", inventory, readings, "ecc_mode", decide)


def check_retired_pages(suite, inventory, readings):
    """No retired page waits for a GPU reset (GPUs before Ampere)."""
    return _per_gpu(
        "retired_pages",
        inventory,
        readings,
        "retired_pages_pending",
        lambda pending, _r: (
            ("failed", "retired pages pending: GPU reset required")
            if pending
            else ("passed", "no retired page pending")
        ),
    )


def check_row_remap(suite, inventory, readings):
    """No row remap pending or failed (Ampere and later)."""

    def decide(rows, _r):
        counts = (
            f"{rows['correctable']} correctable, {rows['uncorrectable']} uncorrectable remapped "
            f"row(s)"
        )
        if rows["failure"]:
            return "failed", f"row remapping failed: the GPU needs service ({counts})"
        if rows["pending"]:
            return "failed", f"remapped rows pending: GPU reset required ({counts})"
        return "passed", counts

    return _per_gpu("row_remap", inventory, readings, "remapped_rows", decide)


def check_ecc_errors(suite, inventory, readings):
    """No uncorrectable ECC error since the driver loaded."""
    return _per_gpu(
        "ecc_errors",
        inventory,
        readings,
        "ecc_uncorrected_volatile",
        lambda count, _r: (
            ("failed", f"{count} uncorrectable ECC error(s) since the driver loaded")
            if count
            else ("passed", "no uncorrectable ECC error since the driver loaded")
        ),
    )


def check_pcie_link(suite, inventory, readings):
    """The link's maximum generation is the GPU's and its maximum width the expected one. The
    maximum, not the current: an idle link trains down (its current generation and width are
    shown)."""
    want_width = suite.pcie_width or DEFAULT_PCIE_WIDTH

    def decide(max_gen, reading):
        gpu_gen, width = reading.get("pcie_gpu_max_gen"), reading.get("pcie_max_width")
        now = (
            ""
            if isinstance(reading.get("pcie_gen"), Unread)
            or isinstance(reading.get("pcie_width"), Unread)
            else (
                f"; now Gen{reading['pcie_gen']} x{reading['pcie_width']} (an idle link trains "
                f"down)"
            )
        )
        replays = reading.get("pcie_replays")
        now += "" if isinstance(replays, Unread) or replays is None else f"; {replays} replay(s)"
        problems = []
        if not isinstance(gpu_gen, Unread) and max_gen < gpu_gen:
            problems.append(f"link max Gen{max_gen}, the GPU supports Gen{gpu_gen}")
        if isinstance(width, Unread):
            if not width.not_supported:
                problems.append(f"max link width unreadable ({width.reason})")
        elif width < want_width:
            problems.append(f"max link width x{width}, expected x{want_width}")
        if problems:
            return "failed", "degraded PCIe link: " + "; ".join(problems) + now
        shown = f"x{width}" if not isinstance(width, Unread) else "width not reported"
        return "passed", f"link max Gen{max_gen} {shown}{now}"

    return _per_gpu("pcie_link", inventory, readings, "pcie_max_gen", decide)


def check_clocks_throttle(suite, inventory, readings):
    """Clocks are not held down at idle (the idle reason itself is ignored)."""

    def decide(reasons, _r):
        bad = [r for r in reasons if r not in HARMLESS_CLOCK_REASONS]
        if bad:
            return "failed", f"clocks held down at idle: {', '.join(bad)}"
        return "passed", f"no slowdown ({', '.join(reasons) or 'no clock event'})"

    return _per_gpu("clocks_throttle", inventory, readings, "clock_event_reasons", decide)


def check_temperature(suite, inventory, readings):
    """The idle GPU is cooler than the fleet's limit and its slowdown threshold."""
    limit = suite.max_temperature_c

    def decide(temp, reading):
        slowdown = reading.get("slowdown_temperature_c")
        slowdown = None if isinstance(slowdown, Unread) else slowdown
        if slowdown is not None and temp >= slowdown:
            return "failed", f"{temp} C at or above its slowdown threshold {slowdown} C"
        if limit and temp >= limit:
            return "failed", f"{temp} C idle, the limit is {limit} C"
        return "passed", f"{temp} C" + (f" (slowdown at {slowdown} C)" if slowdown else "")

    return _per_gpu("temperature", inventory, readings, "temperature_c", decide)


def check_mig_mode(suite, inventory, readings):
    """MIG mode is as the fleet configures it, with no change waiting for a GPU reset."""
    want = suite.mig_mode
    out = []
    for device in inventory.devices:
        reading = readings.get(device.gpu.index)
        if not isinstance(reading, dict):
            continue
        mode = reading[
            "mig_mode"
        ]  # a list or an Unread: NvmlSession.validation_readings always reads it
        if isinstance(mode, Unread):
            if want == "enabled" and mode.not_supported:
                out.append(
                    result(
                        "mig_mode",
                        "failed",
                        "the fleet wants MIG enabled; this GPU has no MIG",
                        device,
                    )
                )
            else:
                out.append(_unread("mig_mode", mode, device))
            continue
        current, pending = mode
        if current != pending:
            out.append(
                result(
                    "mig_mode", "failed", f"MIG {current}, {pending} pending a GPU reset", device
                )
            )
        elif want and current != want:
            out.append(
                result("mig_mode", "failed", f"MIG {current}, the fleet wants it {want}", device)
            )
        else:
            out.append(result("mig_mode", "passed", f"MIG {current}", device))
    return out


CHECKS = {
    "gpus_present": check_gpus_present,
    "gpu_health": check_gpu_health,
    "driver_version": check_driver_version,
    "cuda_version": check_cuda_version,
    "persistence_mode": check_persistence_mode,
    "ecc_mode": check_ecc_mode,
    "retired_pages": check_retired_pages,
    "row_remap": check_row_remap,
    "ecc_errors": check_ecc_errors,
    "pcie_link": check_pcie_link,
    "clocks_throttle": check_clocks_throttle,
    "temperature": check_temperature,
    "mig_mode": check_mig_mode,
}


@dataclasses.dataclass(frozen=True)
class Suite:
    """What fleetd asks the node to run (the heartbeat answer's `validation.suite`), read once at
    the edge."""

    checks: tuple = tuple(CHECKS) + ("dcgm",)
    expected_gpus: int = 0
    driver_version: str | None = None
    driver_pinned: bool = False  # driver_version is the fleet's pin, not what its nodes run
    cuda_version: str | None = None
    cuda_pinned: bool = False
    mig_mode: str | None = None
    max_temperature_c: int | None = None
    pcie_width: int | None = None
    dcgm_level: int = 1
    command: tuple = ()
    timeout_seconds: int = 600
    command_as_root: bool = False

    @classmethod
    def from_wire(cls, data):
        """The Suite of a wire dict; unknown keys (a newer fleetd's) are ignored, nulls take the
        defaults."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in (data or {}).items() if k in known and v is not None}
        for key in ("checks", "command"):
            if key in values:
                values[key] = tuple(str(v) for v in values[key])
        return cls(**values)


def run_checks(suite, inventory, readings):
    """The results of the suite's NVML checks (dcgm and the fleet's command run in
    agent/validator.py)."""
    out = []
    for name in suite.checks:
        check = CHECKS.get(name)
        if check is not None:
            out += check(suite, inventory, readings)
    return out
