"""Fleets (create, change labels, windows, health policy and isolation rules) and team quotas: forms
over the API's schemas and services."""

from flask import flash, redirect, render_template, request, url_for

from fleetd.errors import InvalidRequest
from fleetd.runtime import current_runtime
from fleetd.schemas.cluster import QuotaUpdateSchema
from fleetd.schemas.fleets import TIME_ZONES, FleetCreateSchema, FleetUpdateSchema
from fleetd.services.fleet_ops import fleets
from fleetd.services.placement import policy
from fleetd.ui import roles, specforms
from fleetd.ui.blueprint import bp
from fleetd.ui.forms import FormError
from fleetd.ui.pages.common import confirmed
from fleetd.ui.security import ui_require

LIST_LIMIT = 1000
TEAM_MAX = 200  # the API keeps this much of a team name
FLEET_FIELDS = {
    "availability": "windows",
    "availability.windows": "windows",
    "availability.timezone": "timezone",
    "health_policy": "health_policy",
    "health_policy.drain_after_seconds": "health_policy",
}


def fleet_body(form):
    """The fleet form -> the body of POST /api/v1/fleets (or of a PATCH, which takes the same
    fields)."""
    body = {
        "description": form.get("description", "").strip(),
        "labels": specforms.labels(form.get("labels")),
        "allow_root_tasks": specforms.checked(form, "allow_root_tasks"),
        "require_isolation": specforms.checked(form, "require_isolation"),
        "allowed_images": [
            p.strip() for p in form.get("allowed_images", "*").split(",") if p.strip()
        ],
    }
    spans = specforms.windows(form.get("windows"))
    body["availability"] = (
        {"timezone": form.get("timezone", "").strip() or "UTC", "windows": spans} if spans else None
    )
    body["health_policy"] = {
        "cordon_on_gpu_fault": specforms.checked(form, "cordon_on_gpu_fault"),
        "drain_after_seconds": specforms.scaled(form.get("drain_after_minutes"), 60),
        "uncordon_when_healthy": specforms.checked(form, "uncordon_when_healthy"),
    }
    return body


def fleet_form_values(fleet):
    """A fleet's fields as its edit form shows them."""
    policy_now = fleet.effective_health_policy
    availability = fleet.availability or {}
    drain = policy_now.get("drain_after_seconds")
    return {
        "description": fleet.description or "",
        "labels": ", ".join(f"{k}={v}" for k, v in sorted((fleet.labels or {}).items())),
        "timezone": availability.get("timezone") or "UTC",
        "windows": "\n".join(
            f"{w['start']}-{w['end']}" + (f" {','.join(w['days'])}" if w.get("days") else "")
            for w in availability.get("windows") or []
        ),
        "cordon_on_gpu_fault": "on" if policy_now.get("cordon_on_gpu_fault") else "",
        "drain_after_minutes": "" if drain is None else f"{drain / 60:g}",
        "uncordon_when_healthy": "on" if policy_now.get("uncordon_when_healthy") else "",
        "allow_root_tasks": "on" if fleet.allow_root_tasks else "",
        "require_isolation": "on" if fleet.require_isolation else "",
        "allowed_images": ", ".join(fleet.allowed_images or ["*"]),
    }


NEW_FLEET = {
    "cordon_on_gpu_fault": "on",
    "drain_after_minutes": "10",
    "uncordon_when_healthy": "on",
    "allowed_images": "*",
    "timezone": "UTC",
}


def _fleets_page(form=None, errors=None, status=200):
    rows = fleets.list_fleets(LIST_LIMIT)[0]
    return render_template(
        "fleets.html", fleets=rows, form=form or NEW_FLEET, errors=errors or {}, zones=TIME_ZONES
    ), status


@bp.route("/fleets")
@ui_require(roles.FLEETS)
def fleet_list():
    """Fleets with their nodes, GPUs, labels, windows and health policy; the form to create one."""
    return _fleets_page()


@bp.route("/fleets", methods=["POST"])
@ui_require(roles.FLEET_CREATE)
def fleet_create():
    """Create a fleet (the API's schema and create_fleet)."""
    rt = current_runtime()
    try:
        body = fleet_body(request.form)
        body["name"] = request.form.get("name", "").strip()
        data = specforms.load(FleetCreateSchema(), body, FLEET_FIELDS)
        fleet = specforms.run_service(
            lambda: fleets.create_fleet(rt.clock.now(), **data), FLEET_FIELDS
        )
    except FormError as exc:
        return _fleets_page(request.form, exc.errors, 400)
    flash(f"Fleet {fleet.name} created. Make a join token to enrol its hosts.")
    return redirect(url_for("ui.fleet_page", name=fleet.name))


def _fleet_page(name, form=None, errors=None, status=200):
    fleet = fleets.get_fleet(name)
    return render_template(
        "fleet.html",
        fleet=fleet,
        form=form or fleet_form_values(fleet),
        errors=errors or {},
        zones=TIME_ZONES,
    ), status


@bp.route("/fleets/<string:name>")
@ui_require(roles.FLEET)
def fleet_page(name):
    """One fleet: its rules, and (admins) the form that changes them and its join tokens."""
    return _fleet_page(name)


@bp.route("/fleets/<string:name>", methods=["POST"])
@ui_require(roles.FLEET_UPDATE)
def fleet_update(name):
    """Change a fleet's description, labels, windows, health policy or isolation rules (PATCH
    semantics: the form sends every field)."""
    rt = current_runtime()
    fleets.get_fleet(name)  # NotFound first
    try:
        changes = specforms.load(FleetUpdateSchema(), fleet_body(request.form), FLEET_FIELDS)
        specforms.run_service(lambda: fleets.update_fleet(rt, name, changes), FLEET_FIELDS)
    except FormError as exc:
        return _fleet_page(name, request.form, exc.errors, 400)
    flash(f"Fleet {name} saved.")
    return redirect(url_for("ui.fleet_page", name=name))


# ---------------------------------------------------------------- quotas


def _quotas_page(form=None, errors=None, status=200):
    return render_template(
        "quotas.html", quotas=policy.list_quotas(), form=form or {}, errors=errors or {}
    ), status


@bp.route("/quotas")
@ui_require(roles.QUOTAS)
def quotas():
    """Team GPU quotas, per priority class; the form that sets one."""
    return _quotas_page()


@bp.route("/quotas", methods=["POST"])
@ui_require(roles.QUOTA_SET)
def quota_set():
    """Set a team's quota (the API's schema and set_quota)."""
    team = request.form.get("team", "").strip()[:TEAM_MAX]
    try:
        if not team:
            raise FormError({"team": ["a team name is required"]})
        body = specforms.load(
            QuotaUpdateSchema(),
            {
                "priority_class": request.form.get("priority_class") or "any",
                "max_gpus": specforms.number(request.form.get("max_gpus")),
            },
            {},
        )
    except FormError as exc:
        return _quotas_page(request.form, exc.errors, 400)
    quota = policy.set_quota(current_runtime(), team, body["priority_class"], body["max_gpus"])
    flash(f"Team {quota.team} may hold {quota.max_gpus:g} GPUs ({quota.priority_class}).")
    return redirect(url_for("ui.quotas"))


@bp.route("/quotas/<string:team>/remove", methods=["POST"])
@ui_require(roles.QUOTA_DELETE)
def quota_remove(team):
    """Remove one of a team's quotas after a confirmation step."""
    priority_class = request.form.get("priority_class") or ""
    if priority_class not in ("any", "on-demand", "spot"):
        raise InvalidRequest("priority_class must be any, on-demand or spot")
    if not confirmed(request.form):
        return render_template(
            "confirm.html",
            title="Remove quota",
            question=f"Remove team {team}'s quota ({priority_class})? Its work is then "
            "limited only by other quotas and the fleet's size.",
            action=url_for("ui.quota_remove", team=team),
            hidden={"priority_class": priority_class},
            button="Remove",
            back=url_for("ui.quotas"),
        )
    policy.delete_quota(current_runtime(), team, priority_class)
    flash(f"Team {team}'s quota ({priority_class}) removed.")
    return redirect(url_for("ui.quotas"))
