"""What the commands print: errors, numbers, tables, records, and --json."""

import json
import re
import sys

import click


def fail(message):
    """Print the message to stderr (its first line prefixed `fleetd: `, the rest indented) and exit
    1."""
    first, *rest = message.splitlines() or [""]
    click.echo(f"fleetd: {first}", err=True)
    for line in rest:
        click.echo(f"  {line}", err=True)
    sys.exit(1)


_ROLE_REFUSED_RE = re.compile(r"^role '(\w+)' may not do this$")
# What a role may not do needs one of these (docs/api.md, Roles): a submitter's refusals are
# admin-only routes.
_OTHER_ROLES = {"submitter": "an admin token", "metrics": "an admin or submitter token"}


def describe_error(exc):
    """The error as the user should read it: code and message, then one line per field error."""
    if exc.status is None:
        return exc.message
    label = exc.code or f"HTTP {exc.status}"
    message = exc.message
    if exc.status == 401:
        message += " (check --token/FLEETD_TOKEN, or run `fleetd login`)"
    elif exc.status == 403:
        match = _ROLE_REFUSED_RE.match(message)
        if match:
            ctx = click.get_current_context(silent=True)
            command = f"`{ctx.command_path}`" if ctx else "this command"
            message += (
                f": {command} needs {_OTHER_ROLES.get(match.group(1), 'a token of another role')}"
            )
    fields = exc.field_errors()
    if len(fields) == 1 and message in (
        "the request did not validate",
        fields[0].split(": ", 1)[1],
    ):
        return f"{label}: {fields[0]}"  # the message said only what the field's line says
    return "\n".join([f"{label}: {message}"] + fields)


def number(value):
    """A number as people write it: whole values without `.0`, fractions as they are (0.5, 2.25)."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    return str(value)


def plural(count, noun):
    """`1 GPU`, `0.5 GPUs`, `8 GPUs`: singular for exactly one."""
    return f"{number(count)} {noun}" + ("" if count == 1 else "s")


def byte_size(size):
    """Bytes as people read them: 512 B, 1.5 KiB, 80.0 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024


def span(seconds):
    """A duration as people read it: 45s, 12m 03s, 3h 07m, 2d 4h."""
    if seconds is None:
        return None
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def money(value):
    """A price or a cost to the cent; None stays None (shown as `-`)."""
    return None if value is None else f"{value:.2f}"


def _console():
    from rich.console import Console

    # Piped output is never cut to 80 columns: ids must survive copy and paste and grep.
    return Console() if sys.stdout.isatty() else Console(width=1000)


def show_table(rows, columns, title=None):
    """Rows (dicts) as a table; `columns` is [(header, key or callable)]."""
    from rich.table import Table

    table = Table(title=title, box=None, header_style="bold")
    for header, _ in columns:
        if header in ("ID", "UUID"):
            table.add_column(header, no_wrap=True, min_width=20)
        else:
            table.add_column(header)
    for row in rows:
        table.add_row(
            *[cell(getter(row) if callable(getter) else row.get(getter)) for _, getter in columns]
        )
    _console().print(table)


def show_record(record, fields):
    """One record as aligned `key: value` lines."""
    width = max(len(k) for k, _ in fields)
    for header, getter in fields:
        value = getter(record) if callable(getter) else record.get(getter)
        click.echo(f"{header.ljust(width)}  {cell(value)}")


def event_actor(event):
    """Who caused an event, with the credential when the actor does not say it: `user:alice
    (session)`, `user:alice (token:ansible)`."""
    actor, via = event.get("actor"), event.get("actor_via")
    return f"{actor} ({via})" if via and via != actor else actor


# The columns of a node's or an instance's events.
EVENT_COLUMNS = [
    ("AT", "at"),
    ("KIND", "kind"),
    ("FROM", "from_status"),
    ("TO", "to_status"),
    ("ACTOR", event_actor),
    ("REASON", "reason"),
]
_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(\.\d+)?Z$")


def cell(value):
    """A value as a table cell or record line shows it (times in UTC to the second, None as `-`)."""
    if isinstance(value, str) and _TIME_RE.match(value):
        return _TIME_RE.sub(r"\1 \2", value)  # UTC, to the second
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def wants_json():
    """Whether the running client command was given --json."""
    return click.get_current_context().obj["json"]


def emit(data, human):
    """--json prints the API's JSON; otherwise `human(data)` renders it."""
    if wants_json():
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        human(data)


def log_printer(with_rank):
    """A printer of log lines: stdout lines to stdout, stderr and the agent's own lines to
    stderr."""

    def show(line):
        prefix = f"[rank {line['rank']}] " if with_rank else ""
        click.echo(prefix + line["text"], err=line["stream"] != "stdout")

    return show
