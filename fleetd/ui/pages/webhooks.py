"""Webhooks: create one (a secret generated unless given, shown once), list them, remove one, and a
webhook's deliveries with their status."""

import secrets

from flask import flash, g, redirect, render_template, request, url_for

from fleetd.models import WEBHOOK_KINDS
from fleetd.runtime import current_runtime
from fleetd.schemas.webhooks import WebhookCreateSchema
from fleetd.services.notify import webhooks
from fleetd.ui import roles, specforms
from fleetd.ui.blueprint import bp
from fleetd.ui.forms import FormError
from fleetd.ui.pages.common import confirmed
from fleetd.ui.security import ui_require

LIST_LIMIT = 500
DELIVERIES_SHOWN = 200


def new_secret():
    """A webhook secret for someone who did not bring one: 256 random bits."""
    return secrets.token_urlsafe(32)


def _webhooks_page(created=None, form=None, errors=None, status=200):
    rows = webhooks.list_webhooks(LIST_LIMIT)[0]
    return render_template(
        "webhooks.html",
        hooks=rows,
        kinds=WEBHOOK_KINDS,
        created=created,
        form=form,
        errors=errors or {},
    ), status


@bp.route("/webhooks")
@ui_require(roles.WEBHOOKS)
def webhooks_page():
    """Webhooks without their secrets; the form to add one."""
    return _webhooks_page()


@bp.route("/webhooks", methods=["POST"])
@ui_require(roles.WEBHOOK_CREATE)
def webhook_create():
    """Add a webhook (the API's schema and create_webhook); its secret is shown in this answer
    only."""
    rt, principal = current_runtime(), g.ui_principal
    secret = request.form.get("secret", "").strip() or new_secret()
    body = {
        "url": request.form.get("url", "").strip(),
        "secret": secret,
        "events": request.form.getlist("events"),
    }
    try:
        data = specforms.load(WebhookCreateSchema(), body, {})
        hook = specforms.run_service(lambda: webhooks.create_webhook(rt, principal, **data), {})
    except FormError as exc:
        form = {"url": body["url"], "events": body["events"]}  # never the secret back into a page
        return _webhooks_page(form=form, errors=exc.errors, status=400)
    return _webhooks_page(created={"hook": hook, "secret": secret})


@bp.route("/webhooks/<string:webhook_id>")
@ui_require(roles.WEBHOOK_DELIVERIES)
def webhook_page(webhook_id):
    """A webhook's deliveries, newest first: state, attempts, the receiver's status code, the last
    error."""
    hook = webhooks.get_webhook(webhook_id)
    rows = webhooks.deliveries_tail(webhook_id, DELIVERIES_SHOWN)
    return render_template("webhook.html", hook=hook, deliveries=list(reversed(rows)))


@bp.route("/webhooks/<string:webhook_id>/remove", methods=["POST"])
@ui_require(roles.WEBHOOK_DELETE)
def webhook_remove(webhook_id):
    """Remove a webhook after a confirmation step; its pending deliveries are not sent."""
    if not confirmed(request.form):
        return render_template(
            "confirm.html",
            title="Remove webhook",
            question=f"Remove webhook {webhook_id}? Its pending deliveries are not sent.",
            action=url_for("ui.webhook_remove", webhook_id=webhook_id),
            hidden={},
            button="Remove",
            back=url_for("ui.webhooks_page"),
        )
    webhooks.delete_webhook(webhook_id)
    flash(f"Webhook {webhook_id} removed.")
    return redirect(url_for("ui.webhooks_page"))
