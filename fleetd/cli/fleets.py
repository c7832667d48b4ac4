"""`fleetd fleet` and `fleetd join-token`: fleets and the tokens that admit hosts into them."""

import shlex

import click

from fleetd.cli.output import byte_size, cell, emit, plural, show_record, show_table
from fleetd.cli.params import Duration, Size, parse_labels
from fleetd.cli.remote import client_command, current_client
from fleetd.cli.validation import describe_validation, validation_options


@click.group()
def fleet():
    """Fleets."""


FLEET_COLUMNS = [
    ("NAME", "name"),
    ("NODES", "node_count"),
    ("GPUS", "gpu_count"),
    ("LABELS", "labels"),
    ("DESCRIPTION", "description"),
]


def isolation_options(fn):
    """--allow-root-tasks, --require-isolation and --allowed-image, for create and update."""
    fn = click.option(
        "--allowed-image",
        "allowed_images",
        multiple=True,
        help="Glob pattern an instance's image must match to run here (repeatable; "
        "default: any image).",
    )(fn)
    fn = click.option(
        "--require-isolation/--no-require-isolation",
        default=None,
        help="Give work only to nodes whose agent runs tasks as other users (isolation uid).",
    )(fn)
    fn = click.option(
        "--allow-root-tasks/--no-allow-root-tasks",
        default=None,
        help="Let work that an admin token submitted run as root on the fleet's nodes.",
    )(fn)
    return fn


def _isolation_body(allow_root_tasks, require_isolation, allowed_images):
    body = {
        "allow_root_tasks": allow_root_tasks,
        "require_isolation": require_isolation,
        "allowed_images": list(allowed_images) or None,
    }
    return {k: v for k, v in body.items() if v is not None}


def task_options(fn):
    """--task-pids-max, --task-memory-default and --task-path, for create and update."""
    fn = click.option(
        "--task-path", help="The PATH a task starts with (default: the system's directories)."
    )(fn)
    fn = click.option(
        "--task-memory-default",
        "task_memory_default_bytes",
        type=Size(),
        help="Host memory bound of a task that sets no memory_bytes, e.g. 32G (default 32G).",
    )(fn)
    fn = click.option(
        "--task-pids-max",
        type=int,
        help="The most processes and threads a task may hold, and the default (4096).",
    )(fn)
    return fn


def _task_body(task_pids_max, task_memory_default_bytes, task_path):
    body = {
        "task_pids_max": task_pids_max,
        "task_memory_default_bytes": task_memory_default_bytes,
        "task_path": task_path,
    }
    return {k: v for k, v in body.items() if v is not None}


def _task_defaults(fleet):
    if "task_pids_max" not in fleet:
        return "-"
    return (
        f"{fleet['task_pids_max']} pids, memory {byte_size(fleet['task_memory_default_bytes'])} "
        f"unless set, PATH {fleet['task_path']}"
    )


def _isolation(fleet):
    rules = [f"images {', '.join(fleet.get('allowed_images') or []) or 'none'}"]
    if fleet.get("allow_root_tasks"):
        rules.append("admins' work may run as root")
    if fleet.get("require_isolation"):
        rules.append("nodes must isolate tasks (isolation uid)")
    return "; ".join(rules)


@client_command(fleet, "create")
@click.argument("name")
@click.option("--description", default="", help="What the fleet is (free text).")
@click.option("--label", "labels", multiple=True, help="KEY=VALUE, repeatable.")
@isolation_options
@task_options
@validation_options(default={})
def fleet_create(
    name,
    description,
    labels,
    allow_root_tasks,
    require_isolation,
    allowed_images,
    task_pids_max,
    task_memory_default_bytes,
    task_path,
    validation,
):
    """Create a fleet. Its new and repaired nodes are validated before they take work (the built-in
    GPU checks), unless --no-validation."""
    body = {
        "name": name,
        "description": description,
        "labels": parse_labels(labels),
        **_isolation_body(allow_root_tasks, require_isolation, allowed_images),
        **_task_body(task_pids_max, task_memory_default_bytes, task_path),
        "validation": validation,
    }
    data = current_client().post("/api/v1/fleets", body)
    emit(
        data,
        lambda d: click.echo(f"created fleet {d['name']}; validation: {describe_validation(d)}"),
    )


@client_command(fleet, "list")
def fleet_list():
    """List fleets."""
    items = list(current_client().paginate("/api/v1/fleets"))
    emit(items, lambda rows: show_table(rows, FLEET_COLUMNS))


def _availability(fleet):
    """A fleet's windows as `--window` takes them, with their time zone; `always open` without
    any."""
    availability = fleet.get("availability")
    if not availability:
        return "always open"
    windows = [
        f"{w['start']}-{w['end']}" + (f"@{','.join(w['days'])}" if w.get("days") else "")
        for w in availability["windows"]
    ]
    return f"open {', '.join(windows)} ({availability['timezone']}); GPUs are blocked outside"


@client_command(fleet, "show")
@click.argument("name")
def fleet_show(name):
    """Show one fleet, with its availability windows."""
    data = current_client().get(f"/api/v1/fleets/{name}")
    emit(
        data,
        lambda d: show_record(
            d,
            FLEET_COLUMNS
            + [
                ("AVAILABILITY", _availability),
                ("ISOLATION", _isolation),
                ("TASKS", _task_defaults),
                ("VALIDATION", describe_validation),
                ("CREATED", "created_at"),
            ],
        ),
    )


@client_command(fleet, "update")
@click.argument("name")
@click.option("--description", help="New description.")
@click.option(
    "--label", "labels", multiple=True, help="KEY=VALUE; replaces all labels (repeatable)."
)
@click.option(
    "--window",
    "windows",
    multiple=True,
    help="Open window HH:MM-HH:MM[@mon,tue,...] (repeatable); GPUs are blocked outside them.",
)
@click.option("--timezone", default="UTC", show_default=True, help="Time zone of --window.")
@click.option("--always-open", is_flag=True, help="Remove the availability windows.")
@isolation_options
@task_options
@validation_options(default=...)
def fleet_update(
    name,
    description,
    labels,
    windows,
    timezone,
    always_open,
    allow_root_tasks,
    require_isolation,
    allowed_images,
    task_pids_max,
    task_memory_default_bytes,
    task_path,
    validation,
):
    """Change a fleet's description, labels, availability windows, isolation rules or validation
    (the validation options replace its whole setting)."""
    body = _isolation_body(allow_root_tasks, require_isolation, allowed_images)
    body.update(_task_body(task_pids_max, task_memory_default_bytes, task_path))
    if validation is not ...:
        body["validation"] = validation
    if description is not None:
        body["description"] = description
    if labels:
        body["labels"] = parse_labels(labels)
    if windows and always_open:
        raise click.UsageError("--window and --always-open are mutually exclusive")
    if always_open:
        body["availability"] = None
    elif windows:
        body["availability"] = {"timezone": timezone, "windows": [_window(w) for w in windows]}
    if not body:
        raise click.UsageError("nothing to change")
    data = current_client().patch(f"/api/v1/fleets/{name}", body)
    emit(data, lambda d: click.echo(f"updated fleet {name}"))


def _window(text):
    span, _, days = text.partition("@")
    start, sep, end = span.partition("-")
    if not sep:
        raise click.BadParameter(
            f"{text!r} is not HH:MM-HH:MM[@mon,tue,...]", param_hint="--window"
        )
    window = {"start": start, "end": end}
    if days:
        window["days"] = days.split(",")
    return window


@client_command(fleet, "rm")
@click.argument("name")
def fleet_rm(name):
    """Delete a fleet (refused while nodes are enrolled)."""
    current_client().delete(f"/api/v1/fleets/{name}")
    emit({"name": name, "deleted": True}, lambda d: click.echo(f"deleted fleet {name}"))


# ---------------------------------------------------------------- join tokens


@click.group("join-token")
def join_token():
    """Join tokens that admit hosts into a fleet."""


JOIN_TOKEN_COLUMNS = [
    ("ID", "id"),
    ("FLEET", "fleet"),
    ("USES", lambda t: f"{t['uses']}/{t['max_uses'] or 'unlimited'}"),
    ("EXPIRES", "expires_at"),
    ("REVOKED", "revoked"),
    ("DESCRIPTION", "description"),
]


def _env_join_command(token, join_command, url):
    """`FLEET_AGENT_JOIN_TOKEN=... fleet-agent join --server URL`: the secret stays out of argv (and
    so out of `ps` and the process accounting), as `fleet-agent join --help` asks."""
    words = shlex.split(join_command or "")
    server = words[words.index("--server") + 1] if "--server" in words[:-1] else url
    return (
        f"FLEET_AGENT_JOIN_TOKEN={shlex.quote(token)} fleet-agent join --server "
        f"{shlex.quote(server)}"
    )


@client_command(join_token, "create")
@click.option("--fleet", "fleet_name", required=True, help="Fleet the hosts join.")
@click.option(
    "--ttl", type=Duration(), default="24h", show_default=True, help="Lifetime, e.g. 1h, 7d."
)
@click.option(
    "--uses", type=click.IntRange(min=1), help="How many hosts may enrol with it.  [default: 1]"
)
@click.option("--single-use", is_flag=True, help="Same as --uses 1 (the default).")
@click.option(
    "--unlimited", is_flag=True, help="Any number of hosts may enrol with it until it expires."
)
@click.option(
    "--description", default="", help="What the token is for (shown in `join-token list`)."
)
def join_token_create(fleet_name, ttl, uses, single_use, unlimited, description):
    """Mint a join token (one host, unless --uses N or --unlimited) and print the command that
    enrols a host."""
    if sum((uses is not None, single_use, unlimited)) > 1:
        raise click.UsageError("--uses, --single-use and --unlimited are mutually exclusive")
    body = {"ttl_seconds": ttl, "description": description}
    if not unlimited:
        body["max_uses"] = uses or 1
    data = current_client().post(f"/api/v1/fleets/{fleet_name}/join-tokens", body)

    def human(d):
        hosts = (
            f"enrols {plural(d['max_uses'], 'host')}"
            if d["max_uses"]
            else "enrols any number of hosts"
        )
        click.echo(
            f"join token {d['id']} for fleet {fleet_name}: {hosts} until {cell(d['expires_at'])} "
            f"UTC"
        )
        click.echo(
            "the token is shown only now; on "
            + ("the host" if d["max_uses"] == 1 else "each host")
            + " run (as root):"
        )
        click.echo(
            f"  {_env_join_command(d['token'], d.get('join_command'), current_client().url)}"
        )

    emit(data, human)


@client_command(join_token, "list")
@click.option("--fleet", "fleet_name", help="Only this fleet's tokens (default: every fleet's).")
def join_token_list(fleet_name):
    """List join tokens, of one fleet or of all (never their secrets)."""
    client = current_client()
    fleets = [fleet_name] if fleet_name else [f["name"] for f in client.paginate("/api/v1/fleets")]
    items = [
        dict({"fleet": name}, **token)
        for name in fleets
        for token in client.paginate(f"/api/v1/fleets/{name}/join-tokens")
    ]
    emit(items, lambda rows: show_table(rows, JOIN_TOKEN_COLUMNS))


@client_command(join_token, "revoke")
@click.argument("token_id")
def join_token_revoke(token_id):
    """Revoke a join token."""
    current_client().delete(f"/api/v1/join-tokens/{token_id}")
    emit({"id": token_id, "revoked": True}, lambda d: click.echo(f"revoked join token {token_id}"))


COMMANDS = [fleet, join_token]
