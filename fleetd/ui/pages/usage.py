"""Usage: GPU-hours by team per day (a stacked chart), efficiency and cost per team with each team's
budget, and the workloads holding idle GPUs: the figures of GET /api/v1/usage, /budgets and
/usage/idle."""

import datetime as dt

from flask import flash, g, redirect, render_template, request, url_for

from fleetd.errors import InvalidRequest, NotFound
from fleetd.runtime import current_runtime
from fleetd.schemas.usage import BudgetUpdateSchema
from fleetd.services.accounting import budgets, usage
from fleetd.services.accounting.budgets import ON_EXCEED
from fleetd.ui import roles, specforms
from fleetd.ui.blueprint import bp
from fleetd.ui.charts import SERIES_CLASSES, stacked_bars
from fleetd.ui.forms import FormError
from fleetd.ui.security import ui_require

SPANS = (7, 14, 31)  # days a page may show
IDLE_MINUTES, IDLE_BELOW = 30, 10.0  # the API's defaults for GET /usage/idle
NONE_TEAM = "(no team)"


def daily_by_team(rt, principal, days, team=None):
    """([day, ...], {team: [GPU-hours allocated per day]}) over the last `days` UTC days, largest
    teams first (one query of the day sums)."""
    today = rt.clock.now().date()
    columns = [today - dt.timedelta(days=n) for n in range(days - 1, -1, -1)]
    index = {day.isoformat(): i for i, day in enumerate(columns)}
    stacks: dict[str, list[float]] = {}
    for row in usage.usage_by_day_and_team(rt, principal, columns[0], today, team=team):
        name = row["team"] or NONE_TEAM
        stacks.setdefault(name, [0.0] * len(columns))[index[row["day"]]] += row[
            "gpu_hours_allocated"
        ]
    ordered = dict(sorted(stacks.items(), key=lambda item: -sum(item[1])))
    return [d.isoformat() for d in columns], ordered


@bp.route("/usage")
@ui_require(roles.USAGE)
def usage_page():
    """GPU-hours by team over the last days, efficiency, cost, budgets and idle-held GPUs (a
    submitter: its own usage, its team's budget)."""
    return _usage_page()


@bp.route("/usage/budgets", methods=["POST"])
@ui_require(roles.BUDGET_SET)
def budget_set():
    """Set a team's monthly budget (the API's schema and set_budget)."""
    rt, principal = current_runtime(), g.ui_principal
    team = request.form.get("team", "").strip()[:200]
    body = {
        "limit_cost": specforms.number(request.form.get("limit_cost")),
        "limit_gpu_hours": specforms.number(request.form.get("limit_gpu_hours")),
        "on_exceed": request.form.get("on_exceed") or "notify",
    }
    try:
        if not team or "\x00" in team:
            raise FormError({"team": ["a team name (at most 200 characters)"]})
        data = specforms.load(BudgetUpdateSchema(), body, {})
        budget = specforms.run_service(lambda: budgets.set_budget(rt, principal, team, **data), {})
    except FormError as exc:
        return _usage_page(form=request.form, errors=exc.errors, status=400)
    flash(f"Team {budget['team']}'s budget saved: {budget['used_percent']:.0f}% used this month.")
    return redirect(url_for("ui.usage_page"))


def _usage_page(form=None, errors=None, status=200):
    rt, principal = current_runtime(), g.ui_principal
    try:
        days = int(request.args.get("days") or 14)
    except ValueError:
        raise InvalidRequest(f"days must be one of {', '.join(map(str, SPANS))}") from None
    if days not in SPANS:
        raise InvalidRequest(f"days must be one of {', '.join(map(str, SPANS))}")
    team = request.args.get("team", "").strip()[:200] or None
    start = rt.clock.now().date() - dt.timedelta(days=days - 1)
    report = usage.usage_report(rt, principal, "team", start, None, team=team)
    columns, stacks = daily_by_team(rt, principal, days, team)
    chart = stacked_bars(
        columns, stacks, unit=" h", title=f"GPU-hours allocated by team, last {days} days"
    )
    if principal.role in roles.BUDGETS:
        shown_budgets = {b["team"]: b for b in budgets.list_budgets(rt)}
    elif principal.team:
        shown_budgets = {b["team"]: b for b in _own_budget(rt, principal)}
    else:
        shown_budgets = {}
    idle = (
        usage.idle_workloads(rt, principal, IDLE_MINUTES, IDLE_BELOW)
        if principal.role in roles.IDLE
        else None
    )
    return render_template(
        "usage.html",
        report=report,
        chart=chart,
        legend=list(stacks),
        days=days,
        spans=SPANS,
        team=team or "",
        budgets=shown_budgets,
        idle=idle,
        idle_minutes=IDLE_MINUTES,
        idle_below=IDLE_BELOW,
        classes=SERIES_CLASSES,
        none_team=NONE_TEAM,
        form=form or {},
        errors=errors or {},
        on_exceed=ON_EXCEED,
    ), status


def _own_budget(rt, principal):
    """A submitter's team's budget, as a list of none or one."""
    try:
        return [budgets.get_budget(rt, principal, principal.team)]
    except NotFound:  # the team has no budget
        return []
