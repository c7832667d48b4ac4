"""Webhooks: receivers of event notifications (admin only)."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, current_principal, require
from fleetd.runtime import current_runtime
from fleetd.schemas.common import PageQuerySchema
from fleetd.schemas.webhooks import (
    DeliveryPageSchema,
    WebhookCreateSchema,
    WebhookPageSchema,
    WebhookSchema,
)
from fleetd.services.notify import webhooks

blp = Blueprint("webhooks", __name__, url_prefix="/api/v1/webhooks", description="Webhooks")


@blp.route("")
class Webhooks(MethodView):
    @require(ADMIN)
    @blp.arguments(PageQuerySchema(), location="query")
    @blp.response(200, WebhookPageSchema)
    def get(self, query):
        """List webhooks; secrets are never shown."""
        items, next_cursor = webhooks.list_webhooks(query["limit"], query["cursor"])
        return {"items": items, "next_cursor": next_cursor}

    @require(ADMIN)
    @blp.arguments(WebhookCreateSchema())
    @blp.response(201, WebhookSchema)
    def post(self, body):
        """Add a webhook: each event of these kinds is POSTed to the URL, signed with the secret. A
        URL whose host is, or resolves to, a loopback, link-local, private, multicast or unspecified
        address is refused unless the setting webhooks_allow_targets allows its network."""
        return webhooks.create_webhook(current_runtime(), current_principal(), **body)


@blp.route("/<string:webhook_id>")
class WebhookById(MethodView):
    @require(ADMIN)
    @blp.response(204)
    def delete(self, webhook_id):
        """Remove a webhook; its pending deliveries are not sent."""
        webhooks.delete_webhook(webhook_id)


@blp.route("/<string:webhook_id>/deliveries")
class WebhookDeliveries(MethodView):
    @require(ADMIN)
    @blp.arguments(PageQuerySchema(), location="query")
    @blp.response(200, DeliveryPageSchema)
    def get(self, query, webhook_id):
        """A webhook's deliveries, oldest first: attempts, last status code and error."""
        items, next_cursor = webhooks.list_deliveries(webhook_id, query["limit"], query["cursor"])
        return {"items": items, "next_cursor": next_cursor}
