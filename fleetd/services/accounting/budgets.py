"""Team budgets per calendar month (UTC), in currency and/or GPU-hours, checked against the usage
ledger after each of its passes: `budget.threshold` events (and their webhooks, and a notification
to each active user of the team) at 50, 80 and 100 %, each once per team and month; at 100 % the
budget's `on_exceed`: notify, block (the team's new work waits, its pending reason naming the
budget) or stop_spot (its spot work is stopped and its new spot work waits) until the budget is
raised or the month ends."""

from fleetd.db import write_transaction
from fleetd.errors import InvalidRequest, NotFound
from fleetd.models import Budget, BudgetNotice, Instance, InstanceState, Job, JobState
from fleetd.services.accounting.budget_state import figures, month_usage, percent_used
from fleetd.services.accounting.periods import month_of
from fleetd.services.notify import feed
from fleetd.services.notify.events import record_event
from fleetd.services.placement.parking import team_allowance
from fleetd.services.workloads import instances
from fleetd.services.workloads.lifecycle import owe_stops
from fleetd.services.workloads.runs import stop_job

ON_EXCEED = ("notify", "block", "stop_spot")
THRESHOLDS = (50, 80, 100)


def budget_view(budget, now):
    """A budget as the API shows it, with the month's use so far."""
    cost, gpu_hours = month_usage(budget.team, now)
    return {
        "team": budget.team,
        "on_exceed": budget.on_exceed,
        **figures(budget, cost, gpu_hours, now),
    }


def list_budgets(rt):
    """Every team's budget with its month's use (admin)."""
    now = rt.clock.now()
    return [budget_view(b, now) for b in Budget.select().order_by(Budget.team)]


def get_budget(rt, principal, team):
    """A team's budget with its month's use: admins any team's, a submitter its own team's."""
    budget = Budget.get_or_none_by_id(team)
    if budget is None or (
        principal.role != "admin" and principal.team != team
    ):  # another team's: not shown
        raise NotFound(f"team {team!r} has no budget")
    return budget_view(budget, rt.clock.now())


def set_budget(rt, principal, team, limit_cost=None, limit_gpu_hours=None, on_exceed="notify"):
    """Create or replace a team's monthly budget (admin). A raised budget lets the team's waiting
    work run at once; a lowered one is acted on at the ledger's next pass."""
    if limit_cost is None and limit_gpu_hours is None:
        raise InvalidRequest(
            "a budget needs limit_cost or limit_gpu_hours (or both)",
            {"fields": {"limit_cost": ["limit_cost or limit_gpu_hours is required"]}},
        )
    if on_exceed not in ON_EXCEED:
        raise InvalidRequest(
            f"on_exceed must be one of {', '.join(ON_EXCEED)}",
            {"fields": {"on_exceed": [f"one of {', '.join(ON_EXCEED)}"]}},
        )
    now = rt.clock.now()
    with write_transaction():
        budget = Budget.get_or_none_by_id(team)
        created = budget is None
        if created:
            budget = Budget(team=team)
        budget.limit_cost, budget.limit_gpu_hours, budget.on_exceed = (
            limit_cost,
            limit_gpu_hours,
            on_exceed,
        )
        budget.updated_at, budget.updated_by = now, principal.label
        cost, gpu_hours = month_usage(team, now)
        budget.exceeded_month = (
            month_of(now) if percent_used(budget, cost, gpu_hours) >= 100 else None
        )
        budget.save(force_insert=created)
        record_event(
            now,
            "budget.set",
            "team",
            team,
            f"budget per month: cost {limit_cost}, GPU-hours "
            f"{limit_gpu_hours}, on_exceed {on_exceed}",
        )
    _kick(rt, team)
    return budget_view(budget, now)


def delete_budget(rt, principal, team):
    """Remove a team's budget (admin): nothing of the team waits for it any more."""
    now = rt.clock.now()
    with write_transaction():
        if not Budget.delete().where(Budget.team == team).execute():
            raise NotFound(f"team {team!r} has no budget")
        record_event(now, "budget.deleted", "team", team, f"budget removed by {principal.label}")
    _kick(rt, team)


def _kick(rt, team):
    if rt.scheduler is not None:
        rt.scheduler.kick(
            capacity=True, what=team_allowance(team)
        )  # the team's waiting work may run now


def check_budgets(rt):
    """After a ledger pass: record each threshold a team's month crossed (once), mark exceeded
    budgets, and stop the spot work of stop_spot teams over 100 %. Returns the notices written."""
    now = rt.clock.now()
    month = month_of(now)
    notices, stop = 0, []
    for team in [b.team for b in Budget.select(Budget.team)]:
        with write_transaction():
            budget = Budget.get_or_none_by_id(team)
            if budget is None:
                continue
            cost, gpu_hours = month_usage(team, now)
            percent = percent_used(budget, cost, gpu_hours)
            sent = {
                n.threshold
                for n in BudgetNotice.select(BudgetNotice.threshold).where(
                    (BudgetNotice.team == team) & (BudgetNotice.month == month)
                )
            }
            for threshold in THRESHOLDS:
                if percent >= threshold and threshold not in sent:
                    BudgetNotice.create(team=team, month=month, threshold=threshold, at=now)
                    said = f"team {team} used {percent:.1f} % of its budget for {month}"
                    record_event(
                        now,
                        "budget.threshold",
                        "team",
                        team,
                        said,
                        data={
                            "team": team,
                            "month": month,
                            "threshold": threshold,
                            "used_percent": round(percent, 3),
                            "used_cost": round(cost, 6),
                            "used_gpu_hours": round(gpu_hours, 6),
                            "limit_cost": budget.limit_cost,
                            "limit_gpu_hours": budget.limit_gpu_hours,
                            "on_exceed": budget.on_exceed,
                        },
                    )
                    feed.budget_threshold(team, f"{said} (past {threshold} %)", now)
                    notices += 1
            exceeded = month if percent >= 100 else None
            if exceeded != budget.exceeded_month:
                budget.exceeded_month = exceeded
                budget.save()
                if exceeded is None:
                    _kick(rt, team)  # the kick waits for the commit
            if exceeded and budget.on_exceed == "stop_spot":
                stop.append(team)
    for team in stop:
        _stop_spot(
            rt, team, f"team {team}'s budget for {month} is exceeded (on_exceed stop_spot)", now
        )
    return {"notices": notices, "stopped_spot_teams": len(stop)}


def _stop_spot(rt, team, reason, now):
    """Stop a team's running or queued spot jobs and instances."""
    with write_transaction():
        held = []
        for job in Job.select().where(
            (Job.team == team)
            & (Job.priority_class == "spot")
            & Job.instance_id.is_null()
            & Job.state.in_([JobState.QUEUED.value, JobState.RUNNING.value])
        ):
            held += stop_job(rt, job, reason, now)
    owe_stops(rt, held)
    spot = [
        i.id
        for i in Instance.select(Instance.id, Instance.spec, Instance.state).where(
            Instance.team == team
        )
        if i.instance_spec.priority_class == "spot"
        and (InstanceState(i.state).holds_run() or i.state == InstanceState.INTERRUPTED.value)
    ]
    for instance_id in spot:
        instances.stop_by_fleetd(rt, instance_id, reason)
