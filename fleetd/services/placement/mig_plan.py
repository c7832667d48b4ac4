"""Dynamic MIG (issue 50): target layouts for the idle GPUs of fleets whose `mig.mode` is dynamic,
handed to their nodes on the heartbeat answer, and what the agents make of them.

- `plan_mig` (the `mig_planning` background task) runs the pure planner (fleetd/scheduler/mig.py)
  over every GPU in MIG mode of a ready node, under the scheduling pass's lock so that no
  placement lands on a slice while its GPU is planned: a GPU gets a target only when no task holds
  any of its slices. From then until its agent answers, the GPU takes no MIG work
  (services/placement/inventory.py), so no task can be placed on a slice about to go.
- `layouts_for` is what a heartbeat answer carries (`mig_layouts`).
- `apply_mig_events` records what the agent reports (`mig_events`): a change as a `gpu.mig_changed`
  event; a failure as `gpu.mig_failed`, and the GPU blocked (`mig_blocked`): it takes no work and
  is not planned again until an operator clears it (services/nodes/gpus.py); its node is never
  drained for it. A target no agent answered within TARGET_TIMEOUT_SECONDS blocks its GPU too (an
  agent too old to know `mig_layouts`, or one that died half-way).
"""

import datetime as dt
import typing
from collections import Counter

from fleetd.db import write_transaction
from fleetd.models import Fleet, Gpu, Node, NodeStatus, new_id
from fleetd.scheduler.mig import MigGpu, Placed, SliceState, plan_layouts
from fleetd.services.notify.events import FLEETD, acting_as, record_event
from fleetd.services.placement.cluster import ClusterState
from fleetd.services.placement.mig import (
    DEFAULT_MIG,
    mig_setting,
    settle_seconds,
    slice_profiles,
)
from fleetd.sql import Statement
from fleetwire.mig import MigInstance, MigLayout

TARGET_TIMEOUT_SECONDS = 600.0  # a target its agent has not answered by then blocks its GPU
MAX_CHANGES = 32  # GPUs repartitioned by one plan, fleet-wide: churn stays bounded

_MIG_GPUS = Statement(
    lambda v: (
        Gpu.select(
            Gpu.id,
            Gpu.node,
            Gpu.uuid,
            Gpu.index,
            Gpu.model,
            Gpu.memory_total_bytes,
            Gpu.mig_devices,
            Gpu.mig_target,
            Gpu.mig_changed_at,
            Gpu.mig_blocked,
        )
        .join(Node, on=(Gpu.node == Node.id))
        .where((Gpu.mig_mode == "enabled") & (Node.status == NodeStatus.READY.value))
        .order_by(Gpu.node, Gpu.index)
    )
)
_NODE_FLEETS = Statement(
    lambda v: Node.select(Node.id, Node.fleet).where(Node.status == NodeStatus.READY.value)
)
_TARGETS_OF = Statement(
    lambda v: Gpu.select(Gpu.uuid, Gpu.mig_target).where(
        (Gpu.node == v("node")) & Gpu.mig_target.is_null(False) & (Gpu.mig_blocked == "")
    )
)
_EXPIRED = Statement(
    lambda v: Gpu.select().where(Gpu.mig_target.is_null(False) & (Gpu.mig_changed_at < v("before")))
)


def _seconds(when):
    return (
        when.replace(tzinfo=dt.timezone.utc).timestamp()
        if when.tzinfo is None
        else when.timestamp()
    )


def _planner_gpu(row, setting, held):
    """A Gpu row as the planner sees it; `setting` is its fleet's MIG setting. A GPU with a target
    pending has the target's slices (idle): those are what it will offer."""
    dynamic = setting["mode"] == "dynamic"
    if row.mig_target is not None:
        slices = tuple(
            SliceState(i["profile"], i["start"], i["size"]) for i in row.mig_target["instances"]
        )
    else:
        slices = tuple(
            SliceState(
                d.get("profile"),
                d.get("start"),
                d.get("size"),
                busy=(row.node_id, d.get("uuid")) in held,
            )
            for d in row.mig_devices or ()
        )
    return MigGpu(
        uuid=str(row.id),
        profiles=slice_profiles(row.model, row.memory_total_bytes),
        slices=slices,
        blocked=bool(row.mig_blocked),
        pending=row.mig_target is not None,
        changed_at=None if row.mig_changed_at is None else _seconds(row.mig_changed_at),
        settle_seconds=settle_seconds(setting) if dynamic else None,
        fixed=not dynamic,
    )


def _offered(gpus, targets):
    """{profile: idle slices} the GPUs offer once `targets` are applied (blocked GPUs: none)."""
    out: Counter[str] = Counter()
    for gpu in gpus:
        if gpu.uuid in targets:
            out.update(p.profile for p in targets[gpu.uuid])
        elif not gpu.blocked:
            out.update(s.profile for s in gpu.slices if not s.busy and s.profile is not None)
    return out


def _serve(offered, pinned, anywhere):
    """Take `offered` slices off the fleet's own demand first, then off the jobs naming no fleet
    (in place)."""
    for profile, count in offered.items():
        own = min(count, pinned.get(profile, 0))
        pinned[profile] = pinned.get(profile, 0) - own
        anywhere[profile] = max(0, anywhere.get(profile, 0) - (count - own))


def plan_mig(rt):
    """One planning run: targets for idle GPUs of dynamic fleets where the queue wants other
    slices, and a block for targets no agent answered in time. Returns {planned, expired}.

    A job that names a fleet counts only there. The slices fixed fleets offer are taken off the
    demand first; then each dynamic fleet, by name, is planned for its own jobs and those naming
    no fleet that are still unmet, and what it will offer is taken off them."""
    if not rt.leader.leading():
        return {"planned": 0, "expired": 0, "skipped": "this replica does not lead"}
    with rt.pass_lock, acting_as(FLEETD):
        now = rt.clock.now()
        expired = _expire_targets(now)
        settings = {f.name: mig_setting(f) for f in Fleet.select(Fleet.name, Fleet.mig)}
        if not any(s["mode"] == "dynamic" for s in settings.values()):
            return {"planned": 0, "expired": expired}
        fleet_of = {node.id: node.fleet_id for node in _NODE_FLEETS.rows()}
        state = ClusterState(
            rt.terms, now, inventory=rt.inventory.get(), reservations=rt.reservations
        )
        demand = state.queued_mig_demand()
        rows: dict[str, typing.Any] = {}
        by_fleet: dict[str, list[MigGpu]] = {}
        for row in _MIG_GPUS.rows():
            fleet = fleet_of.get(row.node_id) or ""
            setting = settings.get(fleet) or DEFAULT_MIG
            if setting["mode"] != "off":  # the slices of a fleet with MIG off take no work
                rows[str(row.id)] = row
                by_fleet.setdefault(fleet, []).append(_planner_gpu(row, setting, state.held))
        anywhere = dict(demand.get(None, {}))
        dynamic = sorted(f for f in by_fleet if (settings.get(f) or {}).get("mode") == "dynamic")
        for fleet in sorted(set(by_fleet) - set(dynamic)):
            _serve(_offered(by_fleet[fleet], {}), dict(demand.get(fleet, {})), anywhere)
        targets: dict[str, tuple[Placed, ...]] = {}
        for fleet in dynamic:
            pinned = dict(demand.get(fleet, {}))
            wanted = Counter(pinned) + Counter(anywhere)
            if not wanted:
                continue
            planned = plan_layouts(
                by_fleet[fleet], wanted, _seconds(now), 0, MAX_CHANGES - len(targets)
            )
            targets.update(planned)
            _serve(_offered(by_fleet[fleet], planned), pinned, anywhere)
        if targets:
            with write_transaction():
                for key, layout in targets.items():
                    _set_target(rows[key], layout, now)
    return {"planned": len(targets), "expired": expired}


def _set_target(row, layout, now):
    """Give one GPU its target layout, with an Event on its node (inside the transaction)."""
    plan = new_id()
    target = {
        "plan": plan,
        "instances": [{"profile": p.profile, "start": p.start, "size": p.size} for p in layout],
    }
    Gpu.update(mig_target=target, mig_changed_at=now).where(Gpu.id == row.id).execute()
    found = sorted(str(d.get("profile")) for d in row.mig_devices or ()) or ["none"]
    record_event(
        now,
        "gpu.mig_planned",
        "node",
        row.node_id,
        f"GPU {row.index} ({row.uuid}): repartition planned from [{', '.join(found)}] to "
        f"[{', '.join(p.profile for p in layout)}] for queued MIG work",
        data={"gpu_uuid": row.uuid, "plan": plan, "layout": target["instances"]},
    )


def _expire_targets(now):
    """Block each GPU whose target its agent has not answered within TARGET_TIMEOUT_SECONDS."""
    before = now - dt.timedelta(seconds=TARGET_TIMEOUT_SECONDS)
    rows = _EXPIRED.rows(before=before)
    if not rows:
        return 0
    with write_transaction():
        for row in rows:
            _block(
                row,
                f"its agent did not apply MIG layout {row.mig_target.get('plan')} within "
                f"{TARGET_TIMEOUT_SECONDS:.0f} s (an agent without dynamic MIG, or one that died)",
                now,
            )
    return len(rows)


def _block(gpu, reason, now):
    """A failed repartition: the GPU takes no work and is not planned until an operator clears it
    (its node is untouched)."""
    plan = (gpu.mig_target or {}).get("plan")
    Gpu.update(mig_target=None, mig_blocked=reason[:1000]).where(Gpu.id == gpu.id).execute()
    record_event(
        now,
        "gpu.mig_failed",
        "node",
        gpu.node_id,
        f"GPU {gpu.index} ({gpu.uuid}) blocked: MIG repartition failed: {reason}",
        data={"gpu_uuid": gpu.uuid, "plan": plan, "serial": gpu.serial},
    )


def layouts_for(node_id):
    """The target layouts a heartbeat answer gives this node (fleetwire MigLayout), one per GPU of
    it with a target pending."""
    return tuple(
        MigLayout(
            row.uuid,
            row.mig_target["plan"],
            tuple(MigInstance(**i) for i in row.mig_target["instances"]),
        )
        for row in _TARGETS_OF.rows(node=node_id)
    )


def apply_mig_events(node, events, now):
    """Record what the node's agent made of its targets (inside the heartbeat's transaction); a
    result for a target no longer pending (answered already, or expired) is dropped. True when a
    GPU's slices may take work again (capacity changed)."""
    changed = False
    for event in events:
        gpu = Gpu.get_or_none((Gpu.node == node.id) & (Gpu.uuid == event.gpu_uuid))
        if gpu is None or (gpu.mig_target or {}).get("plan") != event.plan:
            continue
        want = ", ".join(i["profile"] for i in gpu.mig_target["instances"])
        why = event.detail or "a slice is busy"
        if not event.ok and not event.busy:
            _block(gpu, event.detail or "the agent gave no reason", now)
            continue
        Gpu.update(mig_target=None).where(Gpu.id == gpu.id).execute()
        changed = True
        record_event(
            now,
            "gpu.mig_changed" if event.ok else "gpu.mig_skipped",
            "node",
            node.id,
            f"GPU {gpu.index} ({gpu.uuid}) repartitioned to [{want}]"
            if event.ok
            else f"GPU {gpu.index} ({gpu.uuid}) left as it was: {why}",
            data={"gpu_uuid": gpu.uuid, "plan": event.plan, "serial": gpu.serial},
        )
    return changed
