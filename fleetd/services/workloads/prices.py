"""What an instance's run costs per hour: the bid for spot, else its GPU type's price; set when it
is placed or resumed, and changed from now on when its GPU type is repriced."""

from fleetd.models import (
    Gpu,
    GpuType,
    Instance,
    InstanceState,
    Task,
)
from fleetd.services.notify.events import record_event
from fleetd.services.workloads.lifecycle import (
    accrue_cost,
)

# Why a task ended -> the retry condition it counts as.


def price_per_hour(spec, gpus):
    """Per hour: the bid (per GPU-hour) for spot, else the GPU type's price; None when unpriced."""
    count = spec.resources.gpus
    if not count or not gpus:
        return None
    if spec.priority_class == "spot" and spec.bid is not None:
        return spec.bid * count
    row = Gpu.select(Gpu.model).where(Gpu.uuid == gpus[0]["uuid"]).first()
    price = GpuType.get_or_none(GpuType.model == row.model) if row is not None else None
    return None if price is None or price.price_per_hour is None else price.price_per_hour * count


def resumed_price(inst, spec):
    """Per hour, the run that resumes `inst` with `spec`: it runs on the node that keeps its volume,
    so its price (the bid for spot, else that node's GPU type's price) is known before it is placed;
    None when unpriced or that node holds no GPU."""
    gpu = Gpu.select(Gpu.uuid).where(Gpu.node == inst.node_id).first() if inst.node_id else None
    return price_per_hour(spec, [{"uuid": gpu.uuid}] if gpu is not None else [])


def reprice_instances(model, now):
    """The prices of GPU model `model` changed (inside the caller's transaction): the instances
    whose current run holds GPUs of it pay the new price from `now`, their cost so far kept at the
    old one."""
    live = [
        InstanceState.STARTING.value,
        InstanceState.RUNNING.value,
        InstanceState.RESTARTING.value,
        InstanceState.STOPPING.value,
        InstanceState.INTERRUPTED.value,
    ]
    for inst in Instance.select().where(Instance.state.in_(live) & Instance.run_id.is_null(False)):
        task = Task.select(Task.gpus).where(Task.job == inst.run_id).first()
        gpus = (task.gpus if task is not None else None) or []
        row = Gpu.select(Gpu.model).where(Gpu.uuid == gpus[0]["uuid"]).first() if gpus else None
        price = (
            price_per_hour(inst.instance_spec, gpus)
            if row is not None and row.model == model
            else inst.price_per_hour
        )
        if price == inst.price_per_hour:
            continue
        accrue_cost(inst, now)  # the time run so far, at the old price
        record_event(
            now,
            "instance.price",
            "instance",
            inst.id,
            f"price per hour {inst.price_per_hour} -> {price} from now (GPU type {model} repriced)",
        )
        inst.price_per_hour = price
        inst.save()
