"""Rollouts: the driving CLI creates one and reports each node; any admin reads, pauses, resumes or
aborts it (admin only)."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, OPERATOR, require
from fleetd.runtime import current_runtime
from fleetd.schemas.rollouts import (
    RolloutCreateSchema,
    RolloutNodeReportSchema,
    RolloutPageSchema,
    RolloutQuerySchema,
    RolloutSchema,
)
from fleetd.services.fleet_ops import rollouts

blp = Blueprint("rollouts", __name__, url_prefix="/api/v1/rollouts", description="Rollouts")


@blp.route("")
class Rollouts(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.arguments(RolloutQuerySchema(), location="query")
    @blp.response(200, RolloutPageSchema)
    def get(self, query):
        """List rollouts, oldest first, optionally of one fleet."""
        items, next_cursor = rollouts.list_rollouts(query["limit"], query["cursor"], query["fleet"])
        return {"items": items, "next_cursor": next_cursor}

    @require(ADMIN, OPERATOR)
    @blp.arguments(RolloutCreateSchema())
    @blp.response(201, RolloutSchema)
    def post(self, body):
        """Plan a rollout of a fleet to a bundle (the driving CLI calls this): its nodes not on the
        bundle yet, canaries first, then in batches; 409 while another rollout of the fleet is
        active."""
        return rollouts.create_rollout(current_runtime(), **body)


@blp.route("/<string:rollout_id>")
class RolloutById(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.response(200, RolloutSchema)
    def get(self, rollout_id):
        """One rollout with its nodes in the order they are taken."""
        return rollouts.get_rollout(rollout_id)


@blp.route("/<string:rollout_id>/nodes/<string:node_id>")
class RolloutNodeById(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.arguments(RolloutNodeReportSchema())
    @blp.response(200, RolloutSchema)
    def patch(self, body, rollout_id, node_id):
        """The driver reports a node: upgrading (409 unless the rollout is running), then done or
        failed, or skipped. A failed canary, or more failures than max_failures, pauses the
        rollout."""
        return rollouts.report_node(
            current_runtime(), rollout_id, node_id, body["state"], body["detail"]
        )


def _action(name, doc):
    class RolloutAction(MethodView):
        @require(ADMIN, OPERATOR)
        @blp.response(200, RolloutSchema)
        def post(self, rollout_id):
            return rollouts.request(current_runtime(), rollout_id, name)

    RolloutAction.post.__doc__ = doc
    RolloutAction.__name__ = f"Rollout{name.title()}"
    blp.route(f"/<string:rollout_id>/{name}")(RolloutAction)


_action("pause", "Pause a running rollout: its driver begins no further node until it is resumed.")
_action("resume", "Resume a paused rollout (one fleetd or an operator paused).")
_action(
    "abort",
    "Abort a running or paused rollout: no further node begins; nodes that never began are "
    "skipped.",
)
_action(
    "retry",
    "Retry a paused rollout's failed nodes: they are pending again and the rollout runs on (its "
    "driver, waiting while it is paused, takes them); 409 when none failed or it is not paused.",
)
