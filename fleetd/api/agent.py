"""The agent protocol (X-Fleet-Protocol: 1): register, heartbeat, deregister."""

from flask.views import MethodView
from flask_smorest import Blueprint

from fleetd.auth import JOIN, NODE, current_principal, require
from fleetd.runtime import current_runtime
from fleetd.schemas.agent import HeartbeatReplySchema, HeartbeatSchema, RegisteredSchema, RegisterSchema
from fleetd.services import agents

blp = Blueprint("agent", __name__, url_prefix="/api/v1/agent", description="Agent protocol; needs X-Fleet-Protocol: 1")

PROTOCOL_HEADER = "X-Fleet-Protocol"
PROTOCOL_VERSION = "1"


@blp.route("/register")
class AgentRegister(MethodView):
    @require(JOIN)
    @blp.arguments(RegisterSchema)
    @blp.response(201, RegisteredSchema)
    def post(self, body):
        """Enrol a host with a join token; returns its node id and session token."""
        rt = current_runtime()
        node, session_token = agents.register_node(rt, current_principal().id, body)
        return {
            "node_id": node.id,
            "fleet": node.fleet_id,
            "session_token": session_token,
            "heartbeat_interval_seconds": rt.settings.heartbeat_interval_seconds,
        }


@blp.route("/heartbeat")
class AgentHeartbeat(MethodView):
    @require(NODE)
    @blp.arguments(HeartbeatSchema)
    @blp.response(200, HeartbeatReplySchema)
    def post(self, body):
        """Report liveness, inventory changes and tasks; learn drain, revocation and tasks to cancel."""
        rt = current_runtime()
        reply = agents.heartbeat(rt, current_principal().node, body)
        reply["heartbeat_interval_seconds"] = rt.settings.heartbeat_interval_seconds
        return reply


@blp.route("/deregister")
class AgentDeregister(MethodView):
    @require(NODE)
    @blp.response(204)
    def post(self):
        """Leave gracefully: the session ends and the node is marked lost at once."""
        agents.deregister_node(current_runtime(), current_principal().node_id)
