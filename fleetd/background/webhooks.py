"""Send the webhook deliveries that are due (the outbox), retrying failed ones with back-off."""

from fleetd.services.notify.webhooks import send_due

NAME = "webhooks"
DESCRIPTION = (
    "Posts queued webhook deliveries (signed), retries failures with back-off, forgets old ones"
)


def run(rt):
    """One round of sends; returns {delivered, retrying, given_up, forgotten}."""
    return send_due(rt)
