"""A fleet's MIG setting and what placement makes of it (issue 50).

`fleet.mig` is {mode, layout?}: "off", its nodes' GPUs in MIG mode take no work at all (neither
MIG work nor whole-GPU work: a GPU in MIG mode cannot run it); "fixed", they take MIG work on the
MIG devices they have, and where a `layout` names a GPU model's profiles, the validation gate
fails a node whose GPUs of that model have other devices; "dynamic", as fixed, and the agent may
repartition an idle GPU to the profiles the queue needs. None (not set) is fixed without a layout.
"""

from fleetd import scheduler

MIG_MODES = ("off", "fixed", "dynamic")
DEFAULT_MIG = {"mode": "fixed"}


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
