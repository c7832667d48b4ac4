"""The `fleetd` command line: local admin commands (init, serve, db) and REST client commands."""

import functools
import json
import logging
import os
import re
import shlex
import sys

import click

from fleetd.client import DEFAULT_URL, Client, ClientError, load_config, save_config

_DURATION_RE = re.compile(r"^(\d+)([smhdw]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value):
    """'90s', '30m', '24h', '7d', '2w' or plain seconds -> seconds."""
    match = _DURATION_RE.match(value.strip().lower())
    if not match:
        raise click.BadParameter(f"{value!r} is not a duration like 90s, 30m, 24h or 7d")
    return int(match.group(1)) * _UNITS[match.group(2)]


class Duration(click.ParamType):
    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_duration(value)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


def fail(message):
    """Print the message to stderr (its first line prefixed `fleetd: `, the rest indented) and exit 1."""
    first, *rest = message.splitlines() or [""]
    click.echo(f"fleetd: {first}", err=True)
    for line in rest:
        click.echo(f"  {line}", err=True)
    sys.exit(1)


_ROLE_REFUSED_RE = re.compile(r"^role '(\w+)' may not do this$")
# What a role may not do needs one of these (docs/api.md, Roles): a submitter's refusals are admin-only routes.
_OTHER_ROLES = {"submitter": "an admin token", "metrics": "an admin or submitter token"}


def _describe(exc):
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
            message += f": {command} needs {_OTHER_ROLES.get(match.group(1), 'a token of another role')}"
    fields = exc.field_errors()
    if len(fields) == 1 and message in ("the request did not validate", fields[0].split(": ", 1)[1]):
        return f"{label}: {fields[0]}"  # the message said only what the field's line says
    return "\n".join([f"{label}: {message}"] + fields)


def _num(value):
    """A number as people write it: whole values without `.0`, fractions as they are (0.5, 2.25)."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    return str(value)


def _plural(count, noun):
    """`1 GPU`, `0.5 GPUs`, `8 GPUs`: singular for exactly one."""
    return f"{_num(count)} {noun}" + ("" if count == 1 else "s")


# ---------------------------------------------------------------- output


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
        table.add_row(*[_cell(getter(row) if callable(getter) else row.get(getter)) for _, getter in columns])
    _console().print(table)


def show_record(record, fields):
    """One record as aligned `key: value` lines."""
    width = max(len(k) for k, _ in fields)
    for header, getter in fields:
        value = getter(record) if callable(getter) else record.get(getter)
        click.echo(f"{header.ljust(width)}  {_cell(value)}")


_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(\.\d+)?Z$")


def _cell(value):
    if isinstance(value, str) and _TIME_RE.match(value):
        return _TIME_RE.sub(r"\1 \2", value)  # UTC, to the second
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def emit(ctx, data, human):
    """--json prints the API's JSON; otherwise `human(data)` renders it."""
    if ctx.obj["json"]:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        human(data)


# ---------------------------------------------------------------- client plumbing


def client_command(group, name, **kwargs):
    """A command that talks to the REST API: adds --url/--token/--json and turns errors into one line."""

    def decorator(fn):
        @group.command(name, **kwargs)
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
                fail(_describe(exc))

        return wrapper

    return decorator


def _client():
    return click.get_current_context().obj["client"]


def _ctx():
    return click.get_current_context()


# ---------------------------------------------------------------- root and local commands


class LazyGroup(click.Group):
    """Operator commands that need the [provision] extra (Fabric) are imported only when used."""

    lazy = {"bootstrap": "fleetd.provision.cli:bootstrap", "bundle": "fleetd.provision.cli:bundle"}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name not in self.lazy:
            return super().get_command(ctx, name)
        import importlib

        module, _, attr = self.lazy[name].partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            absent = exc.name

        @click.command(name, help=f"(needs: pip install 'fleetd[provision]'; {absent} is missing)")
        def missing():
            fail(f"`fleetd {name}` needs the provision extra: pip install 'fleetd[provision]' ({absent} is missing)")

        return missing


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="fleetd", prog_name="fleetd")
def cli():
    """fleetd: manage a fleet of GPU servers."""


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


db_option = click.option("--db", "db_url", help="Database URL (FLEETD_DB_URL): sqlite:///PATH or postgresql://...")
data_dir_option = click.option("--data-dir", help="Data directory (FLEETD_DATA_DIR; default /var/lib/fleetd).")


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


@cli.command()
@db_option
@data_dir_option
def init(db_url, data_dir):
    """Create the database and print the first admin token (once)."""
    from fleetd.clock import utcnow
    from fleetd.services.tokens import issue_first_admin_token

    settings = _server_settings(db_url=db_url, data_dir=data_dir)
    db, applied = _open_upgraded(settings)
    with db.connection_context():
        token = issue_first_admin_token(utcnow())
    click.echo(f"database ready: {settings.database_url} ({len(applied)} migration(s) applied)")
    if token is None:
        click.echo("an admin token was issued before; create more with `fleetd token create --role admin`")
        return
    click.echo("first admin token (shown once, store it now):")
    click.echo(token)


@cli.command()
@click.option("--bind", help="HOST:PORT to listen on (FLEETD_BIND; default 127.0.0.1:8080).")
@db_option
@data_dir_option
@click.option("--log-level", envvar="FLEETD_LOG_LEVEL", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Least severe log lines written to stderr (FLEETD_LOG_LEVEL).")
def serve(bind, db_url, data_dir, log_level):
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


@cli.group()
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


# ---------------------------------------------------------------- login and status


@cli.command()
@click.option("--url", envvar="FLEETD_URL", default=DEFAULT_URL, show_default=True, help="fleetd URL.")
@click.option("--token", envvar="FLEETD_TOKEN", help="API token; asked for when not given.")
def login(url, token):
    """Check a token against fleetd and save URL and token for later commands."""
    token = token or click.prompt("API token", hide_input=True)
    client = Client(url, token)
    try:
        who = client.get("/api/v1/whoami")
    except ClientError as exc:
        fail(_describe(exc))
    path = save_config(client.url, token)
    click.echo(f"logged in to {client.url} as {who['principal']} ({who['role']}); saved to {path}")


@client_command(cli, "status")
def status():
    """Server version, who you are, GPUs used/free/blocked per series, nodes by status."""
    client = _client()
    health = client.get("/api/v1/health")
    who = client.get("/api/v1/whoami")
    cluster = client.get("/api/v1/cluster/status")
    data = {"url": client.url, "version": health["version"], "whoami": who, "cluster": cluster}

    def human(d):
        gpu = cluster["gpu"]
        click.echo(f"fleetd {d['version']} at {d['url']}, you are {who['principal']} ({who['role']})")
        nodes = cluster["nodes"]
        summary = ", ".join(f"{n} {s}" for s, n in sorted(nodes.items())) or "none"
        click.echo(f"nodes: {sum(nodes.values())} ({summary})")
        # A series' QUEUED counts the jobs that ask for its model; those that take any model count only here.
        any_model = round(gpu["queued"] - sum(s["queued"] for s in gpu["series"]), 3)
        click.echo(f"GPUs: {_num(gpu['total'])} total = {_num(gpu['used'])} used + {_num(gpu['free'])} free"
                   f" + {_num(gpu['blocked'])} blocked; {_num(gpu['queued'])} queued"
                   + (f", {_num(any_model)} of them for any GPU model" if any_model > 0 and gpu["series"] else ""))
        if gpu["series"]:
            show_table(gpu["series"], [("SERIES", "label"), ("TOTAL", "total"), ("USED", "used"), ("FREE", "free"),
                                       ("BLOCKED", "blocked"), ("QUEUED", "queued")])
        for note in gpu["blocked_notes"]:
            when = f", opens {_cell(note['next_open_at'])} UTC" if note.get("next_open_at") else ""
            click.echo(f"  blocked: {_plural(note['count'], note['series'] + ' GPU')}: {note['reason']}{when}")

    emit(_ctx(), data, human)


# ---------------------------------------------------------------- tokens


@cli.group()
def token():
    """API tokens."""


TOKEN_COLUMNS = [("ID", "id"), ("NAME", "name"), ("ROLE", "role"), ("TEAM", "team"),
                 ("EXPIRES", "expires_at"), ("REVOKED", "revoked")]


@client_command(token, "create")
@click.option("--name", required=True, help="What the token is for.")
@click.option("--role", required=True, type=click.Choice(["admin", "submitter", "metrics"]),
              help="admin: everything; submitter: its own jobs, reading the fleet; metrics: metrics and status.")
@click.option("--team", help="Team of a submitter token.")
@click.option("--expires-in", type=Duration(), help="Lifetime, e.g. 30d (default: no expiry).")
def token_create(name, role, team, expires_in):
    """Create an API token; its secret is printed once."""
    body = {"name": name, "role": role, "team": team, "expires_in_seconds": expires_in}
    data = _client().post("/api/v1/tokens", {k: v for k, v in body.items() if v is not None})

    def human(d):
        click.echo(f"created token {d['id']} ({d['role']}); the secret is shown only now:")
        click.echo(d["token"])

    emit(_ctx(), data, human)


@client_command(token, "list")
def token_list():
    """List API tokens (never their secrets)."""
    items = list(_client().paginate("/api/v1/tokens"))
    emit(_ctx(), items, lambda rows: show_table(rows, TOKEN_COLUMNS))


@client_command(token, "revoke")
@click.argument("token_id")
def token_revoke(token_id):
    """Revoke an API token; it stops working at once."""
    _client().delete(f"/api/v1/tokens/{token_id}")
    emit(_ctx(), {"id": token_id, "revoked": True}, lambda d: click.echo(f"revoked token {token_id}"))


# ---------------------------------------------------------------- fleets


@cli.group()
def fleet():
    """Fleets."""


FLEET_COLUMNS = [("NAME", "name"), ("NODES", "node_count"), ("GPUS", "gpu_count"),
                 ("LABELS", "labels"), ("DESCRIPTION", "description")]


def _labels(values):
    labels = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--label")
        labels[key] = value
    return labels


@client_command(fleet, "create")
@click.argument("name")
@click.option("--description", default="", help="What the fleet is (free text).")
@click.option("--label", "labels", multiple=True, help="KEY=VALUE, repeatable.")
def fleet_create(name, description, labels):
    """Create a fleet."""
    data = _client().post("/api/v1/fleets", {"name": name, "description": description, "labels": _labels(labels)})
    emit(_ctx(), data, lambda d: click.echo(f"created fleet {d['name']}"))


@client_command(fleet, "list")
def fleet_list():
    """List fleets."""
    items = list(_client().paginate("/api/v1/fleets"))
    emit(_ctx(), items, lambda rows: show_table(rows, FLEET_COLUMNS))


def _availability(fleet):
    """A fleet's windows as `--window` takes them, with their time zone; `always open` without any."""
    availability = fleet.get("availability")
    if not availability:
        return "always open"
    windows = [f"{w['start']}-{w['end']}" + (f"@{','.join(w['days'])}" if w.get("days") else "")
               for w in availability["windows"]]
    return f"open {', '.join(windows)} ({availability['timezone']}); GPUs are blocked outside"


@client_command(fleet, "show")
@click.argument("name")
def fleet_show(name):
    """Show one fleet, with its availability windows."""
    data = _client().get(f"/api/v1/fleets/{name}")
    emit(_ctx(), data, lambda d: show_record(d, FLEET_COLUMNS + [("AVAILABILITY", _availability),
                                                                 ("CREATED", "created_at")]))


@client_command(fleet, "update")
@click.argument("name")
@click.option("--description", help="New description.")
@click.option("--label", "labels", multiple=True, help="KEY=VALUE; replaces all labels (repeatable).")
@click.option("--window", "windows", multiple=True,
              help="Open window HH:MM-HH:MM[@mon,tue,...] (repeatable); GPUs are blocked outside them.")
@click.option("--timezone", default="UTC", show_default=True, help="Time zone of --window.")
@click.option("--always-open", is_flag=True, help="Remove the availability windows.")
def fleet_update(name, description, labels, windows, timezone, always_open):
    """Change a fleet's description, labels or availability windows."""
    body = {}
    if description is not None:
        body["description"] = description
    if labels:
        body["labels"] = _labels(labels)
    if windows and always_open:
        raise click.UsageError("--window and --always-open are mutually exclusive")
    if always_open:
        body["availability"] = None
    elif windows:
        body["availability"] = {"timezone": timezone, "windows": [_window(w) for w in windows]}
    if not body:
        raise click.UsageError("nothing to change")
    data = _client().patch(f"/api/v1/fleets/{name}", body)
    emit(_ctx(), data, lambda d: click.echo(f"updated fleet {name}"))


def _window(text):
    span, _, days = text.partition("@")
    start, sep, end = span.partition("-")
    if not sep:
        raise click.BadParameter(f"{text!r} is not HH:MM-HH:MM[@mon,tue,...]", param_hint="--window")
    window = {"start": start, "end": end}
    if days:
        window["days"] = days.split(",")
    return window


@client_command(fleet, "rm")
@click.argument("name")
def fleet_rm(name):
    """Delete a fleet (refused while nodes are enrolled)."""
    _client().delete(f"/api/v1/fleets/{name}")
    emit(_ctx(), {"name": name, "deleted": True}, lambda d: click.echo(f"deleted fleet {name}"))


# ---------------------------------------------------------------- join tokens


@cli.group("join-token")
def join_token():
    """Join tokens that admit hosts into a fleet."""


JOIN_TOKEN_COLUMNS = [("ID", "id"), ("FLEET", "fleet"),
                      ("USES", lambda t: f"{t['uses']}/{t['max_uses'] or 'unlimited'}"),
                      ("EXPIRES", "expires_at"), ("REVOKED", "revoked"), ("DESCRIPTION", "description")]


def _env_join_command(token, join_command, url):
    """`FLEET_AGENT_JOIN_TOKEN=... fleet-agent join --server URL`: the secret stays out of argv (and so out of
    `ps` and the process accounting), as `fleet-agent join --help` asks."""
    words = shlex.split(join_command or "")
    server = words[words.index("--server") + 1] if "--server" in words[:-1] else url
    return f"FLEET_AGENT_JOIN_TOKEN={shlex.quote(token)} fleet-agent join --server {shlex.quote(server)}"


@client_command(join_token, "create")
@click.option("--fleet", "fleet_name", required=True, help="Fleet the hosts join.")
@click.option("--ttl", type=Duration(), default="24h", show_default=True, help="Lifetime, e.g. 1h, 7d.")
@click.option("--uses", type=click.IntRange(min=1), help="How many hosts may enrol with it.  [default: 1]")
@click.option("--single-use", is_flag=True, help="Same as --uses 1 (the default).")
@click.option("--unlimited", is_flag=True, help="Any number of hosts may enrol with it until it expires.")
@click.option("--description", default="", help="What the token is for (shown in `join-token list`).")
def join_token_create(fleet_name, ttl, uses, single_use, unlimited, description):
    """Mint a join token (one host, unless --uses N or --unlimited) and print the command that enrols a host."""
    if sum((uses is not None, single_use, unlimited)) > 1:
        raise click.UsageError("--uses, --single-use and --unlimited are mutually exclusive")
    body = {"ttl_seconds": ttl, "description": description}
    if not unlimited:
        body["max_uses"] = uses or 1
    data = _client().post(f"/api/v1/fleets/{fleet_name}/join-tokens", body)

    def human(d):
        hosts = (f"enrols {_plural(d['max_uses'], 'host')}" if d["max_uses"]
                 else "enrols any number of hosts")
        click.echo(f"join token {d['id']} for fleet {fleet_name}: {hosts} until {_cell(d['expires_at'])} UTC")
        click.echo("the token is shown only now; on " + ("the host" if d["max_uses"] == 1 else "each host")
                   + " run (as root):")
        click.echo(f"  {_env_join_command(d['token'], d.get('join_command'), _client().url)}")

    emit(_ctx(), data, human)


@client_command(join_token, "list")
@click.option("--fleet", "fleet_name", required=True, help="Fleet whose tokens to list.")
def join_token_list(fleet_name):
    """List a fleet's join tokens (never their secrets)."""
    items = list(_client().paginate(f"/api/v1/fleets/{fleet_name}/join-tokens"))
    emit(_ctx(), items, lambda rows: show_table(rows, JOIN_TOKEN_COLUMNS))


@client_command(join_token, "revoke")
@click.argument("token_id")
def join_token_revoke(token_id):
    """Revoke a join token."""
    _client().delete(f"/api/v1/join-tokens/{token_id}")
    emit(_ctx(), {"id": token_id, "revoked": True}, lambda d: click.echo(f"revoked join token {token_id}"))


# ---------------------------------------------------------------- nodes


@cli.group()
def node():
    """Nodes: list, inspect, cordon, drain, revoke, remove."""


def _gpus_cell(n):
    """The GPU count, or why there are none: "0 (cpu only)" / "0 (driver error)"."""
    status = n.get("gpu_status")
    if n["gpus"] or status in (None, "ok"):
        return len(n["gpus"])
    return f"0 ({status.replace('_', ' ')})"


NODE_COLUMNS = [("ID", "id"), ("HOSTNAME", "hostname"), ("FLEET", "fleet"), ("STATUS", "status"),
                ("GPUS", _gpus_cell), ("LAST HEARTBEAT", "last_heartbeat_at"),
                ("REASON", "status_reason")]


def _show_node(n):
    show_record(n, NODE_COLUMNS[:4] + [
        ("REASON", "status_reason"), ("ADDRESS", "address"), ("AGENT", "agent_version"),
        ("LABELS", "labels"), ("REGISTERED", "registered_at"), ("LAST HEARTBEAT", "last_heartbeat_at"),
        ("CPUS", lambda x: x["resources"]["cpu_count"]), ("MEMORY", lambda x: _bytes(x["resources"]["memory_bytes"])),
        ("DRAIN", lambda x: x["drain"] and f"{x['drain']['reason']} (deadline {x['drain']['deadline']})"),
        ("GPU STATUS", lambda x: x.get("gpu_status") and " - ".join(
            filter(None, [x["gpu_status"].replace("_", " "), x.get("gpu_status_reason")]))),
    ])
    if n["gpus"]:
        click.echo("")
        columns = [("IDX", "index"), ("UUID", "uuid"), ("MODEL", "model"),
                   ("MEMORY", lambda g: _bytes(g["memory_total_bytes"])), ("NUMA", "numa_node"),
                   ("HEALTHY", "healthy")]
        if n.get("allocation") is None:
            show_table(n["gpus"], columns + [("REASON", "health_reason")])
            click.echo("(which GPUs are in use, and by what, is shown to admins only)")
        else:
            show_table(n["gpus"], columns + [("STATE", lambda g: n["allocation"][g["uuid"]]["state"]),
                                             ("USED BY / REASON", lambda g: n["allocation"][g["uuid"]]["detail"])])


def _node_allocation(node_id, gpus):
    """{gpu uuid: {state, detail, tasks}} from the admin-only allocation view; None for other roles."""
    try:
        allocation = _client().get("/api/v1/cluster/allocation", node_id=node_id)
    except ClientError as exc:
        if exc.status == 403:
            return None
        raise
    held = {}  # gpu uuid -> what holds it
    for task in allocation["allocations"]:
        if task["node_id"] != node_id:
            continue
        for gpu in task["gpus"]:
            share = "" if gpu.get("exclusive", True) else f", {_num(gpu.get('compute_percent') or 0)}% compute"
            held.setdefault(gpu["uuid"], []).append({
                "task_id": task["task_id"], "job_id": task["job_id"], "rank": task["rank"],
                "text": f"job {task['job_id']} rank {task['rank']} ({task['state']}{share})"})
    out = {}
    listed = {g["uuid"]: g for g in allocation["gpus"] if g["node_id"] == node_id}
    for gpu in gpus:
        seen = listed.get(gpu["uuid"], {})
        state = seen.get("state") or "unknown"
        if held.get(gpu["uuid"]):
            detail = "; ".join(h["text"] for h in held[gpu["uuid"]])
        elif state == "blocked":
            detail = seen.get("blocked_reason") or seen.get("blocked_code") or gpu.get("health_reason") or ""
        else:
            detail = gpu.get("health_reason") or ""
        out[gpu["uuid"]] = {"state": state, "detail": detail or None, "tasks": held.get(gpu["uuid"], [])}
    return out


def _bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


@client_command(node, "list")
@click.option("--fleet", "fleet_name", help="Only nodes of this fleet.")
@click.option("--status", type=click.Choice(["pending", "ready", "cordoned", "draining", "drained", "lost",
                                             "revoked"]), help="Only nodes in this state.")
@click.option("--version", "agent_version", help="Only nodes whose agent runs this version (track a rollout).")
def node_list(fleet_name, status, agent_version):
    """List nodes."""
    items = list(_client().paginate("/api/v1/nodes", fleet=fleet_name, status=status, agent_version=agent_version))
    emit(_ctx(), items, lambda rows: show_table(rows, NODE_COLUMNS + [("AGENT", "agent_version")]))


@client_command(node, "show")
@click.argument("node_id")
def node_show(node_id):
    """Show a node and its GPUs: used, free or blocked, and by which job (admins)."""
    data = _client().get(f"/api/v1/nodes/{node_id}")
    data["allocation"] = _node_allocation(node_id, data["gpus"]) if data["gpus"] else {}
    emit(_ctx(), data, _show_node)


def _node_action(action, done, help_text):
    def command(node_id):
        data = _client().post(f"/api/v1/nodes/{node_id}/{action}")
        emit(_ctx(), data, lambda d: click.echo(f"{done} node {node_id}: now {d['status']}"))

    # The help is set before click reads it: a docstring assigned after the decorators would be lost.
    command.__doc__ = help_text
    return client_command(node, action)(click.argument("node_id")(command))


node_cordon = _node_action("cordon", "cordoned",
                           "Cordon a ready node: it takes no new work; what runs on it continues.")
node_uncordon = _node_action("uncordon", "uncordoned", "Uncordon a node: it takes new work again.")
node_undrain = _node_action("undrain", "undrained",
                            "Undrain a draining or drained node: it is ready and takes new work again.")
node_revoke = _node_action("revoke", "revoked",
                           "Revoke a node: its session token stops working and its tasks end lost (their jobs retry); "
                           "the host must join again to come back.")


@client_command(node, "drain")
@click.argument("node_id")
@click.option("--reason", required=True, help="Why (recorded in the node's events).")
@click.option("--deadline", type=Duration(), default="1h", show_default=True,
              help="Running tasks are stopped after this.")
def node_drain(node_id, reason, deadline):
    """Drain a node: no new work; running tasks may finish until the deadline."""
    data = _client().post(f"/api/v1/nodes/{node_id}/drain", {"reason": reason, "deadline_seconds": deadline})
    emit(_ctx(), data, lambda d: click.echo(f"draining node {node_id}: now {d['status']}"))


@client_command(node, "rm")
@click.argument("node_id")
def node_rm(node_id):
    """Remove a node (refused while tasks run on it)."""
    _client().delete(f"/api/v1/nodes/{node_id}")
    emit(_ctx(), {"id": node_id, "deleted": True}, lambda d: click.echo(f"removed node {node_id}"))


@client_command(node, "events")
@click.argument("node_id")
def node_events(node_id):
    """A node's events, oldest first."""
    items = list(_client().paginate(f"/api/v1/nodes/{node_id}/events"))
    emit(_ctx(), items, lambda rows: show_table(
        rows, [("AT", "at"), ("KIND", "kind"), ("FROM", "from_status"), ("TO", "to_status"), ("ACTOR", "actor"),
                     ("REASON", "reason")]))


# ---------------------------------------------------------------- jobs


@cli.group()
def job():
    """Jobs: submit, list, show, logs, cancel, wait."""


JOB_COLUMNS = [("ID", "id"), ("NAME", "name"), ("OWNER", "owner"), ("STATE", "state"), ("ATTEMPT", "attempt"),
               ("NODES", lambda j: ",".join(t["node_id"] or "-" for t in j["tasks"])),
               ("SUBMITTED", "submitted_at"), ("PENDING REASON", "pending_reason")]


def _load_spec(path):
    import yaml

    try:
        with open(path) as fh:
            spec = yaml.safe_load(fh)  # YAML is a superset of JSON: both work
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint="SPEC_FILE") from None
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"{path} is not YAML or JSON: {exc}", param_hint="SPEC_FILE") from None
    if not isinstance(spec, dict):
        raise click.BadParameter(f"{path} must hold a JobSpec object", param_hint="SPEC_FILE")
    return spec


class GpuCount(click.ParamType):
    name = "gpus"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of GPUs", param, ctx)
        if number >= 1 and number != int(number):
            return number  # fleetd refuses it, with the rule in its message
        return int(number) if number >= 1 or number == 0 else number


@client_command(job, "submit", context_settings={"ignore_unknown_options": False})
@click.option("-f", "--file", "spec_file", type=click.Path(dir_okay=False), help="JobSpec as YAML or JSON.")
@click.option("--name", help="Job name (default: the command's first word).")
@click.option("--gpus", type=GpuCount(), help="Whole GPUs per node, or a fraction 0 < x < 1 of one GPU.")
@click.option("--gpu-memory", "gpu_memory_bytes", type=click.IntRange(min=1), help="GPU memory per task, bytes.")
@click.option("--gpu-type", "gpu_types", multiple=True, help="Acceptable GPU model (repeatable).")
@click.option("--cpus", type=click.FloatRange(min=0),
              help="Host CPUs per node, reserved and enforced (default: no limit).")
@click.option("--num-nodes", type=click.IntRange(min=1), help="Nodes (ranks) of a gang job.")
@click.option("--env", "env", multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--fleet", "fleet_name", help="Run only on nodes of this fleet.")
@click.option("--max-runtime", type=Duration(), help="Stop the job after this long, e.g. 2h.")
@click.option("--retries", type=click.IntRange(min=0),
              help="Extra attempts after a lost node, a preemption or a failure of the job (default: 2, after a "
                   "lost node or a preemption only).")
@click.option("--wait", "wait_for_end", is_flag=True,
              help="Print the job's output while it runs, then its end; exit 0 only if it succeeded.")
@click.option("--no-wait-for-capacity", "refuse_if_never", is_flag=True,
              help="Refuse the job when no enrolled node could ever hold it, instead of queueing it for nodes "
                   "that may join later.")
@click.argument("command", nargs=-1)
def job_submit(spec_file, name, gpus, gpu_memory_bytes, gpu_types, cpus, num_nodes, env, fleet_name, max_runtime,
               retries, wait_for_end, refuse_if_never, command):
    """Submit a job: fleetd job submit [OPTIONS] -- COMMAND [ARGS]..."""
    spec = _load_spec(spec_file) if spec_file else {}
    if command:
        spec["command"] = list(command)
    if not spec.get("command"):
        raise click.UsageError("give a command after --, or a spec file with one")
    spec.setdefault("name", name or os.path.basename(str(spec["command"][0])) or "job")
    if name:
        spec["name"] = name
    resources = spec.setdefault("resources", {})
    for key, value in (("gpus", gpus), ("gpu_memory_bytes", gpu_memory_bytes), ("cpus", cpus)):
        if value is not None:
            resources[key] = value
    if gpu_types:
        resources["gpu_types"] = list(gpu_types)
    if num_nodes:
        spec["num_nodes"] = num_nodes
    if env:
        spec["env"] = {**spec.get("env", {}), **_labels(env)}
    if fleet_name:
        spec.setdefault("node_selector", {})["fleet"] = fleet_name
    if max_runtime:
        spec["max_runtime_seconds"] = max_runtime
    if retries is not None:
        spec["retry"] = {"max_attempts": retries + 1, "on": ["node_lost", "preempted", "failed"]}
    data = _client().request("POST", "/api/v1/jobs", json=spec,
                             params={"wait_for_capacity": "false"} if refuse_if_never else None)
    if wait_for_end:
        if _ctx().obj["json"]:
            data = _wait_job(data["id"], None)  # stdout is the JSON of the ended job, nothing else
        else:
            # As `docker run`: the job's output as it comes (stderr lines to stderr), then how it ended.
            click.echo(f"job {data['id']} {data['state']}; printing its output until it ends "
                       f"(Ctrl-C stops the waiting, not the job: `fleetd job cancel {data['id']}`)", err=True)
            try:
                data = _follow_logs(data["id"], None, _print_line(len(data["tasks"]) > 1))
            except KeyboardInterrupt:
                job_id = data["id"]
                click.echo(f"\nstopped waiting; job {job_id} goes on (`fleetd job logs -f {job_id}` follows it, "
                           f"`fleetd job cancel {job_id}` stops it)", err=True)
                sys.exit(130)
    emit(_ctx(), data, lambda d: click.echo(f"job {d['id']} {d['state']}"
                                            + (f": {d['pending_reason']}" if d["pending_reason"] else "")
                                            + (f" ({_result_reason(d['id'])})" if wait_for_end
                                               and d["state"] != "succeeded" else "")))
    if wait_for_end and data["state"] != "succeeded":
        sys.exit(1)


def _result_reason(job_id):
    """Why an ended job did not succeed, as its result says (`rank 1 failed (exit code 3)`)."""
    try:
        return _client().get(f"/api/v1/jobs/{job_id}/result").get("reason") or "no reason recorded"
    except ClientError as exc:
        return f"its result cannot be read: {exc.message}"


@client_command(job, "list")
@click.option("--state", type=click.Choice(["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]),
              help="Only jobs in this state.")
@click.option("--owner", help="Only jobs submitted by the token of this name.")
def job_list(state, owner):
    """List jobs (a submitter sees its own)."""
    items = list(_client().paginate("/api/v1/jobs", state=state, owner=owner))
    emit(_ctx(), items, lambda rows: show_table(rows, JOB_COLUMNS))


@client_command(job, "show")
@click.argument("job_id")
def job_show(job_id):
    """Show a job and its ranks."""

    def human(d):
        show_record(d, JOB_COLUMNS[:5] + [("STARTED", "started_at"), ("ENDED", "ended_at"),
                                          ("OUTCOME", "outcome"), ("PENDING REASON", "pending_reason"),
                                          ("COMMAND", lambda j: shlex.join(j["spec"]["command"]))])
        click.echo("")
        show_table(d["tasks"], [("RANK", "rank"), ("TASK", "id"), ("NODE", "node_id"), ("STATE", "state"),
                                ("EXIT", "exit_code"), ("GPUS", "gpus"), ("REASON", "reason")])

    emit(_ctx(), _client().get(f"/api/v1/jobs/{job_id}"), human)


@client_command(job, "logs")
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the job ends.")
@click.option("--rank", type=click.IntRange(min=0), help="Only this rank's lines (default: every rank).")
def job_logs(job_id, follow, rank):
    """Print a job's output in order (stderr lines go to stderr)."""
    if _ctx().obj["json"]:
        def show(line):
            click.echo(json.dumps(line, sort_keys=True))
    else:
        show = _print_line(False)
    if follow:
        _follow_logs(job_id, rank, show)
    else:
        _read_logs(job_id, rank, None, show)


def _print_line(with_rank):
    """A printer of log lines: stdout lines to stdout, stderr and the agent's own lines to stderr."""

    def show(line):
        prefix = f"[rank {line['rank']}] " if with_rank else ""
        click.echo(prefix + line["text"], err=line["stream"] != "stdout")

    return show


def _read_logs(job_id, rank, after, show):
    """Print every line of a job's log after `after`; returns the seq of the last one."""
    return _read_log_pages(f"/api/v1/jobs/{job_id}/logs", after, show, rank=rank)


def _read_log_pages(path, after, show, **params):
    """Print every line of a log (a job's, an instance's) after `after`; returns the seq of the last one."""
    client = _client()
    for _ in range(1_000_000):  # bounded: a log of a billion lines would still end
        page = client.get(path, after=after, limit=1000, **params)
        for line in page["items"]:
            show(line)
            after = line["seq"]
        if not page["next_cursor"]:
            break
    return after


def _follow_logs(job_id, rank, show):
    """Print a job's lines as they come until it has ended; returns the ended job."""
    client, after = _client(), None
    for _ in range(100_000_000):  # bounded: a follow of years would still end
        after = _read_logs(job_id, rank, after, show)
        data = client.get(f"/api/v1/jobs/{job_id}", wait_seconds=2)
        if data["state"] in JOB_ENDED:
            _read_logs(job_id, rank, after, show)  # the lines stored before it ended
            return data
    return data


@client_command(job, "cancel")
@click.argument("job_id")
@click.option("--wait", "wait_for_end", is_flag=True,
              help="Wait until its processes have stopped (the job is cancelled), not only until asked.")
def job_cancel(job_id, wait_for_end):
    """Cancel a job: `cancelling` while its nodes stop its processes, then `cancelled`."""
    data = _client().post(f"/api/v1/jobs/{job_id}/cancel")
    if wait_for_end and data["state"] not in JOB_ENDED:
        data = _wait_job(job_id, None)

    def human(d):
        if d["state"] == "cancelling":
            click.echo(f"job {job_id} cancelling: its processes are being stopped "
                       f"(`fleetd job wait {job_id}` waits until they have)")
        else:
            click.echo(f"job {job_id} {d['state']}")

    emit(_ctx(), data, human)


JOB_ENDED = ("succeeded", "failed", "cancelled")  # `cancelling` is not: its processes may still run


def _wait_job(job_id, timeout):
    import time

    client = _client()
    deadline = None if timeout is None else time.monotonic() + timeout
    for _ in range(10_000_000):
        left = 30 if deadline is None else max(0, min(30, deadline - time.monotonic()))
        data = client.get(f"/api/v1/jobs/{job_id}", wait_seconds=left)
        if data["state"] in JOB_ENDED or (deadline and time.monotonic() >= deadline):
            return data
    return data


@client_command(job, "wait")
@click.argument("job_id")
@click.option("--timeout", type=Duration(), help="Give up after this long (exit 2).")
def job_wait(job_id, timeout):
    """Wait for a job to end; exit 0 if it succeeded, 1 if not, 2 on timeout."""
    data = _wait_job(job_id, timeout)
    emit(_ctx(), data, lambda d: click.echo(f"job {job_id} {d['state']}"
                                            + (f" ({d['outcome']})" if d.get("outcome") else "")))
    if data["state"] not in JOB_ENDED:
        sys.exit(2)
    if data["state"] != "succeeded":
        sys.exit(1)


@client_command(job, "why")
@click.argument("job_id")
def job_why(job_id):
    """Why a job waits: its pending reason and, per node, the filter that rejects it."""
    client = _client()
    data = client.get(f"/api/v1/jobs/{job_id}")
    if data["state"] != "queued":
        emit(_ctx(), {"job": data, "simulation": None}, lambda d: click.echo(
            f"job {job_id} is {data['state']}: it waits for nothing"
            + ("" if data["state"] in JOB_ENDED else f" (`fleetd job show {job_id}` says where it runs)")))
        return
    explanation = client.post("/api/v1/cluster/simulate-schedule", data["spec"])
    result = {"job": data, "simulation": explanation}
    # A rule (a quota, a bid, a set-aside) holds the job before any node is tried; where it would go once
    # that is lifted is a simulation without the job's team (and so without its quota).
    blocker = explanation.get("error") or (data["pending_reason"] if _RULE_RE.search(data["pending_reason"] or "")
                                           else None)
    if blocker and not explanation["schedulable"] and data["spec"].get("team"):
        explanation = client.post("/api/v1/cluster/simulate-schedule", dict(data["spec"], team=None))
        result["simulation"] = explanation

    def human(d):
        if blocker:
            click.echo(f"job {job_id} is queued, blocked: {blocker}")
            if explanation["schedulable"]:
                click.echo("it would go to " + ", ".join(p["node_id"] for p in explanation["placement"])
                           + " once that is lifted")
        else:
            click.echo(f"job {job_id} is queued" + (f": {data['pending_reason']}" if data["pending_reason"] else ""))
            if explanation["schedulable"]:
                click.echo("it fits now on " + ", ".join(p["node_id"] for p in explanation["placement"])
                           + " (the scheduler places it within moments)")
        if not explanation["schedulable"] and explanation["filter_detail"]:
            show_table(explanation["filter_detail"], [("NODE", "node_id"), ("STAGE", "stage"), ("REASON", "reason")])

    emit(_ctx(), result, human)


# The pending reasons of rules that hold a job whatever the nodes (fleetd/services/scheduling.py).
_RULE_RE = re.compile(r"at its quota|spot minimum|^set aside:")


# ---------------------------------------------------------------- instances


@cli.group()
def instance():
    """Instances: long-running reserved GPU workloads (create, list, show, stop, resume, rm, connect, logs)."""


# The states in which an instance's processes have ended (docs/api.md, Instance states): only a resume (or,
# after a lost node, the node's return) runs it again.
INSTANCE_AT_REST = ("stopped", "interrupted", "failed", "deleted")
# Long polls ask for less than the client's 30 s read timeout, so that a full wait is never taken for a dead server.
_LONG_POLL_SECONDS = 25
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)$")
_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}


def parse_size(value):
    """'10G', '512Mi', '1.5TiB' or plain bytes -> bytes; K, M, G, T, P are powers of 1024."""
    match = _SIZE_RE.match(value.strip().lower())
    if not match or (match.group(3) and not match.group(2) and match.group(3) != "b"):
        raise click.BadParameter(f"{value!r} is not a size like 512M, 10G or 2T (binary units: 10G = 10 GiB)")
    number = float(match.group(1)) * _SIZE_UNITS[match.group(2)]
    if not number.is_integer():
        raise click.BadParameter(f"{value!r} is not a whole number of bytes")
    return int(number)


class Size(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


class PortSpec(click.ParamType):
    """PORT or PORT/http or PORT/tcp -> {port, protocol}."""

    name = "port[/http|/tcp]"

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        number, slash, protocol = value.strip().partition("/")
        protocol = protocol.lower()
        if not number.isdigit() or not 1 <= int(number) <= 65535 or (slash and protocol not in ("http", "tcp")):
            self.fail(f"{value!r} is not PORT, PORT/http or PORT/tcp with 1 <= PORT <= 65535", param, ctx)
        return {"port": int(number), "protocol": protocol} if slash else {"port": int(number)}  # fleetd: http


class IdleStop(click.ParamType):
    """PCT:DURATION -> {gpu_util_below_percent, for_seconds}."""

    name = "pct:duration"

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        percent, sep, duration = value.strip().partition(":")
        try:
            below = float(percent)
            seconds = parse_duration(duration) if sep else None
        except (ValueError, click.BadParameter):
            below = seconds = None
        if below is None or seconds is None or not 0 <= below <= 100:
            self.fail(f"{value!r} is not PERCENT:DURATION like 5:30m (stop once every GPU stayed under 5% "
                      "utilization for 30 minutes)", param, ctx)
        return {"gpu_util_below_percent": int(below) if below.is_integer() else below, "for_seconds": seconds}


def _span(seconds):
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


def _money(value):
    return None if value is None else f"{value:.2f}"


def _instance_ports(inst):
    """Declared ports, each with the node's public port once it runs: `8888/http->31001`."""
    published = {p["private_port"]: p for p in ((inst.get("runtime") or {}).get("ports") or [])}
    out = []
    for port in (inst.get("spec") or {}).get("ports") or []:
        text = f"{port['port']}/{port.get('protocol') or 'http'}"
        public = published.get(port["port"])
        if public and public.get("public_port"):
            text += f"->{public['public_port']}"
        out.append(text)
    return ", ".join(out) or None  # a space: a narrow terminal wraps the list rather than cutting it


def _instance_gpus(inst):
    resources = (inst.get("spec") or {}).get("resources") or {}
    text = _num(resources.get("gpus") or 0)
    return text + (f" ({','.join(resources['gpu_types'])})" if resources.get("gpu_types") else "")


INSTANCE_COLUMNS = [("ID", "id"), ("NAME", "name"), ("STATE", "state"), ("NODE", "node_id"), ("GPUS", _instance_gpus),
                    ("PORTS", _instance_ports), ("PRICE/H", lambda i: _money(i.get("price_per_hour"))),
                    ("COST", lambda i: _money(i.get("cost_so_far"))), ("PENDING REASON", "pending_reason")]


def _instance_line(d):
    """`instance ID STATE: reason` as submit prints a job."""
    return f"instance {d['id']} {d['state']}" + (f": {d['pending_reason']}" if d.get("pending_reason") else "")


def _wait_instance(instance_id, done, timeout=None, on_change=None):
    """Ask for the instance (answered as soon as its state changes) until `done(instance)`; returns the last
    answer, which is not done only when `timeout` seconds passed."""
    import time

    client = _client()
    deadline = None if timeout is None else time.monotonic() + timeout
    data, seen = None, None
    for _ in range(10_000_000):  # bounded: a wait of years would still end
        left = _LONG_POLL_SECONDS if deadline is None else max(0, min(_LONG_POLL_SECONDS, deadline - time.monotonic()))
        data = client.get(f"/api/v1/instances/{instance_id}", wait_seconds=round(left, 1))
        now_seen = (data["state"], data.get("pending_reason"))
        if on_change and now_seen != seen:
            on_change(data)
        seen = now_seen
        if done(data) or (deadline is not None and time.monotonic() >= deadline):
            return data
    return data


def _at_rest(d):
    """Nothing more happens by itself: stopped, failed, deleted, or interrupted by preemption (an
    instance whose node was lost runs on by itself when the node is back)."""
    return d["state"] in INSTANCE_AT_REST and not (d["state"] == "interrupted"
                                                   and d.get("interrupted_by") == "node_lost")


def _running_or_at_rest(d):
    return d["state"] == "running" or _at_rest(d)


def _wait_running(instance_id, data, timeout, verb):
    """--wait of create and resume: until it runs (exit 0), or rests (exit 1), or the timeout (exit 2)."""
    quiet = _ctx().obj["json"]

    def tell(d):
        if not quiet:
            click.echo(_instance_line(d), err=True)

    if data["state"] != "running":
        if not quiet:
            click.echo(f"instance {instance_id} {data['state']}; waiting until it runs (Ctrl-C stops the waiting, "
                       f"not the instance: `fleetd instance stop {instance_id}`)", err=True)
        try:
            data = _wait_instance(instance_id, _running_or_at_rest, timeout, tell)
        except KeyboardInterrupt:
            click.echo(f"\nstopped waiting; instance {instance_id} was {verb} and goes on "
                       f"(`fleetd instance show {instance_id}` shows it)", err=True)
            sys.exit(130)
    emit(_ctx(), data, lambda d: click.echo(_instance_line(d)))
    if data["state"] != "running":
        sys.exit(1 if _at_rest(data) else 2)


@client_command(instance, "create")
@click.option("-f", "--file", "spec_file", type=click.Path(dir_okay=False),
              help="InstanceSpec as YAML or JSON; the options below override it.")
@click.option("--name", help="Instance name (default: the command's first word, or the image's name).")
@click.option("--gpus", type=GpuCount(), help="GPUs to reserve.")
@click.option("--gpu-type", "gpu_types", multiple=True, help="Acceptable GPU model (repeatable).")
@click.option("--cpus", type=click.FloatRange(min=0), help="Host CPUs, reserved and enforced (default: no limit).")
@click.option("--memory", "memory_bytes", type=Size(), help="Host memory, e.g. 64G (binary units: 64G = 64 GiB).")
@click.option("--image", help="Container image to run (without it, a command is required).")
@click.option("--port", "ports", type=PortSpec(), multiple=True,
              help="Port the workload listens on, PORT[/http|/tcp] (default http; repeatable); "
                   "`fleetd instance connect` gives its address.")
@click.option("--volume", "volume_bytes", type=Size(),
              help="Persistent volume kept across stop and resume, e.g. 100G (0: none).")
@click.option("--volume-mount", "volume_mount_path", help="Where the volume is mounted (default /workspace).")
@click.option("--env", "env", multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--spot", is_flag=True, help="Spot class: cheaper, may be interrupted by on-demand work.")
@click.option("--bid", type=click.FloatRange(min=0), help="Spot bid per GPU-hour (with --spot).")
@click.option("--fleet", "fleet_name", help="Run only on nodes of this fleet.")
@click.option("--label", "labels", multiple=True, help="Run only on nodes with this KEY=VALUE label (repeatable).")
@click.option("--restart", type=click.Choice(["always", "on-failure", "never"]),
              help="Restart its process when it exits: always, on-failure (the default) or never.")
@click.option("--idle-stop", type=IdleStop(),
              help="Stop it once its GPUs stayed under PCT% utilization for DURATION, e.g. 5:30m.")
@click.option("--wait", "wait_running", is_flag=True,
              help="Wait until it runs; exit 0 once it does, 1 if it stopped or failed first.")
@click.option("--timeout", type=Duration(), help="With --wait: give up after this long (exit 2).")
@click.argument("command", nargs=-1)
def instance_create(spec_file, name, gpus, gpu_types, cpus, memory_bytes, image, ports, volume_bytes,
                    volume_mount_path, env, spot, bid, fleet_name, labels, restart, idle_stop, wait_running, timeout,
                    command):
    """Create an instance: fleetd instance create [OPTIONS] [-- COMMAND [ARGS]...]"""
    spec = _load_spec(spec_file) if spec_file else {}
    if command:
        spec["command"] = list(command)
    if image:
        spec["image"] = image
    if not spec.get("command") and not spec.get("image"):
        raise click.UsageError("give a command after --, or --image (or a spec file with one)")
    if bid is not None and not spot and spec.get("priority_class") != "spot":
        raise click.UsageError("--bid is a spot instance's bid: add --spot")
    default_name = (os.path.basename(str(spec["command"][0])) if spec.get("command")
                    else str(spec["image"]).rsplit("/", 1)[-1].split("@")[0].split(":")[0])
    spec["name"] = name or spec.get("name") or default_name or "instance"
    resources = spec.setdefault("resources", {})
    for key, value in (("gpus", gpus), ("cpus", cpus), ("memory_bytes", memory_bytes)):
        if value is not None:
            resources[key] = value
    resources.setdefault("gpus", 0)
    if gpu_types:
        resources["gpu_types"] = list(gpu_types)
    if ports:
        spec["ports"] = list(ports)
    if volume_bytes is not None:
        spec["volume_bytes"] = volume_bytes
    if volume_mount_path:
        spec["volume_mount_path"] = volume_mount_path
    if env:
        spec["env"] = {**spec.get("env", {}), **_labels(env)}
    if spot:
        spec["priority_class"] = "spot"
    if bid is not None:
        spec["bid"] = bid
    if fleet_name:
        spec.setdefault("node_selector", {})["fleet"] = fleet_name
    if labels:
        selector = spec.setdefault("node_selector", {})
        selector["labels"] = {**selector.get("labels", {}), **_labels(labels)}
    if restart:
        spec["restart"] = restart
    if idle_stop:
        spec["idle_stop"] = idle_stop
    data = _client().post("/api/v1/instances", spec)
    if wait_running:
        _wait_running(data["id"], data, timeout, "created")
        return
    emit(_ctx(), data, lambda d: click.echo(_instance_line(d)))


@client_command(instance, "list")
@click.option("--state", type=click.Choice(["pending", "starting", "running", "stopping", "stopped", "interrupted",
                                            "failed", "deleted"]), help="Only instances in this state.")
@click.option("--owner", help="Only instances created with the token of this name.")
def instance_list(state, owner):
    """List instances (a submitter sees its own)."""
    items = list(_client().paginate("/api/v1/instances", state=state, owner=owner))
    # On a terminal too narrow for one line a row, the pending reason wraps within its column.
    emit(_ctx(), items, lambda rows: show_table(rows, INSTANCE_COLUMNS))


def _show_instance(d):
    spec = d.get("spec") or {}
    runtime = d.get("runtime") or {}
    command = spec.get("command")
    volume = spec.get("volume_bytes") or 0
    show_record(d, [
        ("ID", "id"), ("NAME", "name"), ("OWNER", "owner"), ("TEAM", "team"), ("STATE", "state"),
        ("REASON", "status_reason"), ("PENDING REASON", "pending_reason"), ("WANTED", "desired_state"),
        ("NODE", "node_id"),
        ("IMAGE", lambda _: spec.get("image")), ("COMMAND", lambda _: shlex.join(command) if command else None),
        ("GPUS", _instance_gpus),
        ("CLASS", lambda _: (spec.get("priority_class") or "on-demand")
         + (f", bid {_num(spec['bid'])}" if spec.get("bid") is not None else "")),
        ("RESTART", lambda _: spec.get("restart")),
        ("VOLUME", lambda _: (f"{_bytes(volume)} at {spec.get('volume_mount_path') or '/workspace'}" if volume
                              else "none") + (f", {_bytes(runtime['volume_used_bytes'])} used"
                                              if runtime.get("volume_used_bytes") is not None else "")),
        ("IDLE STOP", lambda _: spec.get("idle_stop") and "under {}% GPU utilization for {}".format(
            _num(spec["idle_stop"]["gpu_util_below_percent"]), _span(spec["idle_stop"]["for_seconds"]))),
        ("CREATED", "created_at"), ("STARTED", "started_at"), ("STOPPED", "stopped_at"),
        ("RUNS", "runs"), ("UPTIME", lambda _: _span(runtime.get("uptime_seconds"))),
        ("RESTARTS", lambda _: runtime.get("restarts")),
        ("PRICE/H", lambda i: _money(i.get("price_per_hour"))), ("COST", lambda i: _money(i.get("cost_so_far"))),
    ])
    container = runtime.get("container") or {}
    if container:
        cpu, memory = container.get("cpu_percent"), container.get("memory_percent")
        click.echo(f"{'CPU, MEMORY'.ljust(14)}  {'-' if cpu is None else _num(round(cpu, 1))}% CPU, "
                   f"{'-' if memory is None else _num(round(memory, 1))}% memory")
    published = {p["private_port"]: p for p in runtime.get("ports") or []}
    if spec.get("ports"):
        click.echo("")
        rows = [dict(p, public=published.get(p["port"]) or {}) for p in spec["ports"]]
        show_table(rows, [("PORT", "port"), ("PROTOCOL", "protocol"),
                          ("PUBLIC PORT", lambda p: p["public"].get("public_port")),
                          ("ADDRESS", lambda p: p["public"].get("ip")),
                          ("PUBLIC IP", lambda p: p["public"].get("is_ip_public"))])
    if runtime.get("gpus"):
        click.echo("")
        show_table(runtime["gpus"], [("UUID", "uuid"), ("GPU UTIL %", "gpu_util_percent"),
                                     ("MEMORY UTIL %", "memory_util_percent")])


@client_command(instance, "show")
@click.argument("instance_id")
def instance_show(instance_id):
    """Show an instance: state, why it waits, node, ports, GPU figures, price and cost."""
    emit(_ctx(), _client().get(f"/api/v1/instances/{instance_id}"), _show_instance)


@client_command(instance, "stop")
@click.argument("instance_id")
@click.option("--wait", "wait_stopped", is_flag=True, help="Wait until its processes have stopped.")
def instance_stop(instance_id, wait_stopped):
    """Stop an instance: its processes end and its GPUs are freed; its volume is kept for `resume`."""
    data = _client().post(f"/api/v1/instances/{instance_id}/stop")
    if wait_stopped and data["state"] not in INSTANCE_AT_REST:
        data = _wait_instance(instance_id, lambda d: d["state"] in INSTANCE_AT_REST)
    emit(_ctx(), data, lambda d: click.echo(_instance_line(d)))


@client_command(instance, "resume")
@click.argument("instance_id")
@click.option("--gpus", type=GpuCount(), help="GPUs to reserve this time (default: as before).")
@click.option("--bid", type=click.FloatRange(min=0), help="New spot bid per GPU-hour (spot instances).")
@click.option("--wait", "wait_running", is_flag=True,
              help="Wait until it runs; exit 0 once it does, 1 if it stopped or failed first.")
@click.option("--timeout", type=Duration(), help="With --wait: give up after this long (exit 2).")
def instance_resume(instance_id, gpus, bid, wait_running, timeout):
    """Resume a stopped instance on the node that holds its volume (it waits while that node lacks the GPUs)."""
    body = {k: v for k, v in (("gpus", gpus), ("bid", bid)) if v is not None}
    data = _client().post(f"/api/v1/instances/{instance_id}/resume", body)
    if wait_running:
        _wait_running(instance_id, data, timeout, "resumed")
        return
    emit(_ctx(), data, lambda d: click.echo(_instance_line(d)))


@client_command(instance, "rm")
@click.argument("instance_id")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def instance_rm(instance_id, yes):
    """Delete an instance: it is stopped and its volume is deleted (asks first, unless --yes)."""
    if not yes:
        data = _client().get(f"/api/v1/instances/{instance_id}")
        volume = (data.get("spec") or {}).get("volume_bytes") or 0
        what = f" and its {_bytes(volume)} volume" if volume else ""
        try:
            agreed = click.confirm(f"delete instance {data['name']} ({instance_id}){what}? this cannot be undone",
                                   err=True)
        except click.Abort:
            agreed = False
        if not agreed:
            fail(f"instance {instance_id} not deleted (answer y, or pass --yes)")
    _client().delete(f"/api/v1/instances/{instance_id}")
    emit(_ctx(), {"id": instance_id, "deleted": True}, lambda d: click.echo(f"deleted instance {instance_id}"))


@client_command(instance, "connect")
@click.argument("instance_id")
@click.option("--port", type=click.IntRange(1, 65535), help="Which declared port (default: its first).")
@click.option("--wait", "wait_running", is_flag=True, help="Wait until the instance runs, however long that takes.")
def instance_connect(instance_id, port, wait_running):
    """Print the URL of a port of a running instance (http://HOST:PORT or tcp://HOST:PORT)."""
    client, data = _client(), None
    for _ in range(10_000_000 if wait_running else 1):  # bounded: a wait of years would still end
        try:
            data = client.get(f"/api/v1/instances/{instance_id}/connection", port=port,
                              wait_seconds=_LONG_POLL_SECONDS if wait_running else None)
            break
        except ClientError as exc:
            if exc.status != 504:  # 504: not running within the wait; 409: stopped, so it never will by itself
                raise
            if not wait_running:
                fail(f"{_describe(exc)}\n(`fleetd instance connect --wait {instance_id}` waits until it runs)")
    emit(_ctx(), data, lambda d: click.echo(d["url"]))


@client_command(instance, "logs")
@click.argument("instance_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the instance stops.")
def instance_logs(instance_id, follow):
    """Print an instance's output in order (stderr lines go to stderr)."""
    if _ctx().obj["json"]:
        def show(line):
            click.echo(json.dumps(line, sort_keys=True))
    else:
        show = _print_line(False)
    path = f"/api/v1/instances/{instance_id}"
    after = _read_log_pages(path + "/logs", None, show)
    if not follow:
        return
    client = _client()
    for _ in range(100_000_000):  # bounded: a follow of years would still end
        data = client.get(path, wait_seconds=2)
        after = _read_log_pages(path + "/logs", after, show)
        if _at_rest(data):
            return


@client_command(instance, "events")
@click.argument("instance_id")
def instance_events(instance_id):
    """An instance's events, oldest first."""
    items = list(_client().paginate(f"/api/v1/instances/{instance_id}/events"))
    emit(_ctx(), items, lambda rows: show_table(
        rows, [("AT", "at"), ("KIND", "kind"), ("FROM", "from_status"), ("TO", "to_status"), ("ACTOR", "actor"),
                     ("REASON", "reason")]))


# ---------------------------------------------------------------- GPU types and quotas


@client_command(cli, "gpu-types")
def gpu_types():
    """GPU models with capacity, availability and prices."""
    items = _client().get("/api/v1/gpu-types")["items"]
    emit(_ctx(), items, lambda rows: show_table(rows, [
        ("MODEL", "model"), ("MEMORY", lambda t: _bytes(t["memory_bytes"]) if t["memory_bytes"] else "-"),
        ("TOTAL", "total"), ("AVAILABLE", "available"), ("PRICE/H", "price_per_hour"),
        ("SPOT MIN BID", "spot_min_bid")]))


@cli.group("gpu-type")
def gpu_type():
    """Prices of GPU models."""


@client_command(gpu_type, "set")
@click.argument("model")
@click.option("--price", "price_per_hour", type=click.FloatRange(min=0), help="Price per GPU-hour.")
@click.option("--spot-min-bid", type=click.FloatRange(min=0), help="Lowest bid a spot job may offer.")
def gpu_type_set(model, price_per_hour, spot_min_bid):
    """Set the price and spot minimum bid of a GPU model."""
    from urllib.parse import quote

    data = _client().request("PUT", f"/api/v1/gpu-types/{quote(model, safe='')}",
                             json={"price_per_hour": price_per_hour, "spot_min_bid": spot_min_bid})
    emit(_ctx(), data, lambda d: click.echo(f"{model}: price {_cell(d['price_per_hour'])}, "
                                            f"spot minimum {_cell(d['spot_min_bid'])}"))


@cli.group()
def quota():
    """Team GPU quotas."""


@client_command(quota, "set")
@click.argument("team")
@click.option("--max-gpus", type=click.FloatRange(min=0), required=True,
              help="Most GPUs the team's running jobs may hold together (fractions allowed).")
@click.option("--class", "priority_class", type=click.Choice(["any", "on-demand", "spot"]), default="any",
              show_default=True, help="Which jobs count: every class, or only on-demand or spot ones.")
def quota_set(team, max_gpus, priority_class):
    """Set the most GPUs a team's running jobs may hold."""
    data = _client().request("PUT", f"/api/v1/quotas/{team}",
                             json={"max_gpus": max_gpus, "priority_class": priority_class})
    emit(_ctx(), data, lambda d: click.echo(f"team {team}: at most {_plural(d['max_gpus'], 'GPU')} ({priority_class})"))


@client_command(quota, "list")
def quota_list():
    """List team quotas."""
    items = _client().get("/api/v1/quotas")["items"]
    emit(_ctx(), items, lambda rows: show_table(rows, [("TEAM", "team"), ("CLASS", "priority_class"),
                                                      ("MAX GPUS", "max_gpus")]))


@client_command(quota, "rm")
@click.argument("team")
@click.option("--class", "priority_class", type=click.Choice(["any", "on-demand", "spot"]),
              help="Remove only this class's quota (default: all of the team's).")
def quota_rm(team, priority_class):
    """Remove a team's quota (one class, or all)."""
    _client().request("DELETE", f"/api/v1/quotas/{team}", params={"priority_class": priority_class}
                      if priority_class else None)
    emit(_ctx(), {"team": team, "deleted": True}, lambda d: click.echo(f"removed quota of team {team}"))

