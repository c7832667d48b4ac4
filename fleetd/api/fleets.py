"""Fleets and their join tokens."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, SUBMITTER, current_principal, require
from fleetd.runtime import current_runtime, public_url
from fleetd.schemas.common import PageQuerySchema
from fleetd.schemas.fleets import (
    FleetCreateSchema,
    FleetPageSchema,
    FleetSchema,
    FleetUpdateSchema,
    JoinTokenCreatedSchema,
    JoinTokenCreateSchema,
    JoinTokenPageSchema,
)
from fleetd.services.fleet_ops import fleets

blp = Blueprint("fleets", __name__, url_prefix="/api/v1", description="Fleets and join tokens")


@blp.route("/fleets")
class Fleets(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(PageQuerySchema(), location="query")
    @blp.response(200, FleetPageSchema)
    def get(self, query):
        """List fleets with their node and GPU counts."""
        items, next_cursor = fleets.list_fleets(query["limit"], query["cursor"])
        return {"items": items, "next_cursor": next_cursor}

    @require(ADMIN)
    @blp.arguments(FleetCreateSchema())
    @blp.response(201, FleetSchema)
    def post(self, body):
        """Create a fleet; 409 if the name exists."""
        return fleets.create_fleet(current_runtime().clock.now(), **body)


@blp.route("/fleets/<string:name>")
class FleetByName(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, FleetSchema)
    def get(self, name):
        """One fleet."""
        return fleets.get_fleet(name)

    @require(ADMIN)
    @blp.arguments(FleetUpdateSchema(), required=False)
    @blp.response(200, FleetSchema)
    def patch(self, body, name):
        """Change a fleet's description, labels or availability windows."""
        return fleets.update_fleet(current_runtime(), name, body)

    @require(ADMIN)
    @blp.response(204)
    def delete(self, name):
        """Delete a fleet; 409 while nodes are enrolled in it."""
        fleets.delete_fleet(name)


@blp.route("/fleets/<string:name>/terraform-state")
class FleetTerraformState(MethodView):
    @require(ADMIN)
    @blp.response(200)
    def get(self, name):
        """The fleet's nodes as a Terraform state document (for Terraform's http backend, which
        may authenticate with HTTP Basic: any user name, the token as the password)."""
        return fleets.terraform_state(name)


@blp.route("/fleets/<string:name>/join-tokens")
class FleetJoinTokens(MethodView):
    @require(ADMIN)
    @blp.arguments(PageQuerySchema(), location="query")
    @blp.response(200, JoinTokenPageSchema)
    def get(self, query, name):
        """List a fleet's join tokens; secrets are never shown."""
        items, next_cursor = fleets.list_join_tokens(name, query["limit"], query["cursor"])
        return {"items": items, "next_cursor": next_cursor}

    @require(ADMIN)
    @blp.arguments(JoinTokenCreateSchema(), required=False)
    @blp.response(201, JoinTokenCreatedSchema)
    def post(self, body, name):
        """Mint a join token; the secret and the join command are in this response only."""
        maker = current_principal().described[:200]
        row, token = fleets.create_join_token(
            current_runtime().clock.now(), name, created_by=maker, **body
        )
        row.token = token
        row.join_command = fleets.join_command(public_url(), token)
        return row


@blp.route("/join-tokens/<string:token_id>")
class JoinTokenById(MethodView):
    @require(ADMIN)
    @blp.response(204)
    def delete(self, token_id):
        """Revoke a join token."""
        fleets.revoke_join_token(token_id)
