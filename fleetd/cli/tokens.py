"""`fleetd token`: API tokens."""

import click

from fleetd.cli.output import describe_error, emit, fail, show_table
from fleetd.cli.params import Duration, Size
from fleetd.cli.remote import client_command, current_client
from fleetd.client import ClientError, fresh_session, load_config


@click.group()
def token():
    """API tokens."""


LIMITS = (
    "max_active_jobs",
    "max_instances",
    "max_spec_bytes",
    "max_stored_spec_bytes",
    "max_artifact_bytes",
    "requests_per_second",
)


def own_limits(row):
    """The limits set on a token, as name=value; "-" when all are the server's settings."""
    own = [
        f"{name}={value}" for name, value in (row.get("limits") or {}).items() if value is not None
    ]
    return ", ".join(own) or "-"


TOKEN_COLUMNS = [
    ("ID", "id"),
    ("NAME", "name"),
    ("ROLE", "role"),
    ("TEAM", "team"),
    ("UNIX USER", "unix_user"),
    ("LIMITS", own_limits),
    ("EXPIRES", "expires_at"),
    ("REVOKED", "revoked"),
]


def limit_options(command):
    """The options that set a token's own limits (a limit not given is the server's setting)."""
    options = [
        click.option(
            "--max-active-jobs",
            type=click.IntRange(0),
            help="Jobs it may have queued or running at once.",
        ),
        click.option(
            "--max-instances", type=click.IntRange(0), help="Instances it may hold (not deleted)."
        ),
        click.option(
            "--max-spec-bytes", type=Size(), help="Size of one job or instance spec, e.g. 64K."
        ),
        click.option(
            "--max-stored-spec-bytes",
            type=Size(),
            help=(
                "Bytes the specs of its jobs and instances may take in the database, e.g. 500M "
                "(ended ones count until the gc deletes them)."
            ),
        ),
        click.option(
            "--max-artifact-bytes",
            type=Size(),
            help=(
                "Bytes of artifacts it may store, e.g. 500G (each counted as if it were its alone)."
            ),
        ),
        click.option(
            "--requests-per-second",
            type=click.FloatRange(0.01),
            help="Its API requests per second.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def given_limits(values):
    """{limit: value} of the limit options given on the command line."""
    return {name: values[name] for name in LIMITS if values.get(name) is not None}


@client_command(token, "create")
@click.option("--name", required=True, help="What the token is for.")
@click.option(
    "--role",
    required=True,
    type=click.Choice(["admin", "operator", "member", "submitter", "viewer", "metrics", "scim"]),
    help=(
        "admin: everything; member (or submitter): its own work, reading the fleet; viewer and "
        "operator: reading; metrics: metrics and status."
    ),
)
@click.option(
    "--user",
    help="The login of the user that owns it (made if none has it): all of a user's tokens "
    "are one owner.",
)
@click.option("--team", help="Team of a submitter token.")
@click.option("--expires-in", type=Duration(), help="Lifetime, e.g. 30d (default: no expiry).")
@click.option(
    "--unix-user",
    help="Host user the token's tasks run as (must exist on the nodes; not root, no "
    "system account unless the server allows it). Default: a uid fleetd allocates "
    "for the token.",
)
@click.option(
    "--share-unix-user",
    is_flag=True,
    default=None,
    help="Let --unix-user be one that a live token has already: both are one tenant on the hosts.",
)
@limit_options
def token_create(name, role, user, team, expires_in, unix_user, share_unix_user, **limits):
    """Create an API token; its secret is printed once. The limits not given are the server's
    settings."""
    body = {
        "name": name,
        "role": role,
        "user": user,
        "team": team,
        "expires_in_seconds": expires_in,
        "unix_user": unix_user,
        "share_unix_user": share_unix_user,
        "limits": given_limits(limits) or None,
    }
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


@client_command(token, "update")
@click.argument("token_id")
@limit_options
@click.option(
    "--reset",
    "reset",
    multiple=True,
    type=click.Choice(LIMITS),
    help="Give this limit back to the server's setting (repeatable).",
)
def token_update(token_id, reset, **limits):
    """Change a token's own limits; those not named stay as they are."""
    changes = {**given_limits(limits), **dict.fromkeys(reset)}
    if not changes:
        raise click.UsageError("name a limit to set (--max-active-jobs ...) or to --reset")
    data = current_client().patch(f"/api/v1/tokens/{token_id}", {"limits": changes})
    emit(data, lambda d: click.echo(f"token {d['id']} ({d['name']}): limits {own_limits(d)}"))


@client_command(token, "revoke")
@click.argument("token_id")
def token_revoke(token_id):
    """Revoke an API token; it stops working at once."""
    current_client().delete(f"/api/v1/tokens/{token_id}")
    emit({"id": token_id, "revoked": True}, lambda d: click.echo(f"revoked token {token_id}"))


@token.command("current")
@click.option(
    "--valid-for",
    type=Duration(),
    default="30m",
    show_default=True,
    help="Refresh a saved session first unless it lasts this much longer (a session lasts 1h).",
)
def token_current(valid_for):
    """Print the token `fleetd login` saved, for a tool that takes FLEETD_TOKEN (Ansible,
    Terraform) to act with your own session: `FLEETD_TOKEN=$(fleetd token current)`. fleetd
    records what the tool does as yours, made with your session."""
    try:
        saved = load_config()
        if saved.get("token"):
            saved = fresh_session(saved, ahead=valid_for)
    except ClientError as exc:
        fail(describe_error(exc))
    if not saved.get("token"):
        fail("no saved token: sign in first (`fleetd login --provider NAME`, or `fleetd login`)")
    click.echo(saved["token"])


COMMANDS = [token]
