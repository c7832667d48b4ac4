"""Nodes: inventory, state and admin actions."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, OPERATOR, SUBMITTER, require
from fleetd.runtime import current_runtime
from fleetd.schemas.nodes import (
    BootstrapRunSchema,
    EventPageSchema,
    EventQuerySchema,
    EventSchema,
    NodeCordonSchema,
    NodeDrainSchema,
    NodePageSchema,
    NodePatchSchema,
    NodeQuerySchema,
    NodeSchema,
    NodeUpgradeEndSchema,
    NodeUpgradeSchema,
)
from fleetd.services.nodes import labels, nodes, upgrades

blp = Blueprint("nodes", __name__, url_prefix="/api/v1/nodes", description="Nodes")


def _live(node_list):
    return nodes.with_last_heartbeat(node_list, current_runtime().liveness)


@blp.route("")
class Nodes(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(NodeQuerySchema(), location="query")
    @blp.response(200, NodePageSchema)
    def get(self, query):
        """List nodes, optionally of one fleet, status, agent version or hostname."""
        items, next_cursor = nodes.list_nodes(
            query["limit"],
            query["cursor"],
            query["fleet"],
            query["status"],
            query["agent_version"],
            query["hostname"],
        )
        return {"items": _live(items), "next_cursor": next_cursor}


@blp.route("/<string:node_id>")
class NodeById(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, NodeSchema)
    def get(self, node_id):
        """One node with its GPUs."""
        return _live([nodes.get_node(node_id)])[0]

    @require(ADMIN, OPERATOR)
    @blp.arguments(NodePatchSchema())
    @blp.response(200, NodeSchema)
    def patch(self, body, node_id):
        """Set or drop labels through the API: they win per key over the agent's config file, which
        fills the rest."""
        return _live([labels.set_node_labels(current_runtime(), node_id, body["labels"])])[0]

    @require(ADMIN)
    @blp.response(204)
    def delete(self, node_id):
        """Forget a node; 409 while tasks run on it."""
        nodes.delete_node(current_runtime(), node_id)


@blp.route("/<string:node_id>/cordon")
class NodeCordon(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.arguments(NodeCordonSchema(), required=False)
    @blp.response(200, NodeSchema)
    def post(self, body, node_id):
        """Stop new placements on a node; `reason` (optional) says why."""
        return _live([nodes.cordon_node(current_runtime(), node_id, body.get("reason"))])[0]


@blp.route("/<string:node_id>/uncordon")
class NodeUncordon(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.response(200, NodeSchema)
    def post(self, node_id):
        """Allow placements on a cordoned node again."""
        return _live([nodes.uncordon_node(current_runtime(), node_id)])[0]


@blp.route("/<string:node_id>/drain")
class NodeDrain(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.arguments(NodeDrainSchema())
    @blp.response(200, NodeSchema)
    def post(self, body, node_id):
        """Drain a node: no new work; running tasks may finish until the deadline."""
        return _live(
            [
                nodes.drain_node(
                    current_runtime(),
                    node_id,
                    body["reason"],
                    body["deadline_seconds"],
                    body["repair"],
                )
            ]
        )[0]


@blp.route("/<string:node_id>/undrain")
class NodeUndrain(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.response(200, NodeSchema)
    def post(self, node_id):
        """End a drain; the node takes work again (after a drain for repair, once it passes
        validation)."""
        return _live([nodes.undrain_node(current_runtime(), node_id)])[0]


@blp.route("/<string:node_id>/upgrade")
class NodeUpgrade(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.arguments(NodeUpgradeSchema())
    @blp.response(200, NodeSchema)
    def post(self, body, node_id):
        """Begin an agent upgrade: fleetd remembers the node's state and drains a ready or cordoned
        node (an operator's drain stays); 409 for a node that is pending, lost or revoked."""
        return _live(
            [
                upgrades.begin_upgrade(
                    current_runtime(), node_id, body["reason"], body["deadline_seconds"]
                )
            ]
        )[0]


@blp.route("/<string:node_id>/upgrade/end")
class NodeUpgradeEnd(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.arguments(NodeUpgradeEndSchema())
    @blp.response(200, NodeSchema)
    def post(self, body, node_id):
        """End an agent upgrade. succeeded: the node returns, in one step, to the state it was in
        before (a cordoned node is never ready on the way); failed: it stays drained, its reason
        naming the failure. 409 when no upgrade is in progress."""
        return _live(
            [upgrades.end_upgrade(current_runtime(), node_id, body["outcome"], body["detail"])]
        )[0]


@blp.route("/<string:node_id>/revoke")
class NodeRevoke(MethodView):
    @require(ADMIN)
    @blp.response(200, NodeSchema)
    def post(self, node_id):
        """Revoke a node: its session token stops working and its agent stops all work."""
        return _live([nodes.revoke_node(current_runtime(), node_id)])[0]


@blp.route("/<string:node_id>/events")
class NodeEvents(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(EventQuerySchema(), location="query")
    @blp.response(200, EventPageSchema)
    def get(self, query, node_id):
        """A node's events, oldest first; `after` is an event id."""
        items, next_cursor = nodes.list_node_events(
            node_id, query["limit"], query["cursor"], query["after"]
        )
        return {"items": items, "next_cursor": next_cursor}

    @require(ADMIN)
    @blp.arguments(BootstrapRunSchema())
    @blp.response(201, EventSchema)
    def post(self, run, node_id):
        """Record a provisioning run on a node (`fleetd bootstrap` records each: the host, the
        bundle's version and sha256, the outcome); the event's actor is the caller."""
        del run["kind"]
        return nodes.record_bootstrap_run(current_runtime(), node_id, **run)
