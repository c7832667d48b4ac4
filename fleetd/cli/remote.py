"""The plumbing of the commands that call fleetd's REST API: their --url/--token/--json options, the
client of the running command, the ids that names stand for, and reading a log page by page."""

import datetime as dt
import functools
import os
import re
import sys

import click

from fleetd.cli.output import cell, describe_error, fail
from fleetd.cli.params import parse_duration
from fleetd.client import Client, ClientError, credentials


def client_command(group, name, **kwargs):
    """A command that talks to the REST API: adds --url/--token/--json and turns errors into one
    line.

    `group` is the command group it belongs to, or None for a command of the root group (fleetd.cli
    adds those).
    """
    make_command = click.command if group is None else group.command

    def decorator(fn):
        @make_command(name, **kwargs)
        @click.option(
            "--url",
            envvar="FLEETD_URL",
            help="fleetd URL (FLEETD_URL; default: saved by `fleetd login`).",
        )
        @click.option(
            "--token",
            envvar="FLEETD_TOKEN",
            help="API token (FLEETD_TOKEN; default: saved by login).",
        )
        @click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
        @click.pass_context
        @functools.wraps(fn)
        def wrapper(ctx, url, token, as_json, **params):
            try:
                url, token = credentials(url, token)
            except ClientError as exc:
                fail(exc.message)
            ctx.obj = {"client": Client(url, token), "json": as_json}
            try:
                return ctx.invoke(fn, **params)
            except ClientError as exc:
                fail(describe_error(exc))

        return wrapper

    return decorator


def current_client():
    """The fleetd.client.Client of the running client command."""
    return click.get_current_context().obj["client"]


# Ids are 20 lowercase hex characters (docs/api.md, Conventions): anything else can only be a name.
ID_RE = re.compile(r"[0-9a-f]{20}")
CANDIDATES_SHOWN = 20
# kind -> (its collection, the list filter that names one, the columns that tell same-named ones
# apart)
HANDLES = {
    "instance": (
        "/api/v1/instances",
        "name",
        [("ID", "id"), ("OWNER", "owner"), ("STATE", "state"), ("CREATED", "created_at")],
    ),
    "job": (
        "/api/v1/jobs",
        "name",
        [("ID", "id"), ("OWNER", "owner"), ("STATE", "state"), ("SUBMITTED", "submitted_at")],
    ),
    "node": (
        "/api/v1/nodes",
        "hostname",
        [("ID", "id"), ("FLEET", "fleet"), ("STATUS", "status"), ("REGISTERED", "registered_at")],
    ),
}


def resolve_id(kind, handle):
    """The id of the instance, job or node `handle` names: an existing id as it is; else the one of
    that name (a node's hostname) among those the token may see; for an instance, its live one
    before deleted ones. ClientError when none or several match (those listed, to pick an id
    from)."""
    path, key, columns = HANDLES[kind]
    client = current_client()
    if ID_RE.fullmatch(handle):
        try:
            client.get(f"{path}/{handle}")
            return handle
        except ClientError as exc:
            if exc.status != 404:
                raise
    found = client.get(path, limit=CANDIDATES_SHOWN + 1, **{key: handle})["items"]
    if not found and kind == "instance":
        found = client.get(path, limit=CANDIDATES_SHOWN + 1, state="deleted", name=handle)["items"]
        if not found and ID_RE.fullmatch(handle) and _deleted_instance(client, path, handle):
            return handle
    if len(found) == 1:
        return found[0]["id"]
    if not found:
        tried = f"that id or {key}" if ID_RE.fullmatch(handle) else f"that {key}"
        raise ClientError(
            f"{kind} {handle} not found: no {kind} this token may see has {tried}", 404, "not_found"
        )
    shown = found[:CANDIDATES_SHOWN]
    rows = [[header for header, _ in columns]] + [
        [cell(item.get(field)) for _, field in columns] for item in shown
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    more = f" (the first {CANDIDATES_SHOWN} shown)" if len(found) > len(shown) else ""
    raise ClientError(
        "\n".join(
            [f"{key} {handle!r} names several {kind}s{more}; give the id of the one you mean:"]
            + ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        )
    )


def _deleted_instance(client, path, instance_id):
    """True when `instance_id` is a deleted instance this token may see: GET of it answers 404, its
    events (and logs) remain."""
    try:
        client.get(f"{path}/{instance_id}/events", limit=1)
        return True
    except ClientError as exc:
        if exc.status != 404:
            raise
        return False


def read_log_pages(path, after, show, **params):
    """Print every line of a log (a job's, an instance's) after `after`; returns the seq of the last
    one."""
    client = current_client()
    for _ in range(1_000_000):  # bounded: a log of a billion lines would still end
        page = client.get(path, after=after, limit=1000, **params)
        for line in page["items"]:
            show(line)
            after = line["seq"]
        if not page["next_cursor"]:
            break
        after = int(page["next_cursor"])  # past lines a filter left out, too
    return after


def log_filter_options(command):
    """The options of a logs command that filter its lines."""
    for option in reversed(
        (
            click.option("--since", help="Lines seen since: a duration (10m, 2h) or a time."),
            click.option("--until", help="Lines seen until: a duration ago or a time."),
            click.option("--grep", help="Lines that contain this text, in the whole output."),
            click.option("--regex", is_flag=True, help="--grep is a regex (RE2 syntax)."),
            click.option(
                "--stream", type=click.Choice(["stdout", "stderr", "system"]), help="One stream."
            ),
        )
    ):
        command = option(command)
    return command


def log_filters(since, until, grep, regex, stream):
    """The query of a logs call for the CLI's filter options (`since`/`until`: a duration before
    now, like 10m, or an RFC 3339 time)."""
    return {
        "since": _moment(since, "--since"),
        "until": _moment(until, "--until"),
        "q": grep,
        "q_regex": "true" if grep and regex else None,
        "stream": stream,
    }


def _moment(value, option):
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except click.BadParameter:
        text = value.strip().replace("Z", "+00:00")
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            raise click.BadParameter(
                f"{value!r} is neither a duration (10m, 2h) nor an RFC 3339 time", param_hint=option
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        return when.isoformat()
    return (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds)).isoformat()


def download_output(path, out_path, **params):
    """Write a whole output (GET `path`) to `out_path`, or to stdout for '-'; returns the bytes."""
    client = current_client()
    if out_path in (None, "-"):
        written = client.download(path, sys.stdout.buffer, **params)
        sys.stdout.buffer.flush()
        return written
    tmp = out_path + ".part"
    with open(tmp, "wb") as fh:
        written = client.download(path, fh, **params)
    os.replace(tmp, out_path)
    return written
