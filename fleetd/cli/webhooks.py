"""`fleetd webhook`: receivers of event notifications (admin)."""

import secrets

import click

from fleetd.cli.output import emit, show_table
from fleetd.cli.remote import client_command, current_client


@click.group()
def webhook():
    """Webhooks: event notifications POSTed to a URL, signed with a secret."""


WEBHOOK_COLUMNS = [
    ("ID", "id"),
    ("URL", "url"),
    ("EVENTS", lambda r: ",".join(r["events"])),
    ("CREATED", "created_at"),
    ("BY", "created_by"),
]
DELIVERY_COLUMNS = [
    ("ID", "id"),
    ("EVENT", "event"),
    ("AT", "at"),
    ("STATE", "state"),
    ("ATTEMPTS", "attempts"),
    ("STATUS", lambda r: "-" if r.get("status_code") is None else str(r["status_code"])),
    ("ERROR", lambda r: r.get("error") or ""),
    ("NEXT ATTEMPT", lambda r: r.get("next_attempt_at") or ""),
]


@client_command(webhook, "create")
@click.argument("target", metavar="URL")
@click.option(
    "--event",
    "events",
    multiple=True,
    required=True,
    metavar="KIND",
    help=(
        "An event kind to send, e.g. node.lost, job.failed, instance.interrupted (repeat for more; "
        "docs/api.md lists them all)."
    ),
)
@click.option(
    "--secret",
    envvar="FLEETD_WEBHOOK_SECRET",
    show_envvar=True,
    help=(
        "The secret that signs deliveries (16 characters or more). Default: one is made and "
        "printed once."
    ),
)
def webhook_create(target, events, secret):
    """Add a webhook for URL; without --secret, the secret made for it is printed once."""
    made = secret is None
    secret = secret if secret is not None else secrets.token_urlsafe(32)
    data = current_client().post(
        "/api/v1/webhooks", {"url": target, "secret": secret, "events": list(events)}
    )
    if made:
        data = dict(data, secret=secret)

    def human(d):
        click.echo(f"created webhook {d['id']} for {d['url']} ({', '.join(d['events'])})")
        if made:
            click.echo(
                "its secret, shown only now (the receiver checks each delivery's signature with "
                "it):"
            )
            click.echo(secret)

    emit(data, human)


@client_command(webhook, "list")
def webhook_list():
    """List webhooks (never their secrets)."""
    items = list(current_client().paginate("/api/v1/webhooks"))
    emit(items, lambda rows: show_table(rows, WEBHOOK_COLUMNS))


@client_command(webhook, "rm")
@click.argument("webhook_id")
def webhook_rm(webhook_id):
    """Remove a webhook; its pending deliveries are not sent."""
    current_client().delete(f"/api/v1/webhooks/{webhook_id}")
    emit({"id": webhook_id, "deleted": True}, lambda d: click.echo(f"removed webhook {webhook_id}"))


@client_command(webhook, "deliveries")
@click.argument("webhook_id")
def webhook_deliveries(webhook_id):
    """A webhook's deliveries, oldest first: state, attempts, the receiver's status code, the last
    error."""
    items = list(current_client().paginate(f"/api/v1/webhooks/{webhook_id}/deliveries"))
    emit(items, lambda rows: show_table(rows, DELIVERY_COLUMNS))


COMMANDS = [webhook]
