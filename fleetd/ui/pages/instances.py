"""Instances: the list with a state filter; an instance's page with its runtime, ports, log tail,
events and stop / resume / delete behind a confirmation."""

import shlex

from flask import flash, g, redirect, render_template, request, url_for

from fleetd.errors import InvalidRequest
from fleetd.models import InstanceState
from fleetd.runtime import current_runtime
from fleetd.schemas.instances import ResumeSchema
from fleetd.services.accounting import usage
from fleetd.services.nodes import nodes
from fleetd.services.workloads import instance_views, instances
from fleetd.ui import roles, specforms
from fleetd.ui.blueprint import bp
from fleetd.ui.forms import FormError, load_form
from fleetd.ui.pages import logs
from fleetd.ui.pages.common import allow, answer_by_name, confirmed, masked_spec_text
from fleetd.ui.security import ui_require

LIST_LIMIT = 200
EVENTS_SHOWN = 100
KEPT_CHARS = 100  # of a number typed into the resume form, shown back (a number needs no more)
# While an instance is on its way somewhere (or runs, with figures that move), its page refreshes
# itself.
LIVE_STATES = ("pending", "starting", "running", "restarting", "stopping", "deleting")

ACTIONS = {
    "stop": (
        "Stop",
        "Its processes are stopped and its GPUs freed. Its volume stays on its node, and a resume "
        "starts it there again.",
    ),
    "resume": (
        "Resume",
        "It runs again on the node that holds its volume; while that node lacks the GPUs it "
        "waits, and says why.",
    ),
    "delete": (
        "Delete",
        "It is stopped and its volume is deleted, with everything on it. This cannot be undone.",
    ),
}


@bp.route("/instances")
@ui_require(roles.INSTANCES)
def instance_list():
    """Instances (every one but the deleted, or those in one state, or one owner's): where they run,
    their ports, price and cost, and why they wait."""
    state = request.args.get("state", "").strip() or None
    owner = request.args.get("owner", "").strip() or None
    team = request.args.get("team", "").strip() or None
    name = request.args.get("name", "").strip() or None
    fleet = request.args.get("fleet", "").strip() or None
    cursor = request.args.get("cursor") or None
    states = [s.value for s in InstanceState]
    if state is not None and state not in states:
        raise InvalidRequest(f"unknown instance state {state!r}")
    rows, next_cursor = instances.list_instances(
        g.ui_principal, LIST_LIMIT, cursor, state, owner, team=team, fleet=fleet, search=name
    )
    return render_template(
        "instances.html",
        rows=instance_views.instance_views(current_runtime(), rows),
        state=state or "",
        owner=owner or "",
        team=team or "",
        name=name or "",
        fleet=fleet or "",
        states=states,
        next_cursor=next_cursor,
    )


PORT_STATE_TEXT = {
    "ok": "the instance's",
    "not_listening": "nothing listens yet",
    "taken_by_other_process": "another process: its URL could reach that process, so none is given",
    "unknown": "not reported yet",
}


def _ports(view):
    """Each declared port with where it is reached while the instance runs: its node's address and
    the public port the node gave it (the Instance's runtime.ports), and whose listener that port
    has."""
    published = {p["private_port"]: p for p in ((view["runtime"] or {}).get("ports") or [])}
    out = []
    for port in view["spec"].get("ports") or []:
        protocol = port.get("protocol") or "http"
        public = published.get(port["port"])
        state = public.get("state") if public else None
        url = public.get("url") if public and state != "taken_by_other_process" else None
        out.append(
            {
                "port": port["port"],
                "protocol": protocol,
                "url": url,
                "state": state,
                "state_text": PORT_STATE_TEXT.get(state or "", ""),
                "public": bool(public and public.get("is_ip_public")),
            }
        )
    return out


def _actions(view):
    """(action, label) of the buttons this instance and this role allow now."""
    state = InstanceState(view["state"])
    available = {
        "stop": view["desired_state"] == "running"
        and state not in (InstanceState.DELETING, InstanceState.DELETED),
        "resume": state.can_resume(),
        "delete": state not in (InstanceState.DELETING, InstanceState.DELETED),
    }
    return [
        (name, ACTIONS[name][0])
        for name, ok in available.items()
        if ok and g.ui_principal.role in roles.INSTANCE_ACTIONS[name]
    ]


@bp.route("/instances/<string:instance_id>")
@ui_require(roles.INSTANCE)
def instance_page(instance_id):
    """One instance: state and why, runtime figures, ports as links, the end of its log, its events.
    By name too: a name goes to its instance's id, or lists the instances of that name."""
    rt = current_runtime()
    principal = g.ui_principal
    matches = instances.resolve_instance(principal, instance_id)
    other = answer_by_name(
        instance_id,
        matches,
        "instance",
        "ui.instance_page",
        [("name", "name"), ("owner", "owner"), ("state", "state"), ("created", "created_at")],
    )
    if other is not None:
        return other
    view = instance_views.instance_view(rt, matches[0])
    context = _context(view)
    if request.args.get("partial") == "live":
        if request.args.get("actions", "") != ",".join(name for name, _ in context["actions"]):
            # What may be done changed (it stopped, say): the whole page again, with the right
            # buttons.
            return "", 204, {"HX-Refresh": "true"}
        return render_template("_instance_live.html", **context)
    return _full_page(rt, view, context)


def _context(view):
    """What both the whole page and its live part show of an instance."""
    principal = g.ui_principal
    node = (
        nodes.find_node(view["node_id"])
        if view["node_id"] and principal.role in roles.NODES
        else None
    )
    command = view["spec"].get("command")
    return {
        "inst": view,
        "node": node,
        "ports": _ports(view),
        "actions": _actions(view),
        "command": shlex.join(command) if command else "",
        "live": view["state"] in LIVE_STATES,
    }


def _full_page(rt, view, context, form=None, errors=None, status=200):
    """The instance's whole page; with `errors`, the resume form shown again with what was typed in
    `form` and each message beside its field."""
    principal, instance_id = g.ui_principal, view["id"]
    events = []
    if principal.role in roles.INSTANCE_EVENTS:
        events = instance_views.instance_events_tail(principal, instance_id, EVENTS_SHOWN)
    lines = []
    if principal.role in roles.INSTANCE_LOGS:
        lines = instance_views.instance_logs_tail(rt, principal, instance_id, logs.SHOWN)
    log = logs.box(
        lines,
        _log_url(instance_id),
        context["live"],
        INSTANCE_QUIET,
        url_for("ui.instance_log_search", instance_id=instance_id),
        url_for("ui.instance_output", instance_id=instance_id),
    )
    return render_template(
        "instance.html",
        events=list(reversed(events)),
        log=log,
        spec_text=masked_spec_text(view["spec"]),
        form=form or {},
        errors=errors or {},
        usage=usage.workload_usage(rt, principal, view["id"]),
        **context,
    ), status


INSTANCE_QUIET = "it runs no process now; the page follows its log again after a resume."


def _log_url(instance_id):
    return lambda **args: url_for("ui.instance_log", instance_id=instance_id, **args)


@bp.route("/instances/<string:instance_id>/log/search")
@ui_require(roles.INSTANCE_LOGS)
def instance_log_search(instance_id):
    """Lines of the whole output of the instance's runs that hold `q`."""
    principal, rt = g.ui_principal, current_runtime()
    return logs.found(
        lambda n, q, regex: instance_views.instance_logs(
            rt, principal, instance_id, n, q=q, q_regex=regex
        )
    )


@bp.route("/instances/<string:instance_id>/output")
@ui_require(roles.INSTANCE_LOGS)
def instance_output(instance_id):
    """The whole output of the instance's runs as a text file."""
    pieces = instance_views.instance_output(current_runtime(), g.ui_principal, instance_id)
    return logs.whole(pieces, f"{instance_id}.log")


@bp.route("/instances/<string:instance_id>/log")
@ui_require(roles.INSTANCE_LOGS)
def instance_log(instance_id):
    """Log lines after `after` (the page polls this while the instance is live), or with `before`
    the lines before that one ("Load earlier lines")."""
    principal, rt = g.ui_principal, current_runtime()
    inst = instances.find_instance(principal, instance_id, deleted=True)
    if request.args.get("before"):
        return logs.earlier(
            lambda before, n: instance_views.instance_logs_tail(
                rt, principal, instance_id, n, before=before
            ),
            _log_url(instance_id),
        )
    return logs.newer(
        lambda after, n: instance_views.instance_logs(rt, principal, instance_id, n, after=after)[
            0
        ],
        _log_url(instance_id),
        inst.state in LIVE_STATES,
        INSTANCE_QUIET,
    )


@bp.route("/instances/<string:instance_id>/<any(stop, resume, delete):action>", methods=["POST"])
@ui_require(roles.INSTANCE)
def instance_action(instance_id, action):
    """Stop, resume or delete: a confirmation step, then the same service call as the API."""
    principal = allow(roles.INSTANCE_ACTIONS[action])
    rt = current_runtime()
    inst = instances.get_instance(principal, instance_id)
    resume, hidden = {}, {}
    if action == "resume":
        hidden = {
            k: request.form[k].strip()[:KEPT_CHARS]
            for k in ("gpus", "bid")
            if request.form.get(k, "").strip()
        }
        try:
            resume = load_form(ResumeSchema(), request.form)
        except FormError as exc:
            return _resume_refused(rt, inst, hidden, exc.errors)
    if not confirmed(request.form):
        return render_template(
            "confirm_instance.html",
            inst=inst,
            action=action,
            title=ACTIONS[action][0],
            explanation=ACTIONS[action][1],
            hidden=hidden,
        )
    if action == "stop":
        inst = instances.stop_instance(rt, principal, instance_id)
    elif action == "resume":
        try:
            inst = instances.resume_instance(
                rt, principal, instance_id, resume["gpus"], resume["bid"]
            )
        except InvalidRequest as exc:  # a bid under the minimum, or on an on-demand instance
            errors = specforms.service_errors(exc, {})
            errors.setdefault(
                specforms.GENERAL, [exc.message]
            )  # the whole sentence above the form as well
            return _resume_refused(rt, inst, hidden, errors)
    else:
        inst = instances.delete_instance(rt, principal, instance_id)
        if inst.state == InstanceState.DELETED.value:
            flash(f"Instance {inst.name} deleted; its node deletes its volume.")
        else:
            flash(
                f"Instance {inst.name} is {inst.state}: it is deleted once its processes have "
                "ended and its node has deleted its volume."
            )
        return redirect(url_for("ui.instance_list"))
    flash(f"Instance {inst.name} is now {inst.state}.")
    return redirect(url_for("ui.instance_page", instance_id=instance_id))


def _resume_refused(rt, inst, form, errors):
    """The instance's page again (400), its resume form holding what was typed, each message beside
    its field."""
    view = instance_views.instance_view(rt, inst)
    context = _context(view)
    if "resume" not in dict(
        context["actions"]
    ):  # no resume form on the page: the error page says it
        raise FormError(errors)
    return _full_page(rt, view, context, form, errors, 400)
