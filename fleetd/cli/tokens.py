"""`fleetd token`: API tokens."""

import click

from fleetd.cli.output import emit, show_table
from fleetd.cli.params import Duration
from fleetd.cli.remote import client_command, current_client


@click.group()
def token():
    """API tokens."""


TOKEN_COLUMNS = [("ID", "id"), ("NAME", "name"), ("ROLE", "role"), ("TEAM", "team"),
                 ("UNIX USER", "unix_user"), ("EXPIRES", "expires_at"), ("REVOKED", "revoked")]


@client_command(token, "create")
@click.option("--name", required=True, help="What the token is for.")
@click.option("--role", required=True, type=click.Choice(["admin", "submitter", "metrics"]),
              help="admin: everything; submitter: its own jobs, reading the fleet; metrics: metrics and status.")
@click.option("--team", help="Team of a submitter token.")
@click.option("--expires-in", type=Duration(), help="Lifetime, e.g. 30d (default: no expiry).")
@click.option("--unix-user", help="Host user the token's tasks run as (must exist on the nodes; not root). "
                                  "Default: a uid fleetd allocates for the token.")
def token_create(name, role, team, expires_in, unix_user):
    """Create an API token; its secret is printed once."""
    body = {"name": name, "role": role, "team": team, "expires_in_seconds": expires_in, "unix_user": unix_user}
    data = current_client().post("/api/v1/tokens", {k: v for k, v in body.items() if v is not None})

    def human(d):
        click.echo(f"created token {d['id']} ({d['role']}); the secret is shown only now:")
        click.echo(d["token"])

    emit(data, human)


@client_command(token, "list")
def token_list():
    """List API tokens (never their secrets)."""
    items = list(current_client().paginate("/api/v1/tokens"))
    emit(items, lambda rows: show_table(rows, TOKEN_COLUMNS))


@client_command(token, "revoke")
@click.argument("token_id")
def token_revoke(token_id):
    """Revoke an API token; it stops working at once."""
    current_client().delete(f"/api/v1/tokens/{token_id}")
    emit({"id": token_id, "revoked": True}, lambda d: click.echo(f"revoked token {token_id}"))


COMMANDS = [token]
