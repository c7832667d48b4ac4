"""A fleet's MIG setting and what placement makes of it (issue 50).

`fleet.mig` is {mode, layout?}: "off", its nodes' GPUs in MIG mode take no work at all (neither
MIG work nor whole-GPU work: a GPU in MIG mode cannot run it); "fixed", they take MIG work on the
MIG devices they have, and where a `layout` names a GPU model's profiles, the validation gate
fails a node whose GPUs of that model have other devices; "dynamic", as fixed, and the agent may
repartition an idle GPU to the profiles the queue needs (services/placement/mig_plan.py), not again
within `settle_seconds`. None (not set) is fixed without a layout.
"""

import functools

from fleetd import scheduler
from fleetd.scheduler.mig import SliceProfile
from fleetwire.mig import layout_fits, profiles_of, valid_placement

MIG_MODES = ("off", "fixed", "dynamic")
DEFAULT_MIG = {"mode": "fixed"}
MAX_LAYOUT_MODELS = 32
DEFAULT_SETTLE_SECONDS = 300
MIN_SETTLE_SECONDS, MAX_SETTLE_SECONDS = 0, 86_400


def mig_setting_error(value) -> str | None:
    """Why a fleet's `mig` setting is refused, or None. A layout names, per GPU model as nodes
    report it (`gpus[].model`, its memory spelled: "NVIDIA A100-SXM4-80GB"), profiles of that model
    that fit on one GPU together; it goes with mode fixed only. `settle_seconds` goes with mode
    dynamic only."""
    if not isinstance(value, dict) or set(value) - {"mode", "layout", "settle_seconds"}:
        return (
            "mig must be {mode: off | fixed | dynamic, layout?: {<gpu model>: [profile, ...]}, "
            "settle_seconds?}"
        )
    mode, layout = value.get("mode"), value.get("layout")
    if mode not in MIG_MODES:
        return f"mig.mode must be one of {', '.join(MIG_MODES)}"
    settle = value.get("settle_seconds")
    if settle is not None:
        if mode != "dynamic":
            return "mig.settle_seconds goes with mode dynamic only"
        if (
            not isinstance(settle, int)
            or isinstance(settle, bool)
            or not MIN_SETTLE_SECONDS <= settle <= MAX_SETTLE_SECONDS
        ):
            return f"mig.settle_seconds must be an integer from 0 to {MAX_SETTLE_SECONDS}"
    if layout is None:
        return None
    if mode != "fixed":
        return "mig.layout goes with mode fixed only"
    if not isinstance(layout, dict) or not 1 <= len(layout) <= MAX_LAYOUT_MODELS:
        return f"mig.layout must map 1 to {MAX_LAYOUT_MODELS} GPU models to their profiles"
    for model, profiles in layout.items():
        if (
            not isinstance(profiles, list)
            or not profiles
            or not all(isinstance(p, str) for p in profiles)
        ):
            return f"mig.layout[{model!r}] must be a non-empty list of profile names"
        table = profiles_of(model)
        if not table:
            return (
                f"mig.layout: {model!r} is not a MIG-capable GPU model fleetd knows (A100 "
                "40GB/80GB, H100 80GB/94GB, H200; the model as nodes report it, its memory "
                "spelled)"
            )
        unknown = sorted(set(profiles) - set(table))
        if unknown:
            return (
                f"mig.layout[{model!r}]: {', '.join(unknown)} not a profile of this model "
                f"(it has {', '.join(sorted(table))})"
            )
        if not layout_fits(model, profiles):
            return f"mig.layout[{model!r}]: {', '.join(profiles)} do not fit on one GPU together"
    return None


def layout_mismatches(setting, gpus):
    """[(gpu, expected profiles, found profiles)] for each GPU in MIG mode (rows with index, model,
    mig_mode and mig_devices) whose MIG devices are not exactly the fleet's fixed layout for its
    model; [] without a layout."""
    layout = (setting or {}).get("layout") or {}
    out = []
    for gpu in gpus:
        want = layout.get(gpu.model)
        if want is None or gpu.mig_mode != "enabled":
            continue
        found = sorted(str(d.get("profile")) for d in gpu.mig_devices or ())
        if found != sorted(want):
            out.append((gpu, sorted(want), found))
    return out


def settle_seconds(setting) -> int:
    """A dynamic fleet's settle time: no repartition of a GPU within it of the last."""
    value = (setting or {}).get("settle_seconds")
    return DEFAULT_SETTLE_SECONDS if value is None else int(value)


def table_mismatches(gpus):
    """[(gpu, what is wrong)] for each GPU in MIG mode (rows as layout_mismatches takes) whose MIG
    devices are not all profiles of its model at placements the profile table allows (a dynamic
    fleet's check: its layouts change, its table does not)."""
    out = []
    for gpu in gpus:
        if gpu.mig_mode != "enabled":
            continue
        table = profiles_of(gpu.model, gpu.memory_total_bytes)
        if not table:
            out.append((gpu, f"fleetd knows no MIG profiles of {gpu.model}"))
            continue
        wrong = [
            f"{d.get('profile') or 'unknown'}@{d.get('start')}"
            for d in gpu.mig_devices or ()
            if d.get("profile") not in table
            or not valid_placement(table[d["profile"]], d.get("start"), d.get("size"))
        ]
        if wrong:
            out.append((gpu, f"MIG devices not in its profile table: {', '.join(wrong)}"))
    return out


@functools.lru_cache(maxsize=64)
def slice_profiles(model, memory_total_bytes=None):
    """A GPU model's MIG profile table as the dynamic MIG planner takes it (fleetwire.mig's)."""
    return tuple(
        SliceProfile(p.name, p.compute, p.size, p.starts)
        for p in profiles_of(model, memory_total_bytes).values()
    )


def mig_setting(fleet) -> dict:
    """The fleet's MIG setting in force (the default for a fleet without one, or no fleet)."""
    return (fleet.mig if fleet is not None else None) or DEFAULT_MIG


def mig_slices(devices, fleet, node_id, held):
    """A GPU's MIG devices as the engine sees them: None outside MIG mode, none where the fleet's
    MIG mode is off, else each with whether a task holds it (`held` keys (node id, MIG uuid))."""
    if devices is None:
        return None
    if mig_setting(fleet)["mode"] == "off":
        return ()
    return tuple(
        scheduler.MigSlice(d.uuid, d.profile, free=(node_id, d.uuid) not in held) for d in devices
    )
