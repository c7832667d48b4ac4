"""`fleetd notifications`: the caller's feed (its jobs that ended, its team's budget alerts)."""

import click

from fleetd.cli.output import emit, show_table
from fleetd.cli.remote import client_command, current_client

FEED = "/api/v1/me/notifications"
COLUMNS = [
    ("ID", "id"),
    ("AT", "at"),
    ("KIND", "kind"),
    ("SUBJECT", lambda n: f"{n['subject']['kind']} {n['subject']['name']}"),
    ("TEXT", "text"),
    ("READ", lambda n: "yes" if n["read"] else "no"),
]


@client_command(None, "notifications")
@click.option(
    "--after", type=click.IntRange(min=0), help="Only notifications after this id (the last seen)."
)
@click.option("--unread", is_flag=True, help="Only those not marked read.")
@click.option("--mark-read", is_flag=True, help="Then mark every one listed read.")
def notifications(after, unread, mark_read):
    """List your notifications, oldest first: your jobs that ended, your team's budget alerts."""
    client = current_client()
    items = list(client.paginate(FEED, after=after, limit=1000))
    if mark_read and items:
        client.post(f"{FEED}/read", {"up_to": items[-1]["id"]})
    if unread:
        items = [n for n in items if not n["read"]]
    emit(items, lambda rows: show_table(rows, COLUMNS))


COMMANDS = [notifications]
