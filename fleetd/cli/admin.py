"""Local admin commands (init, serve, db upgrade), `login`, and `status`."""

import logging
import os
import sys
import time

import click

from fleetd.cli.output import (
    byte_size,
    cell,
    describe_error,
    emit,
    fail,
    number,
    plural,
    show_table,
)
from fleetd.cli.remote import client_command, current_client
from fleetd.client import DEFAULT_URL, Client, ClientError, save_config


def _server_settings(**overrides):
    from fleetd.settings import Settings

    try:
        return Settings.load(**overrides)
    except (ValueError, OSError) as exc:
        fail(f"bad configuration: {exc}")


def _setup_logging(level="INFO"):
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


db_option = click.option(
    "--db", "db_url", help="Database URL (FLEETD_DB_URL): sqlite:///PATH or postgresql://..."
)
data_dir_option = click.option(
    "--data-dir", help="Data directory (FLEETD_DATA_DIR; default /var/lib/fleetd)."
)


def _open_upgraded(settings):
    from fleetd.db import bind, open_database, upgrade

    if settings.database_url.startswith("sqlite:"):
        os.makedirs(settings.data_dir, mode=0o700, exist_ok=True)
    try:
        db = open_database(settings.database_url, settings.sqlite_synchronous)
        applied = upgrade(db)
    except Exception as exc:  # any driver error: report it in one line
        fail(f"cannot open database: {type(exc).__name__}: {exc}")
    bind(db)
    return db, applied


@click.command()
@db_option
@data_dir_option
def init(db_url, data_dir):
    """Create the database and print the first admin token (once)."""
    from fleetd.clock import utcnow
    from fleetd.services.identity.tokens import issue_first_admin_token

    settings = _server_settings(db_url=db_url, data_dir=data_dir)
    db, applied = _open_upgraded(settings)
    with db.connection_context():
        token = issue_first_admin_token(utcnow())
    click.echo(f"database ready: {settings.database_url} ({len(applied)} migration(s) applied)")
    if token is None:
        click.echo(
            "an admin token was issued before; create more with `fleetd token create --role admin`"
        )
        return
    click.echo("first admin token (shown once, store it now):")
    click.echo(token)


@click.command()
@click.option("--bind", help="HOST:PORT to listen on (FLEETD_BIND; default 127.0.0.1:8080).")
@db_option
@data_dir_option
@click.option(
    "--log-level",
    envvar="FLEETD_LOG_LEVEL",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Least severe log lines written to stderr (FLEETD_LOG_LEVEL).",
)
def serve(bind: str | None, db_url: str | None, data_dir: str | None, log_level: str) -> None:
    """Run the API server and background tasks until SIGTERM."""
    from fleetd.server import serve as run_server

    _setup_logging(log_level)
    settings = _server_settings(bind=bind, db_url=db_url, data_dir=data_dir)
    if settings.database_url.startswith("sqlite:"):
        os.makedirs(settings.data_dir, mode=0o700, exist_ok=True)
    try:
        run_server(settings)
    except OSError as exc:
        fail(f"cannot serve on {settings.bind}: {exc.strerror or exc}")
    except ValueError as exc:
        fail(str(exc))


@click.group()
def db():
    """Database administration."""


@db.command("upgrade")
@db_option
@data_dir_option
def db_upgrade(db_url, data_dir):
    """Apply pending schema migrations."""
    settings = _server_settings(db_url=db_url, data_dir=data_dir)
    _, applied = _open_upgraded(settings)
    click.echo("applied: " + ", ".join(applied) if applied else "database is up to date")


@click.command()
@click.option(
    "--url", envvar="FLEETD_URL", default=DEFAULT_URL, show_default=True, help="fleetd URL."
)
@click.option("--token", envvar="FLEETD_TOKEN", help="API token; asked for when not given.")
@click.option(
    "--provider",
    help="Sign in with this identity provider instead: open the URL shown, enter the code, and "
    "the session is saved (refreshed by later commands).",
)
def login(url, token, provider):
    """Sign in (with --provider) or check a token, and save URL and credentials for later
    commands."""
    if provider:
        return _device_login(url, provider)
    token = token or click.prompt("API token", hide_input=True)
    client = Client(url, token)
    try:
        who = client.get("/api/v1/whoami")
    except ClientError as exc:
        fail(describe_error(exc))
    path = save_config(client.url, token)
    click.echo(f"logged in to {client.url} as {who['principal']} ({who['role']}); saved to {path}")


def _device_login(url, provider):
    """The device authorization grant (RFC 8628) through fleetd: show where to go and the code,
    then ask for the session every `interval` seconds until the person approved, refused, or the
    code expired."""
    client = Client(url)
    try:
        started = client.post("/api/v1/auth/device", {"provider": provider})
    except ClientError as exc:
        fail(describe_error(exc))
    where = started.get("verification_uri_complete") or started["verification_uri"]
    click.echo(f"Open {where} and enter the code {started['user_code']} to sign in to fleetd.")
    interval = max(1, int(started.get("interval") or 5))
    deadline = time.monotonic() + int(started.get("expires_in") or 600)
    while time.monotonic() < deadline:
        time.sleep(interval)
        try:
            session = client.post(
                "/api/v1/auth/device/token",
                {"device_code": started["device_code"], "provider": provider},
            )
        except ClientError as exc:
            if exc.code == "authorization_pending":
                continue
            if exc.code == "slow_down":
                interval += 5
                continue
            fail(describe_error(exc))
        path = save_config(
            client.url,
            session["token"],
            refresh_token=session["refresh_token"],
            expires_at=session["expires_at"],
        )
        user = session["user"]
        click.echo(
            f"signed in to {client.url} as user:{user['login']} ({user['role']}); saved to {path}"
        )
        return None
    fail("the code expired before the sign-in was approved; run `fleetd login --provider` again")


@client_command(None, "status")
def status():
    """Server version, who you are, GPUs used/free/blocked per series, nodes by status."""
    client = current_client()
    health = client.get("/api/v1/health")
    who = client.get("/api/v1/whoami")
    cluster = client.get("/api/v1/cluster/status")
    data = {"url": client.url, "version": health["version"], "whoami": who, "cluster": cluster}

    def human(d):
        gpu = cluster["gpu"]
        click.echo(
            f"fleetd {d['version']} at {d['url']}, you are {who['principal']} ({who['role']})"
        )
        if who.get("use"):  # an API token: what it holds of its limits
            use, limits = who["use"], who["limits"]
            click.echo(
                f"your use: {use['active_jobs']}/{limits['max_active_jobs']} active jobs, "
                f"{use['instances']}/{limits['max_instances']} instances, "
                + (
                    f"{byte_size(use['stored_spec_bytes'])}/"
                    f"{byte_size(limits['max_stored_spec_bytes'])} of specs, "
                    if "stored_spec_bytes" in use
                    else ""
                )  # an older server counts none
                + (
                    f"{byte_size(use['artifact_bytes'])}/{byte_size(limits['max_artifact_bytes'])} "
                    f"of artifacts"
                )
            )
        nodes = cluster["nodes"]
        summary = ", ".join(f"{n} {s}" for s, n in sorted(nodes.items())) or "none"
        click.echo(f"nodes: {sum(nodes.values())} ({summary})")
        # The series' QUEUED add up to the total: work that takes any model has a row of its own.
        click.echo(
            f"GPUs: {number(gpu['total'])} total = {number(gpu['used'])} used + "
            f"{number(gpu['free'])} free + {number(gpu['blocked'])} blocked; "
            f"{number(gpu['queued'])} queued"
        )
        if gpu["series"]:
            show_table(
                gpu["series"],
                [
                    ("SERIES", "label"),
                    ("TOTAL", "total"),
                    ("USED", "used"),
                    ("FREE", "free"),
                    ("BLOCKED", "blocked"),
                    ("QUEUED", "queued"),
                ],
            )
        for note in gpu["blocked_notes"]:
            when = f", opens {cell(note['next_open_at'])} UTC" if note.get("next_open_at") else ""
            click.echo(
                f"  blocked: {plural(note['count'], note['series'] + ' GPU')}: "
                f"{note['reason']}{when}"
            )

    emit(data, human)


COMMANDS = [init, serve, db, login, status]
