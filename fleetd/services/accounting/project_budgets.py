"""Project budgets per calendar month (UTC), in currency and/or GPU-hours, checked against the
usage ledger after each of its passes, as team budgets are: a `budget.threshold` event (subject the
project; webhooks with it) and a notification to each active member of the project at 50, 80 and
100 %, each once per project and month. A project's budget only tells: what holds work back is its
team's budget (services.accounting.budgets), so a lab budgets capacity to teams and watches its
projects within them."""

from fleetd.db import write_transaction
from fleetd.errors import InvalidRequest, NotFound
from fleetd.models import Project, ProjectBudget, UsageDay
from fleetd.services.accounting import budget_state
from fleetd.services.accounting.budget_state import figures, percent_used
from fleetd.services.accounting.periods import month_of
from fleetd.services.identity import access
from fleetd.services.notify import feed
from fleetd.services.notify.events import record_event

THRESHOLDS = (50, 80, 100)


def month_usage(project, now):
    """(cost, GPU-hours) of a project's month so far (UTC), from the ledger's day sums."""
    return budget_state.month_usage(project, now, UsageDay.project)


def budget_view(budget, now):
    cost, gpu_hours = month_usage(budget.project, now)
    return {
        "project": budget.project,
        "on_exceed": "notify",
        **figures(budget, cost, gpu_hours, now),
    }


def list_budgets(rt):
    now = rt.clock.now()
    return [budget_view(b, now) for b in ProjectBudget.select().order_by(ProjectBudget.project)]


def get_budget(rt, principal, project):
    """A project's budget: admins any, a project's members and viewers their project's."""
    budget = ProjectBudget.get_or_none_by_id(project)
    if budget is None or (
        principal.role != "admin" and access.project_role(principal, project) is None
    ):
        raise NotFound(f"project {project!r} has no budget")
    return budget_view(budget, rt.clock.now())


def set_budget(rt, principal, project, limit_cost=None, limit_gpu_hours=None, on_exceed="notify"):
    """Create or replace a project's monthly budget (admin); it notifies only (see the module)."""
    if limit_cost is None and limit_gpu_hours is None:
        raise InvalidRequest(
            "a budget needs limit_cost or limit_gpu_hours (or both)",
            {"fields": {"limit_cost": ["limit_cost or limit_gpu_hours is required"]}},
        )
    if on_exceed != "notify":
        raise InvalidRequest(
            "a project's budget notifies only; set block or stop_spot on its team's budget",
            {"fields": {"on_exceed": ["notify (a team's budget holds work back)"]}},
        )
    now = rt.clock.now()
    with write_transaction():
        if Project.get_or_none_by_id(project) is None:
            raise NotFound(f"project {project} not found")
        budget = ProjectBudget.get_or_none_by_id(project)
        created = budget is None
        if created:
            budget = ProjectBudget(project=project)
        budget.limit_cost, budget.limit_gpu_hours = limit_cost, limit_gpu_hours
        budget.updated_at, budget.updated_by = now, principal.label
        budget.save(force_insert=created)
        record_event(
            now,
            "budget.set",
            "project",
            project,
            f"project budget per month: cost {limit_cost}, GPU-hours {limit_gpu_hours}",
        )
    return budget_view(budget, now)


def delete_budget(rt, principal, project):
    now = rt.clock.now()
    with write_transaction():
        if not ProjectBudget.delete().where(ProjectBudget.project == project).execute():
            raise NotFound(f"project {project!r} has no budget")
        record_event(
            now, "budget.deleted", "project", project, f"budget removed by {principal.label}"
        )


def check_budgets(rt):
    """After a ledger pass: tell each threshold a project's month crossed (once per month)."""
    now = rt.clock.now()
    month = month_of(now)
    notices = 0
    for project in [b.project for b in ProjectBudget.select(ProjectBudget.project)]:
        with write_transaction():
            budget = ProjectBudget.get_or_none_by_id(project)
            if budget is None:
                continue
            cost, gpu_hours = month_usage(project, now)
            percent = percent_used(budget, cost, gpu_hours)
            told = budget.notified_percent if budget.notified_month == month else 0
            crossed = [t for t in THRESHOLDS if told < t <= percent]
            if not crossed:
                continue
            said = f"project {project} used {percent:.1f} % of its budget for {month}"
            for threshold in crossed:
                record_event(
                    now,
                    "budget.threshold",
                    "project",
                    project,
                    said,
                    data={
                        "project": project,
                        "month": month,
                        "threshold": threshold,
                        "used_percent": round(percent, 3),
                        "used_cost": round(cost, 6),
                        "used_gpu_hours": round(gpu_hours, 6),
                        "limit_cost": budget.limit_cost,
                        "limit_gpu_hours": budget.limit_gpu_hours,
                        "on_exceed": "notify",
                    },
                )
            feed.project_budget_threshold(project, f"{said} (past {crossed[-1]} %)", now)
            budget.notified_month, budget.notified_percent = month, crossed[-1]
            budget.save()
            notices += len(crossed)
    return {"project_notices": notices}
