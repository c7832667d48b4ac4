"""A fleet's MIG setting and what placement makes of it (issue 50).

`fleet.mig` is {mode, layout?}: "off", its nodes' GPUs in MIG mode take no work at all (neither
MIG work nor whole-GPU work: a GPU in MIG mode cannot run it); "fixed", they take MIG work on the
MIG devices they have, and where a `layout` names a GPU model's profiles, the validation gate
fails a node whose GPUs of that model have other devices; "dynamic", as fixed, and the agent may
repartition an idle GPU to the profiles the queue needs. None (not set) is fixed without a layout.
"""

from fleetd import scheduler
from fleetwire.mig import layout_fits, profiles_of

MIG_MODES = ("off", "fixed", "dynamic")
DEFAULT_MIG = {"mode": "fixed"}
MAX_LAYOUT_MODELS = 32
DYNAMIC_REFUSED = "dynamic MIG is not available yet: use fixed (the slices as found) or off"


def mig_setting_error(value) -> str | None:
    """Why a fleet's `mig` setting is refused, or None. A mode that does nothing is refused:
    dynamic (repartitioning idle GPUs) is not built. A layout names, per GPU model as nodes report
    it (`gpus[].model`, its memory spelled: "NVIDIA A100-SXM4-80GB"), profiles of that model that
    fit on one GPU together; it goes with mode fixed only."""
    if not isinstance(value, dict) or set(value) - {"mode", "layout"}:
        return "mig must be {mode: off | fixed, layout?: {<gpu model>: [profile, ...]}}"
    mode, layout = value.get("mode"), value.get("layout")
    if mode not in MIG_MODES:
        return f"mig.mode must be one of {', '.join(MIG_MODES)}"
    if mode == "dynamic":
        return DYNAMIC_REFUSED
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
