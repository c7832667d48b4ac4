"""The caller's notification feed: its jobs that ended, its team's budget alerts."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.api.people import PEOPLE
from fleetd.auth import current_principal, require
from fleetd.schemas.notifications import (
    NotificationPageSchema,
    NotificationQuerySchema,
    NotificationReadResultSchema,
    NotificationReadSchema,
)
from fleetd.services.notify import feed

blp = Blueprint(
    "notifications", __name__, url_prefix="/api/v1/me", description="The caller's notifications"
)


@blp.route("/notifications")
class Notifications(MethodView):
    @require(*PEOPLE)
    @blp.arguments(NotificationQuerySchema(), location="query")
    @blp.response(200, NotificationPageSchema)
    def get(self, query):
        """The caller's notifications (its user's, whichever of its tokens or sessions asks),
        oldest first; pass the last `id` seen as `after` to get only newer ones."""
        items, next_cursor = feed.list_notifications(
            current_principal().owner_id, query["limit"], query["cursor"], query["after"]
        )
        return {"items": items, "next_cursor": next_cursor}


@blp.route("/notifications/read")
class NotificationsRead(MethodView):
    @require(*PEOPLE)
    @blp.arguments(NotificationReadSchema())
    @blp.response(200, NotificationReadResultSchema)
    def post(self, body):
        """Mark the caller's notifications up to `up_to` (included) read."""
        return {"marked": feed.mark_read(current_principal().owner_id, body["up_to"])}
