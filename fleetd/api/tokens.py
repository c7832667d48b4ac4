"""API tokens."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, require
from fleetd.runtime import current_runtime
from fleetd.schemas.common import PageQuerySchema
from fleetd.schemas.nodes import EventPageSchema, EventQuerySchema
from fleetd.schemas.tokens import (
    TokenCreatedSchema,
    TokenCreateSchema,
    TokenPageSchema,
    TokenSchema,
    TokenUpdateSchema,
)
from fleetd.services.identity import tokens

blp = Blueprint("tokens", __name__, url_prefix="/api/v1/tokens", description="API tokens")


@blp.route("")
class Tokens(MethodView):
    @require(ADMIN)
    @blp.arguments(PageQuerySchema(), location="query")
    @blp.response(200, TokenPageSchema)
    def get(self, query):
        """List API tokens; secrets are never shown."""
        items, next_cursor = tokens.list_api_tokens(query["limit"], query["cursor"])
        return {"items": items, "next_cursor": next_cursor}

    @require(ADMIN)
    @blp.arguments(TokenCreateSchema())
    @blp.response(201, TokenCreatedSchema)
    def post(self, body):
        """Create an API token; the secret is in this response only."""
        rt = current_runtime()
        row, token = tokens.create_api_token(
            rt.clock.now(), allowed_system_users=rt.settings.allowed_system_users, **body
        )
        row.token = token
        return row


@blp.route("/<string:token_id>")
class TokenById(MethodView):
    @require(ADMIN)
    @blp.arguments(TokenUpdateSchema())
    @blp.response(200, TokenSchema)
    def patch(self, body, token_id):
        """Change a token's own limits (null: back to the server's setting); its secret stays."""
        return tokens.set_token_limits(token_id, body["limits"])

    @require(ADMIN)
    @blp.response(204)
    def delete(self, token_id):
        """Revoke an API token; it stops working at once."""
        tokens.revoke_api_token(current_runtime().clock.now(), token_id)


@blp.route("/<string:token_id>/events")
class TokenEvents(MethodView):
    @require(ADMIN)
    @blp.arguments(EventQuerySchema(), location="query")
    @blp.response(200, EventPageSchema)
    def get(self, query, token_id):
        """A token's own events, oldest first (a rename by migration 0017); `after` is an event
        id."""
        items, next_cursor = tokens.list_token_events(
            token_id, query["limit"], query["cursor"], query["after"]
        )
        return {"items": items, "next_cursor": next_cursor}
