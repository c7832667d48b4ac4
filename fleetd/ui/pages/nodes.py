"""Nodes: the table with filters; a node's page with GPUs, tasks, events and admin actions."""

from flask import flash, g, redirect, render_template, request, url_for

from fleetd.errors import InvalidRequest
from fleetd.models import NodeStatus
from fleetd.runtime import current_runtime
from fleetd.schemas.nodes import NodeDrainSchema
from fleetd.services.fleet_ops import fleets
from fleetd.services.nodes import nodes, validation
from fleetd.services.placement import capacity, cluster
from fleetd.topology_view import LEGEND, network_of, topology_rows
from fleetd.ui import roles
from fleetd.ui.blueprint import bp
from fleetd.ui.forms import FormError, load_form
from fleetd.ui.pages.common import allow, answer_by_name, confirmed
from fleetd.ui.security import ui_require

LIST_LIMIT = 200
EVENTS_SHOWN = 50
KEPT_CHARS = 1000  # of what was typed into the drain form, shown back (a reason may have 500)
DRAIN_FIELDS = {"deadline_seconds": "deadline_minutes"}  # the schema's field -> the drain form's

ACTIONS = {
    "cordon": ("Cordon", "No new work will be placed on this node; running tasks continue."),
    "uncordon": ("Uncordon", "The node takes new work again."),
    "drain": (
        "Drain",
        "No new work; running tasks may finish until the deadline, then they are stopped "
        "and requeued. The node stays drained until you undrain it.",
    ),
    "undrain": ("Undrain", "The drain ends and the node takes new work again."),
    "revoke": (
        "Revoke",
        "The node's session token stops working and its agent stops all work. "
        "The host must enrol again with a new join token to come back.",
    ),
}


def _live(node_list):
    return nodes.with_last_heartbeat(node_list, current_runtime().liveness)


def _gpu_summary(node):
    unhealthy = [gpu for gpu in node.gpu_list if not gpu.healthy]
    models = sorted({gpu.model for gpu in node.gpu_list})
    return {"count": len(node.gpu_list), "unhealthy": unhealthy, "models": models}


@bp.route("/nodes")
@ui_require(roles.NODES)
def node_list():
    """Every node (or those of a fleet / status, or whose hostname holds a text) with GPUs and their
    health, heartbeat age and labels."""
    fleet = request.args.get("fleet") or None
    status = request.args.get("status") or None
    name = request.args.get("name", "").strip() or None
    if status is not None and status not in {s.value for s in NodeStatus}:
        raise InvalidRequest(f"unknown node status {status!r}")
    cursor = request.args.get("cursor") or None
    rows, next_cursor = nodes.list_nodes(LIST_LIMIT, cursor, fleet, status, search=name)
    fleet_names = (
        [f.name for f in fleets.list_fleets(1000)[0]] if g.ui_principal.role in roles.FLEETS else []
    )
    summaries = {node.id: _gpu_summary(node) for node in rows}
    return render_template(
        "nodes.html",
        nodes=_live(rows),
        summaries=summaries,
        next_cursor=next_cursor,
        fleet=fleet,
        status=status,
        name=name or "",
        fleets=fleet_names,
        statuses=[s.value for s in NodeStatus],
        now=current_runtime().clock.now(),
    )


def _gpu_rows(rt, node):
    """Per GPU: the inventory, what holds it and the node's tasks (the allocation view, admins
    only), and the agent's last readings. Returns (gpu rows, task allocations or None)."""
    seen = rt.liveness.get(node.id)
    readings = ((seen.metrics or {}).get("gpus") or {}) if seen is not None and seen.metrics else {}
    allocation, tasks = {}, None
    if g.ui_principal.role in roles.ALLOCATION:
        view = capacity.cluster_allocation(cluster.current_state(rt))
        allocation = {row["uuid"]: row for row in view["gpus"] if row["node_id"] == node.id}
        tasks = [a for a in view["allocations"] if a["node_id"] == node.id]
    rows = []
    for gpu in node.gpu_list:
        live = readings.get(gpu.uuid) if isinstance(readings, dict) else None
        rows.append(
            {
                "gpu": gpu,
                "live": live if isinstance(live, dict) else {},
                "alloc": allocation.get(gpu.uuid),
            }
        )
    return rows, tasks


@bp.route("/nodes/<string:node_id>")
@ui_require(roles.NODES)
def node_page(node_id):
    """One node: GPUs with health, live readings and tasks; drain state; events; actions. By
    hostname too: it goes to its node's id, or lists the nodes of that hostname."""
    other = answer_by_name(
        node_id,
        nodes.resolve_node(node_id),
        "node",
        "ui.node_page",
        [
            ("hostname", "hostname"),
            ("fleet", "fleet_id"),
            ("status", "status"),
            ("registered", "registered_at"),
        ],
    )
    if other is not None:
        return other
    return _node_page(node_id)


def _node_page(node_id, form=None, errors=None, status=200):
    """The node's page; with `errors`, the drain form shown again with what was typed in `form` and
    each message beside its field."""
    rt = current_runtime()
    node = _live([nodes.get_node(node_id)])[0]
    events = []
    if g.ui_principal.role in roles.NODE_EVENTS:
        events = nodes.node_events_tail(node_id, EVENTS_SHOWN)
    now_status = NodeStatus(node.status)
    available = {
        action: now_status.allows(action) for action in ("cordon", "uncordon", "drain", "undrain")
    }
    available["revoke"] = now_status is not NodeStatus.REVOKED
    actions = [
        (name, ACTIONS[name][0])
        for name, ok in available.items()
        if ok and g.ui_principal.role in roles.NODE_ACTIONS[name]
    ]
    gpus, tasks = _gpu_rows(rt, node)
    topology = None
    if node.topology:
        shown = [{"uuid": row["gpu"].uuid, "index": row["gpu"].index} for row in gpus]
        topology = {"rows": topology_rows(node.topology, shown), "nics": node.topology["nics"]}
    return render_template(
        "node.html",
        node=node,
        gpus=gpus,
        tasks=tasks,
        topology=topology,
        topology_legend=LEGEND,
        network=network_of(node.labels),
        events=list(reversed(events)),
        actions=actions,
        drain=node.drain,
        now=rt.clock.now(),
        form=form or {},
        errors=errors or {},
        validation=validation.latest_validation(node_id),
    ), status


@bp.route(
    "/nodes/<string:node_id>/<any(cordon, uncordon, drain, undrain, revoke):action>",
    methods=["POST"],
)
@ui_require(roles.NODES)
def node_action(node_id, action):
    """Cordon, uncordon, drain, undrain or revoke: a confirmation step, then the same service call
    as the API."""
    allow(roles.NODE_ACTIONS[action])
    rt = current_runtime()
    node = nodes.get_node(node_id)
    drain = None
    if action == "drain":
        typed = {
            name: request.form.get(name, "")[:KEPT_CHARS] for name in ("reason", "deadline_minutes")
        }
        try:
            drain = load_form(
                NodeDrainSchema(),
                {"reason": typed["reason"], "deadline_seconds": typed["deadline_minutes"]},
                multipliers={"deadline_seconds": 60},
            )
        except FormError as exc:
            if not NodeStatus(node.status).allows("drain"):
                # The page has no drain form to show the messages beside: the error page says them.
                raise
            errors = {
                DRAIN_FIELDS.get(name, name): messages for name, messages in exc.errors.items()
            }
            return _node_page(node_id, typed, errors, 400)
    if not confirmed(request.form):
        return render_template(
            "confirm_node.html",
            node=node,
            action=action,
            title=ACTIONS[action][0],
            explanation=ACTIONS[action][1],
            drain=drain,
            deadline_minutes=request.form.get("deadline_minutes", ""),
        )
    if drain is not None:  # a drain: its form was loaded above
        node = nodes.drain_node(rt, node_id, drain["reason"], drain["deadline_seconds"])
    else:
        node = {
            "cordon": nodes.cordon_node,
            "uncordon": nodes.uncordon_node,
            "undrain": nodes.undrain_node,
            "revoke": nodes.revoke_node,
        }[action](rt, node_id)
    flash(f"{node.hostname} is now {node.status}.")
    return redirect(url_for("ui.node_page", node_id=node_id))
