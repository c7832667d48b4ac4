"""What budgets say now, read by the scheduler's rules and by fleetd.services.accounting.budgets: a
team's month of use from the ledger's day sums, and the teams whose exceeded budget holds work
back."""

from peewee import fn

from fleetd.models import Budget, UsageDay
from fleetd.services.accounting.periods import month_of, month_start


def month_usage(team, now, column=UsageDay.team):
    """(cost, GPU-hours) of a team's month so far (UTC), from the ledger's day sums (storage cost
    included); `column` UsageDay.project: a project's, `team` naming it."""
    start = month_start(now).date()
    row = (
        UsageDay.select(
            fn.COALESCE(fn.SUM(UsageDay.cost), 0.0), fn.COALESCE(fn.SUM(UsageDay.gpu_seconds), 0.0)
        )
        .where((column == team) & (UsageDay.day >= start))
        .tuples()
        .first()
    )
    return (row[0], row[1] / 3600) if row else (0.0, 0.0)


def figures(budget, cost, gpu_hours, now):
    """What a budget's view shows of its limits and its month's use (a team's or a project's)."""
    percent = percent_used(budget, cost, gpu_hours)
    return {
        "period": "month",
        "month": month_of(now),
        "limit_cost": budget.limit_cost,
        "limit_gpu_hours": budget.limit_gpu_hours,
        "used_cost": round(cost, 6),
        "used_gpu_hours": round(gpu_hours, 6),
        "used_percent": round(percent, 3),
        "exceeded": percent >= 100,
        "updated_at": budget.updated_at,
        "updated_by": budget.updated_by,
    }


def percent_used(budget, cost, gpu_hours):
    """How much of the budget is used, in % (the larger of its limits' shares)."""
    shares = []
    if budget.limit_cost is not None:
        shares.append(100.0 if budget.limit_cost <= 0 else 100.0 * cost / budget.limit_cost)
    if budget.limit_gpu_hours is not None:
        shares.append(
            100.0 if budget.limit_gpu_hours <= 0 else 100.0 * gpu_hours / budget.limit_gpu_hours
        )
    return max(shares, default=0.0)


def blocked_teams(now):
    """{team: (classes held back or None for all, why)} of the budgets exceeded this month whose
    on_exceed holds new work back (the scheduler's Rules read it each pass)."""
    month = month_of(now)
    out: dict[
        str, tuple[tuple[str, ...] | None, str]
    ] = {}  # team -> (classes it may still run, why)
    for budget in Budget.select().where(
        (Budget.exceeded_month == month) & (Budget.on_exceed != "notify")
    ):
        limits = [
            f"{budget.limit_cost:g}" if budget.limit_cost is not None else None,
            f"{budget.limit_gpu_hours:g} GPU-hours" if budget.limit_gpu_hours is not None else None,
        ]
        named = " and ".join(x for x in limits if x)
        if budget.on_exceed == "block":
            out[budget.team] = (
                None,
                f"team {budget.team}'s budget for {month} ({named}) is exceeded: its new work "
                "waits until the budget is raised or the month ends",
            )
        else:
            out[budget.team] = (
                ("spot",),
                f"team {budget.team}'s budget for {month} ({named}) is exceeded: its "
                "spot work waits until the budget is raised or the month ends",
            )
    return out
