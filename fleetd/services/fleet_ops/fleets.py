"""Fleets and their join tokens."""

import datetime as dt
import shlex

import peewee

from fleetd.credentials import JOIN_PREFIX, hash_token, make_token
from fleetd.db import write_transaction
from fleetd.errors import Conflict, NotFound
from fleetd.models import (
    DEFAULT_HEALTH_POLICY,
    DEFAULT_OUTPUT_CAP_BYTES,
    DEFAULT_OUTPUT_RETENTION_DAYS,
    DEFAULT_TASK_MEMORY_BYTES,
    DEFAULT_TASK_PATH,
    DEFAULT_TASK_PIDS_MAX,
    Fleet,
    Gpu,
    JoinToken,
    Node,
)
from fleetd.services.pagination import paginate
from fleetd.services.placement.parking import fleet_changed
from fleetd.sql import Statement


def _with_counts(query):
    node_count = Node.select(peewee.fn.COUNT(Node.id)).where(Node.fleet == Fleet.name)
    gpu_count = Gpu.select(peewee.fn.COUNT(Gpu.id)).join(Node).where(Node.fleet == Fleet.name)
    return query.select_extend(node_count.alias("node_count"), gpu_count.alias("gpu_count"))


# Compiled once: every first heartbeat reads the node's fleet's health policy and validation gate.
_COLUMN_OF = {
    column: Statement(
        lambda v, c=column: Fleet.select(getattr(Fleet, c)).where(Fleet.name == v("name"))
    )
    for column in ("health_policy", "validation", "mig")
}


def fleet_column(name, column):
    """One setting of a fleet, `health_policy`, `validation` or `mig` (None without a fleet or a
    value)."""
    row = _COLUMN_OF[column].first(name=name) if name else None
    return getattr(row, column) if row is not None else None


def list_fleets(limit, cursor=None):
    """One page of fleets by name, with node and GPU counts."""
    return paginate(_with_counts(Fleet.select()), Fleet.name, limit, cursor)


def get_fleet(name):
    """A fleet with its counts; NotFound if there is none."""
    fleet = _with_counts(Fleet.select()).where(Fleet.name == name).first()
    if fleet is None:
        raise NotFound(f"fleet {name!r} not found")
    return fleet


# The shape of each node in a fleet's Terraform state (a cty type, as Terraform's state files write
# it).
_TERRAFORM_NODE_TYPE = [
    "object",
    {
        "status": "string",
        "reason": "string",
        "hostname": "string",
        "address": "string",
        "agent_version": "string",
    },
]


def terraform_state(name):
    """The fleet's nodes as a Terraform state document (format 4) whose one output, `nodes`, maps
    each node id to {status, reason, hostname, address, agent_version}. Terraform's http state
    backend reads it, so that a module's `terraform plan` sees what became of its hosts' nodes
    (terraform/modules/fleet-nodes). NotFound for an unknown fleet."""
    if not Fleet.select().where(Fleet.name == name).exists():
        raise NotFound(f"fleet {name!r} not found")
    rows = (
        Node.select(
            Node.id,
            Node.status,
            Node.status_reason,
            Node.hostname,
            Node.address,
            Node.agent_version,
        )
        .where(Node.fleet == name)
        .order_by(Node.id)
        .tuples()
        .execute()
    )
    nodes = {
        node_id: {
            "status": status,
            "reason": reason,
            "hostname": hostname,
            "address": address,
            "agent_version": version,
        }
        for node_id, status, reason, hostname, address, version in rows
    }
    return {
        "version": 4,
        "terraform_version": "1.5.0",
        "serial": 1,
        "lineage": f"fleetd-fleet-{name}",
        "outputs": {"nodes": {"value": nodes, "type": ["map", _TERRAFORM_NODE_TYPE]}},
        "resources": [],
    }


def create_fleet(
    now,
    name,
    description="",
    labels=None,
    availability=None,
    health_policy=None,
    allow_root_tasks=False,
    require_isolation=False,
    allowed_images=("*",),
    validation=None,
    task_pids_max=DEFAULT_TASK_PIDS_MAX,
    task_memory_default_bytes=DEFAULT_TASK_MEMORY_BYTES,
    task_path=DEFAULT_TASK_PATH,
    task_identity="dynamic",
    output_cap_bytes=DEFAULT_OUTPUT_CAP_BYTES,
    output_retention_days=DEFAULT_OUTPUT_RETENTION_DAYS,
    network_topology=None,
    mig=None,
):
    """Create a fleet; Conflict if the name is taken. `health_policy`: see
    services.nodes.health_policy (None: defaults); the isolation rules and the task defaults: see
    docs/api.md, Fleets."""
    try:
        with write_transaction():
            if Fleet.get_or_none(Fleet.name == name) is not None:
                raise Conflict(f"fleet {name!r} already exists")
            Fleet.create(
                name=name,
                description=description or "",
                labels=labels or {},
                created_at=now,
                availability=availability,
                health_policy=_policy(health_policy),
                allow_root_tasks=allow_root_tasks,
                require_isolation=require_isolation,
                allowed_images=list(allowed_images),
                validation=validation,
                task_pids_max=task_pids_max,
                task_memory_default_bytes=task_memory_default_bytes,
                task_path=task_path,
                task_identity=task_identity,
                output_cap_bytes=output_cap_bytes,
                output_retention_days=output_retention_days,
                network_topology=network_topology,
                mig=mig,
            )
    except peewee.IntegrityError:
        raise Conflict(f"fleet {name!r} already exists") from None
    return get_fleet(name)


def update_fleet(rt, name, changes):
    """Change a fleet's description, labels, availability windows, isolation rules or network
    topology (a window that opened, or labels that now match, may let queued work fit: the
    scheduler is kicked)."""
    with write_transaction():
        fleet = Fleet.get_or_none(Fleet.name == name)
        if fleet is None:
            raise NotFound(f"fleet {name!r} not found")
        for field in (
            "description",
            "labels",
            "availability",
            "allow_root_tasks",
            "require_isolation",
            "allowed_images",
            "validation",
            "task_pids_max",
            "task_memory_default_bytes",
            "task_path",
            "task_identity",
            "output_cap_bytes",
            "output_retention_days",
            "network_topology",
            "mig",
        ):
            if field in changes:
                setattr(fleet, field, changes[field])
        if (
            "health_policy" in changes
        ):  # fields left out keep their value; null: back to the defaults
            given = changes["health_policy"]
            fleet.health_policy = (
                None if given is None else _policy(dict(fleet.health_policy or {}, **given))
            )
        fleet.save()
    if "task_identity" in changes:
        rt.accounts.forget()
    rt.scheduler.kick(what=fleet_changed(name))
    return get_fleet(name)


def _policy(given):
    """What is stored of a health policy: the fields given (None: all defaults)."""
    stored = {k: v for k, v in (given or {}).items() if k in DEFAULT_HEALTH_POLICY}
    return stored or None


def delete_fleet(name):
    """Delete a fleet and its join tokens; Conflict while nodes are enrolled in it."""
    with write_transaction():
        fleet = Fleet.get_or_none(Fleet.name == name)
        if fleet is None:
            raise NotFound(f"fleet {name!r} not found")
        enrolled = Node.select().where(Node.fleet == name).count()
        if enrolled:
            raise Conflict(
                f"fleet {name!r} still has {enrolled} enrolled node(s)", {"node_count": enrolled}
            )
        JoinToken.delete().where(JoinToken.fleet == name).execute()
        fleet.delete_instance()


def create_join_token(now, fleet_name, ttl_seconds, max_uses=None, description="", created_by=""):
    """Mint a join token for a fleet; returns (row, token)."""
    token_id, token = make_token(JOIN_PREFIX)
    with write_transaction():
        if Fleet.get_or_none(Fleet.name == fleet_name) is None:
            raise NotFound(f"fleet {fleet_name!r} not found")
        row = JoinToken.create(
            id=token_id,
            fleet=fleet_name,
            token_hash=hash_token(token),
            description=description or "",
            created_at=now,
            expires_at=now + dt.timedelta(seconds=ttl_seconds),
            max_uses=max_uses,
            created_by=created_by,
        )
    return row, token


def join_command(server_url, token):
    """The command a host runs to join with this token; the secret is in its environment, never in
    argv (where `ps` and shell history would show it)."""
    return (
        f"FLEET_AGENT_JOIN_TOKEN={shlex.quote(token)} fleet-agent join "
        f"--server {shlex.quote(server_url.rstrip('/'))}"
    )


def list_join_tokens(fleet_name, limit, cursor=None):
    """One page of a fleet's join tokens, without secrets."""
    get_fleet(fleet_name)
    return paginate(
        JoinToken.select().where(JoinToken.fleet == fleet_name), JoinToken.id, limit, cursor
    )


def revoke_join_token(token_id):
    """Revoke a join token; hosts can no longer use it."""
    with write_transaction():
        updated = JoinToken.update(revoked=True).where(JoinToken.id == token_id).execute()
    if not updated:
        raise NotFound(f"join token {token_id} not found")


def consume_join_token(now, token_id):
    """Use a join token once, atomically; False when it is expired, revoked or used up.

    Call inside the registration transaction: the conditional UPDATE is what makes a
    single-use token admit exactly one host however many try at once.
    """
    return _CONSUME.execute(id=token_id, now=now) == 1


# Compiled once: a registration storm runs it thousands of times a minute.
_CONSUME = Statement(
    lambda v: JoinToken.update(uses=JoinToken.uses + 1).where(
        (JoinToken.id == v("id"))
        & (JoinToken.revoked == False)  # noqa: E712 - SQL expression
        & (JoinToken.expires_at > v("now", JoinToken.expires_at))
        & (JoinToken.max_uses.is_null() | (JoinToken.uses < JoinToken.max_uses))
    )
)
