"""Usage reports, idle-held GPUs, team and project budgets and the storage price."""

from flask import Response, request
from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, SUBMITTER, current_principal, require
from fleetd.errors import InvalidRequest
from fleetd.runtime import current_runtime
from fleetd.schemas.usage import (
    BudgetListSchema,
    BudgetSchema,
    BudgetUpdateSchema,
    IdleListSchema,
    IdleQuerySchema,
    ProjectBudgetSchema,
    ProjectBudgetUpdateSchema,
    StoragePriceSchema,
    StoragePriceUpdateSchema,
    UsageQuerySchema,
    UsageReportSchema,
)
from fleetd.services.accounting import budgets, project_budgets, usage

blp = Blueprint(
    "usage", __name__, url_prefix="/api/v1", description="Usage, chargeback and budgets"
)


def _team(team):
    if len(team) > 200 or "\x00" in team:
        raise InvalidRequest(
            "a team name has at most 200 characters and no NUL", {"fields": {"team": ["invalid"]}}
        )
    return team


@blp.route("/usage")
class Usage(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(UsageQuerySchema(), location="query")
    @blp.response(200, UsageReportSchema)
    @blp.doc(
        responses={
            200: {
                "content": {
                    "text/csv": {
                        "schema": {"type": "string"},
                        "example": (
                            "group,gpu_hours_allocated,gpu_hours_used,efficiency,cost,runs\nml,12.5,9.1,0.728,31.25,4\n"
                        ),
                    }
                }
            }
        }
    )
    def get(self, query):
        """GPU-hours allocated and used, efficiency, cost and runs per team, owner, fleet, GPU
        model, day or workload over whole UTC days, with totals (a submitter sees its own usage).
        With `Accept: text/csv` the rows come as CSV."""
        report = usage.usage_report(
            current_runtime(),
            current_principal(),
            query["group_by"],
            query["from_"],
            query["to"],
            query["team"],
            query["owner"],
            query["fleet"],
        )
        if request.accept_mimetypes.best_match(["application/json", "text/csv"]) == "text/csv":
            return Response(usage.report_csv(report), mimetype="text/csv")
        return report


@blp.route("/usage/idle")
class IdleWorkloads(MethodView):
    @require(ADMIN)
    @blp.arguments(IdleQuerySchema(), location="query")
    @blp.response(200, IdleListSchema)
    def get(self, query):
        """Workloads holding GPUs that all stayed under `below_percent` utilisation for at least
        `min_minutes`, with their owners and cost so far, longest idle first."""
        return {
            "items": usage.idle_workloads(
                current_runtime(), current_principal(), query["min_minutes"], query["below_percent"]
            )
        }


@blp.route("/budgets")
class Budgets(MethodView):
    @require(ADMIN)
    @blp.response(200, BudgetListSchema)
    def get(self):
        """Every team's monthly budget with this month's use (`items`), and every project's
        (`projects`)."""
        rt = current_runtime()
        return {"items": budgets.list_budgets(rt), "projects": project_budgets.list_budgets(rt)}


@blp.route("/budgets/project/<string:key>")
class BudgetByProject(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, ProjectBudgetSchema)
    def get(self, key):
        """A project's monthly budget with this month's use (a member or viewer: its project's)."""
        return project_budgets.get_budget(current_runtime(), current_principal(), key)

    @require(ADMIN)
    @blp.arguments(ProjectBudgetUpdateSchema())
    @blp.response(200, ProjectBudgetSchema)
    def put(self, body, key):
        """Set a project's budget per calendar month (UTC) in currency and/or GPU-hours: its members
        are told at 50, 80 and 100 % (its team's budget is what holds work back)."""
        return project_budgets.set_budget(current_runtime(), current_principal(), key, **body)

    @require(ADMIN)
    @blp.response(204)
    def delete(self, key):
        """Remove a project's budget."""
        project_budgets.delete_budget(current_runtime(), current_principal(), key)


@blp.route("/budgets/<string:team>")
class BudgetByTeam(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, BudgetSchema)
    def get(self, team):
        """A team's monthly budget with this month's use (a submitter: its own team's)."""
        return budgets.get_budget(current_runtime(), current_principal(), _team(team))

    @require(ADMIN)
    @blp.arguments(BudgetUpdateSchema())
    @blp.response(200, BudgetSchema)
    def put(self, body, team):
        """Set a team's budget per calendar month (UTC) in currency and/or GPU-hours, and what
        happens at 100 %: notify, block (its new work waits) or stop_spot."""
        return budgets.set_budget(current_runtime(), current_principal(), _team(team), **body)

    @require(ADMIN)
    @blp.response(204)
    def delete(self, team):
        """Remove a team's budget."""
        budgets.delete_budget(current_runtime(), current_principal(), _team(team))


@blp.route("/prices/storage")
class StoragePrice(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, StoragePriceSchema)
    def get(self):
        """The storage price per GB-month of instance volumes (null: free)."""
        return usage.get_storage_price()

    @require(ADMIN)
    @blp.arguments(StoragePriceUpdateSchema())
    @blp.response(200, StoragePriceSchema)
    def put(self, body):
        """Set the storage price per GB-month, from now on (what was accounted keeps its price)."""
        return usage.set_storage_price(current_runtime(), body["per_gb_month"])
