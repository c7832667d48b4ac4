"""The validation gate: a node's latest validation, an operator's request for one, and the agent's
results (docs/validation.md)."""

from flask.views import MethodView

from fleetd.api.agent import PROTOCOL_PARAMETER
from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, NODE, OPERATOR, SUBMITTER, current_principal, require
from fleetd.runtime import current_runtime
from fleetd.schemas.nodes import NodeSchema
from fleetd.schemas.validation import ValidationReportSchema, ValidationSchema
from fleetd.services.nodes import nodes, validation

blp = Blueprint("validation", __name__, url_prefix="/api/v1", description="Node validation")


@blp.route("/nodes/<string:node_id>/validation")
class NodeValidation(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, ValidationSchema)
    def get(self, node_id):
        """The node's latest validation: its state and each check's result, per GPU; 404 when it has
        none."""
        return validation.get_validation(node_id)


@blp.route("/nodes/<string:node_id>/validate")
class NodeValidate(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.response(200, NodeSchema)
    def post(self, node_id):
        """Validate a node now: it takes no new work until its agent's checks pass, then returns to
        where it was (ready, cordoned or drained). 409 while tasks run on it, and for a pending,
        draining, lost or revoked node."""
        rt = current_runtime()
        validation.validate_node(rt, node_id)
        return nodes.with_last_heartbeat([nodes.get_node(node_id)], rt.liveness)[0]


@blp.route("/agent/validations/<string:validation_id>", parameters=[PROTOCOL_PARAMETER])
class AgentValidationReport(MethodView):
    @require(NODE)
    @blp.arguments(ValidationReportSchema())
    @blp.response(204)
    def post(self, body, validation_id):
        """The node's agent reports the results of a validation it was given; one already finished
        is accepted and ignored (a retry)."""
        validation.record_result(
            current_runtime(),
            current_principal().node_id,
            validation_id,
            list(body.checks),
            body.system,
        )
