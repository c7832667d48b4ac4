"""Admin policy for scheduling: GPU type prices, team quotas; and schedule simulation."""

from fleetd import scheduler
from fleetd.db import write_transaction
from fleetd.errors import Forbidden, InvalidRequest, NotFound
from fleetd.models import Fleet, GpuType, Quota
from fleetd.services.accounting.ledger import record_price
from fleetd.services.accounting.periods import GPU
from fleetd.services.placement.cluster import current_state
from fleetd.services.placement.parking import team_allowance
from fleetd.services.placement.scheduling import Rules
from fleetd.services.placement.terms import task_request
from fleetd.services.workloads.prices import reprice_instances


def set_gpu_type(rt, model, price_per_hour=None, spot_min_bid=None):
    """Create or change the prices of a GPU model; the instances on its GPUs pay the new price from
    now."""
    now = rt.clock.now()
    with write_transaction():
        row = GpuType.get_or_none(GpuType.model == model)
        if row is None:
            row = GpuType.create(
                model=model, price_per_hour=price_per_hour, spot_min_bid=spot_min_bid
            )
        else:
            previous = row.price_per_hour
            row.price_per_hour, row.spot_min_bid = price_per_hour, spot_min_bid
            row.save()
            if previous == price_per_hour:
                return row
        record_price(now, GPU, model, price_per_hour)  # the usage ledger prices runs piecewise
        reprice_instances(model, now)
    return row


def delete_gpu_type(rt, model):
    """Forget the prices of a GPU model; the instances on its GPUs are unpriced from now."""
    now = rt.clock.now()
    with write_transaction():
        if not GpuType.delete().where(GpuType.model == model).execute():
            raise NotFound(f"GPU type {model!r} has no prices set")
        record_price(now, GPU, model, None)
        reprice_instances(model, now)


def check_image(image, fleet=None):
    """InvalidRequest (400) when an instance's image may not run where it asks to: a fleet it names
    whose allowed_images match none of it, or, when it names none, every fleet refuses it (it is
    then placed only in fleets that allow it). An unknown fleet is not checked here (nothing could
    hold it)."""
    if not image:
        return
    rows = [
        row
        for row in Fleet.select(Fleet.name, Fleet.allowed_images)
        if fleet is None or row.name == fleet
    ]
    if not rows or any(scheduler.image_allowed(image, tuple(row.allowed_images)) for row in rows):
        return
    patterns = {row.name: list(row.allowed_images) for row in rows}
    if fleet is not None:
        message = (
            f"image {image!r} is not allowed in fleet {fleet!r}: it matches none of its "
            f"allowed_images {patterns[fleet]}"
        )
    else:
        message = (
            f"image {image!r} is not allowed in any fleet: it matches none of their allowed_images "
            f"(" + "; ".join(f"{name}: {p}" for name, p in sorted(patterns.items())) + ")"
        )
    raise InvalidRequest(
        message,
        {
            "fields": {"image": ["not allowed by the fleet's allowed_images"]},
            "image": image,
            "allowed_images": patterns,
        },
    )


def list_quotas():
    return list(Quota.select().order_by(Quota.team, Quota.priority_class))


def set_quota(rt, team, priority_class, max_gpus):
    """Set a team's GPU quota for a priority class ("any" counts every class); a raised quota may
    let queued work fit (the scheduler is kicked)."""
    with write_transaction():
        Quota.insert(team=team, priority_class=priority_class, max_gpus=max_gpus).on_conflict(
            conflict_target=[Quota.team, Quota.priority_class], update={Quota.max_gpus: max_gpus}
        ).execute()
    rt.scheduler.kick(what=team_allowance(team))
    return Quota.get((Quota.team == team) & (Quota.priority_class == priority_class))


def delete_quota(rt, team, priority_class=None):
    """Remove a team's quota for one class, or all of its quotas (the scheduler is kicked)."""
    with write_transaction():
        query = Quota.delete().where(Quota.team == team)
        if priority_class:
            query = query.where(Quota.priority_class == priority_class)
        if not query.execute():
            raise NotFound(f"team {team!r} has no such quota")
    rt.scheduler.kick(what=team_allowance(team))


def check_bid(spec):
    """InvalidRequest when a spot job's (or instance's) bid is under the minimum of every GPU type
    it accepts."""
    if spec.priority_class != "spot" or not spec.resources.gpus:
        return
    accepted = list(spec.resources.gpu_types) or None
    query = GpuType.select().where(GpuType.spot_min_bid.is_null(False))
    if accepted:
        query = query.where(GpuType.model.in_(accepted))
    minimums = {
        t.model: t.spot_min_bid for t in query if t.spot_min_bid is not None
    }  # all: the query says so
    if not minimums:
        return
    bid = spec.bid
    lowest = min(minimums.values())
    if bid is None or bid < lowest:
        if accepted and len(minimums) < len(accepted):
            return  # some accepted type has no minimum
        cheapest = min(minimums, key=minimums.__getitem__)
        raise InvalidRequest(
            f"spot bid {bid if bid is not None else 'missing'} is under the minimum of {lowest:g} "
            f"({cheapest})",
            {"fields": {"bid": [f"at least {lowest:g}"]}, "spot_min_bid": minimums},
        )


def simulate(rt, principal, spec):
    """Where a JobSpec would go now, or why not, reserving nothing."""
    state = current_state(rt)
    rules = Rules.load(state, rt.clock.now())
    request, blocked = rules.request_for(
        task_request(spec, principal.owner_id), team_of(principal, spec), spec.priority_class
    )
    engine = scheduler.PlacementEngine(
        state.snapshot(), policy=rt.settings.scheduler_policy or None
    )
    if blocked is not None:
        return {
            "schedulable": False,
            "placement": None,
            "error": blocked,
            "reason": blocked,
            "filter_detail": [_detail(d) for d in engine.explain(task_request(spec))],
        }
    result = engine.simulate(request, explain=True)
    if not result.schedulable:
        return {
            "schedulable": False,
            "placement": None,
            "error": None,
            "reason": result.reason,
            "filter_detail": [_detail(d) for d in result.filter_detail],
        }
    return {
        "schedulable": True,
        "error": None,
        "reason": None,
        "filter_detail": [],
        "placement": [
            {
                "rank": r.rank,
                "node_id": r.node_id,
                "policy": result.policy,
                "link_class": r.link_class,
                "link_note": r.link_note,
                "block": r.block,
                "leaf": r.leaf,
                "network_note": r.network_note,
                "gpus": [
                    {
                        "uuid": g.uuid,
                        "exclusive": g.exclusive,
                        "memory_limit_bytes": g.memory_limit_bytes,
                        "compute_percent": g.compute_milli / 10,
                    }
                    for g in r.gpus
                ],
            }
            for r in result.ranks
        ],
    }


def _detail(d):
    return {"node_id": d.node_id, "stage": d.stage, "reason": d.reason}


def team_of(principal, spec, project_team=None):
    """The team a job of this principal runs as: its project's team where the project has one (the
    body may only repeat it), else the token's own; the body may only repeat it (Forbidden
    otherwise), except that an admin may name any team."""
    wanted = spec.team
    if project_team is not None:
        if wanted and wanted != project_team:
            raise InvalidRequest(
                f"project {spec.project or '(default)'} belongs to team {project_team}, not "
                f"{wanted}",
                {"fields": {"json": {"team": [f"the project's team is {project_team}"]}}},
            )
        return project_team
    if not wanted or principal.role == "admin":
        return wanted or principal.team
    if wanted != principal.team:
        raise Forbidden(
            f"this token submits for team {principal.team or '(none)'}, not {wanted}",
            {"team": wanted},
        )
    return wanted
