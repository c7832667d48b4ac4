"""`fleetd project` and `fleetd user`: projects, their members and service accounts; users."""

import click

from fleetd.cli.output import emit, show_table
from fleetd.cli.params import Duration
from fleetd.cli.remote import client_command, current_client

PROJECT_COLUMNS = [
    ("KEY", "key"),
    ("NAME", "display_name"),
    ("TEAM", "team"),
    ("DESCRIPTION", "description"),
]
USER_COLUMNS = [
    ("LOGIN", "login"),
    ("NAME", "display_name"),
    ("ROLE", "role"),
    ("TEAM", "team"),
    ("PROJECT", "default_project"),
    ("SOURCE", "source"),
    ("ACTIVE", "active"),
]


@click.group()
def project():
    """Projects: groups of work in a team, their members and service accounts."""


@client_command(project, "list")
def project_list():
    """List the projects you may see."""
    items = list(current_client().paginate("/api/v1/projects"))
    emit(items, lambda rows: show_table(rows, PROJECT_COLUMNS))


@client_command(project, "create")
@click.argument("key")
@click.option("--name", help="Its name (default: the key).")
@click.option("--display-name", help="The name people read (default: the name).")
@click.option("--team", help="The team its work runs as (budgets, quotas).")
@click.option("--description", default="", help="What it is for.")
def project_create(key, name, display_name, team, description):
    """Create a project (admins)."""
    body = {"key": key, "name": name, "display_name": display_name, "team": team}
    body = {k: v for k, v in body.items() if v is not None}
    data = current_client().post("/api/v1/projects", {**body, "description": description})
    emit(data, lambda d: click.echo(f"created project {d['key']} (team {d['team'] or '-'})"))


@client_command(project, "show")
@click.argument("key")
def project_show(key):
    """A project and its members."""
    client = current_client()
    data = {
        **client.get(f"/api/v1/projects/{key}"),
        "members": client.get(f"/api/v1/projects/{key}/members")["items"],
    }

    def human(d):
        click.echo(f"{d['key']}: {d['display_name']} (team {d['team'] or '-'})")
        if d["description"]:
            click.echo(d["description"])
        show_table(d["members"], [("LOGIN", "login"), ("NAME", "display_name"), ("ROLE", "role")])

    emit(data, human)


@client_command(project, "rm")
@click.argument("key")
def project_rm(key):
    """Delete a project that holds no live work (admins)."""
    current_client().delete(f"/api/v1/projects/{key}")
    emit({"key": key, "deleted": True}, lambda d: click.echo(f"deleted project {key}"))


@client_command(project, "add-member")
@click.argument("key")
@click.argument("login")
@click.option(
    "--role",
    type=click.Choice(["admin", "member", "viewer"]),
    default="member",
    show_default=True,
    help="admin: its members and service accounts; member: submits; viewer: reads its work.",
)
def project_add_member(key, login, role):
    """Make a user a member of a project (admins, the project's admins)."""
    data = current_client().put(f"/api/v1/projects/{key}/members/{login}", {"role": role})
    emit(data, lambda d: click.echo(f"{d['login']} is {d['role']} of {d['project']}"))


@client_command(project, "rm-member")
@click.argument("key")
@click.argument("login")
def project_rm_member(key, login):
    """Take a user out of a project."""
    current_client().delete(f"/api/v1/projects/{key}/members/{login}")
    emit({"project": key, "login": login}, lambda d: click.echo(f"{login} left {key}"))


@client_command(project, "service-account")
@click.argument("key")
@click.option("--name", required=True, help="What it is for, e.g. the CI pipeline.")
@click.option(
    "--expires-in", type=Duration(), default="30d", show_default=True, help="Its lifetime."
)
def project_service_account(key, name, expires_in):
    """Make a service account of the project: a token that submits to it only, and expires. Its
    secret is printed once."""
    body = {"name": name, "expires_in_seconds": expires_in}
    data = current_client().post(f"/api/v1/projects/{key}/service-accounts", body)

    def human(d):
        click.echo(f"service account {d['id']} of {key}, until {d['expires_at']}; the secret:")
        click.echo(d["token"])

    emit(data, human)


@click.group()
def user():
    """Users: people, and the users made of token names."""


@client_command(user, "list")
@click.option("--active/--inactive", default=None, help="Only those that are (or are not).")
def user_list(active):
    """List users (admins)."""
    params = {} if active is None else {"active": "true" if active else "false"}
    items = list(current_client().paginate("/api/v1/users", **params))
    emit(items, lambda rows: show_table(rows, USER_COLUMNS))


@client_command(user, "show")
@click.argument("login")
def user_show(login):
    """A user (yourself, or anyone for admins)."""
    data = current_client().get(f"/api/v1/users/{login}")
    emit(data, lambda d: show_table([d], USER_COLUMNS))


@client_command(user, "update")
@click.argument("login")
@click.option(
    "--role",
    type=click.Choice(["admin", "operator", "member", "viewer"]),
    help="Its role in fleetd.",
)
@click.option("--default-project", help="Where its work goes when a spec names no project.")
@click.option(
    "--deactivate", "active", flag_value=False, default=None, help="End its sessions and tokens."
)
@click.option("--activate", "active", flag_value=True, help="Let it sign in again.")
def user_update(login, role, default_project, active):
    """Change a user's role, default project, or whether it is active (admins)."""
    body = {"role": role, "default_project": default_project, "active": active}
    body = {k: v for k, v in body.items() if v is not None}
    if not body:
        raise click.UsageError("name a change: --role, --default-project, --deactivate, --activate")
    data = current_client().patch(f"/api/v1/users/{login}", body)
    emit(data, lambda d: show_table([d], USER_COLUMNS))


COMMANDS = [project, user]
