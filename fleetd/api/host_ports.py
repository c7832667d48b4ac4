"""Seed 000's `POST /api/assign-host-port`: the host port of an instance's declared port, as
text."""

from flask import Response
from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, SUBMITTER, current_principal, require
from fleetd.runtime import current_runtime
from fleetd.schemas.instances import HostPortQuerySchema
from fleetd.services.workloads import connections

blp = Blueprint(
    "host-ports", __name__, url_prefix="/api", description="Host ports (seed 000's controller API)"
)


@blp.route("/assign-host-port")
class AssignHostPort(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(HostPortQuerySchema(), location="query")
    @blp.response(200, content_type="text/plain")
    @blp.doc(
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}, "example": "40001"}}}
        }
    )
    def post(self, query):
        """The host port of a declared port of the instance `podName` (its id, or its name), as
        plain text.

        Nodes hand host ports out from their own range when an instance starts, so this assigns
        none: it answers as the instance's connection does, waiting up to wait_seconds for it to
        run."""
        port = connections.host_port(
            current_runtime(),
            current_principal(),
            query["pod_name"],
            query["port"],
            query["wait_seconds"],
        )
        return Response(
            str(port), mimetype="text/plain"
        )  # no newline: callers parse it as a number
