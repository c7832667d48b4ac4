"""The validation gate's MIG layout check (issue 50), run by fleetd on the inventory the node's
agent reported: in a fleet whose `mig` is fixed with a layout, each GPU in MIG mode of a model the
layout names has exactly the layout's profiles; in a dynamic fleet, whose layouts change, each GPU
in MIG mode has only profiles of its model's table at placements the table allows
(services/placement/mig.py)."""

from fleetd.models import Gpu, Node
from fleetd.services.fleet_ops.fleets import fleet_column
from fleetd.services.placement.mig import layout_mismatches, table_mismatches
from fleetd.sql import Statement

CHECK = "mig_layout"

_GPUS_OF = Statement(
    lambda v: (
        Gpu.select(
            Gpu.index, Gpu.uuid, Gpu.model, Gpu.memory_total_bytes, Gpu.mig_mode, Gpu.mig_devices
        )
        .where(Gpu.node == v("node"))
        .order_by(Gpu.index)
    )
)
_FLEET_OF = Statement(lambda v: Node.select(Node.fleet).where(Node.id == v("node")))


def mig_layout_checks(node_id):
    """The check's results: one failure per GPU whose MIG devices differ from the layout (in a
    dynamic fleet: that its model's profile table does not allow), naming it; else one pass; []
    where the node's fleet has no layout."""
    node = _FLEET_OF.first(node=node_id)
    setting = fleet_column(node.fleet_id, "mig") if node is not None else None
    if (setting or {}).get("mode") == "dynamic":
        return _results(
            (
                (gpu, f"GPU {gpu.index} ({gpu.uuid}, {gpu.model}): {why}")
                for gpu, why in table_mismatches(_GPUS_OF.rows(node=node_id))
            ),
            "every MIG GPU has only profiles of its model at placements its table allows",
        )
    if not (setting or {}).get("layout"):
        return []
    return _results(
        (
            (
                gpu,
                f"GPU {gpu.index} ({gpu.uuid}, {gpu.model}) has MIG devices "
                f"[{', '.join(found) or 'none'}], the fleet's layout wants [{', '.join(want)}]",
            )
            for gpu, want, found in layout_mismatches(setting, _GPUS_OF.rows(node=node_id))
        ),
        "every MIG GPU of a model in the fleet's layout has the layout's devices",
    )


def _results(failures, passed_detail):
    """One failed result per (gpu, detail) of `failures`; else one passed result."""
    failed = [
        {
            "name": CHECK,
            "gpu": gpu.index,
            "uuid": gpu.uuid,
            "status": "failed",
            "passed": False,
            "detail": detail,
        }
        for gpu, detail in failures
    ]
    return failed or [
        {"name": CHECK, "gpu": None, "status": "passed", "passed": True, "detail": passed_detail}
    ]
