"""The plumbing of the commands that call fleetd's REST API: their --url/--token/--json options, the client of
the running command, and reading a log page by page."""

import functools

import click

from fleetd.cli.output import describe_error, fail
from fleetd.client import DEFAULT_URL, Client, ClientError, load_config


def client_command(group, name, **kwargs):
    """A command that talks to the REST API: adds --url/--token/--json and turns errors into one line.

    `group` is the command group it belongs to, or None for a command of the root group (fleetd.cli adds those).
    """
    make_command = click.command if group is None else group.command

    def decorator(fn):
        @make_command(name, **kwargs)
        @click.option("--url", envvar="FLEETD_URL", help="fleetd URL (FLEETD_URL; default: saved by `fleetd login`).")
        @click.option("--token", envvar="FLEETD_TOKEN", help="API token (FLEETD_TOKEN; default: saved by login).")
        @click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
        @click.pass_context
        @functools.wraps(fn)
        def wrapper(ctx, url, token, as_json, **params):
            saved = {}
            if not url or not token:
                try:
                    saved = load_config()
                except ClientError as exc:
                    fail(exc.message)
            ctx.obj = {
                "client": Client(url or saved.get("url") or DEFAULT_URL, token or saved.get("token")),
                "json": as_json,
            }
            try:
                return ctx.invoke(fn, **params)
            except ClientError as exc:
                fail(describe_error(exc))

        return wrapper

    return decorator


def current_client():
    """The fleetd.client.Client of the running client command."""
    return click.get_current_context().obj["client"]


def read_log_pages(path, after, show, **params):
    """Print every line of a log (a job's, an instance's) after `after`; returns the seq of the last one."""
    client = current_client()
    for _ in range(1_000_000):  # bounded: a log of a billion lines would still end
        page = client.get(path, after=after, limit=1000, **params)
        for line in page["items"]:
            show(line)
            after = line["seq"]
        if not page["next_cursor"]:
            break
    return after
