"""Projects: the list and the form that creates one; a project's page with its members and service
accounts (the token shown once), its edit form and its deletion, over the API's schemas and
services (which decide who may manage a project: admins and the project's admins)."""

from flask import flash, g, redirect, render_template, request, url_for

from fleetd.credentials import PROJECT_ROLES
from fleetd.errors import Conflict, Forbidden
from fleetd.runtime import current_runtime
from fleetd.schemas.people import (
    MemberPutSchema,
    ProjectCreateSchema,
    ProjectPatchSchema,
    ServiceAccountCreateSchema,
)
from fleetd.services.identity import projects
from fleetd.ui import roles, specforms
from fleetd.ui.blueprint import bp
from fleetd.ui.forms import FormError, load_form
from fleetd.ui.pages.common import confirmed
from fleetd.ui.security import ui_require

LIST_LIMIT = 200
PROJECT_FIELDS = ("name", "display_name", "team", "description")
LOGIN_MAX = 64  # a login is at most this long (models.User.login)


def _projects_page(form=None, errors=None, status=200):
    cursor = request.args.get("cursor") or None
    rows, next_cursor = projects.list_projects(g.ui_principal, LIST_LIMIT, cursor)
    return render_template(
        "projects.html",
        projects=rows,
        next_cursor=next_cursor,
        form=form or {},
        errors=errors or {},
    ), status


@bp.route("/projects")
@ui_require(roles.PROJECTS)
def project_list():
    """Projects (every one for admins, operators and viewers; a member's own); the create form."""
    return _projects_page()


@bp.route("/projects", methods=["POST"])
@ui_require(roles.PROJECT_CREATE)
def project_create():
    """Create a project (POST /api/v1/projects)."""
    now = current_runtime().clock.now()
    try:
        body = load_form(ProjectCreateSchema(), request.form)
        project = specforms.run_service(lambda: projects.create_project(now, **body), {})
    except FormError as exc:
        return _projects_page(request.form, exc.errors, 400)
    flash(f"Project {project.key} created. Add its members below.")
    return redirect(url_for("ui.project_page", key=project.key))


def _manages(principal, key):
    """Whether the principal may manage the project's members and service accounts (the service's
    own check), with its service accounts when it may."""
    try:
        return True, projects.list_service_accounts(principal, key)
    except Forbidden:
        return False, []


def _project_page(key, forms=None, errors=None, status=200, created=None):
    principal = g.ui_principal
    project = projects.get_project(principal, key)
    manages, accounts = _manages(principal, key)
    forms = forms or {}
    return render_template(
        "project.html",
        project=project,
        members=projects.list_members(principal, key),
        manages=manages,
        accounts=accounts,
        created=created,
        project_roles=PROJECT_ROLES,
        edit=forms.get("edit") or {f: getattr(project, f) or "" for f in PROJECT_FIELDS},
        member_form=forms.get("member") or {"role": "member"},
        account_form=forms.get("account") or {"expires_in_seconds": "90"},
        errors=errors or {},
        now=current_runtime().clock.now(),
    ), status


@bp.route("/projects/<string:key>")
@ui_require(roles.PROJECT)
def project_page(key):
    """A project: its fields, members and (for those who manage it) service accounts."""
    return _project_page(key)


@bp.route("/projects/<string:key>/edit", methods=["POST"])
@ui_require(roles.PROJECT_UPDATE)
def project_update(key):
    """Change a project's names, team or description (PATCH /api/v1/projects/{key})."""
    now = current_runtime().clock.now()
    projects.get_project(g.ui_principal, key)  # NotFound first
    body: dict[str, str | None] = {
        f: request.form.get(f, "").strip() for f in PROJECT_FIELDS if f in request.form
    }
    for field in ("team", "description"):  # empty: none
        if body.get(field) == "":
            body[field] = None
    try:
        changes = specforms.load(ProjectPatchSchema(), body, {})
        specforms.run_service(lambda: projects.update_project(now, key, changes), {})
    except FormError as exc:
        return _project_page(key, {"edit": request.form}, {"edit": exc.errors}, 400)
    flash(f"Project {key} saved.")
    return redirect(url_for("ui.project_page", key=key))


@bp.route("/projects/<string:key>/delete", methods=["POST"])
@ui_require(roles.PROJECT_DELETE)
def project_delete(key):
    """Delete a project after a confirmation step; the service refuses `default` and a project
    that holds live work, and its words are shown on the project's page."""
    now = current_runtime().clock.now()
    projects.get_project(g.ui_principal, key)
    if not confirmed(request.form):
        return render_template(
            "confirm.html",
            title="Delete project",
            question=f"Delete project {key}? Its members leave it, its service accounts are "
            "revoked, and users whose default it was have none.",
            action=url_for("ui.project_delete", key=key),
            hidden={},
            button="Delete",
            back=url_for("ui.project_page", key=key),
        )
    try:
        projects.delete_project(now, key)
    except Conflict as exc:
        flash(f"Project {key} was not deleted: {exc.message}.", "error")
        return redirect(url_for("ui.project_page", key=key))
    flash(f"Project {key} deleted.")
    return redirect(url_for("ui.project_list"))


@bp.route("/projects/<string:key>/members", methods=["POST"])
@ui_require(roles.MEMBER_SET)
def member_set(key):
    """Add a user to the project or change its role there (PUT .../members/{login})."""
    principal, now = g.ui_principal, current_runtime().clock.now()
    projects.may_manage(principal, key)  # a 403 page for one who may not (its page has no form)
    login = request.form.get("login", "").strip()
    try:
        if not login or len(login) > LOGIN_MAX:
            raise FormError({"login": [f"a user's login, 1 to {LOGIN_MAX} characters"]})
        role = load_form(MemberPutSchema(), request.form)["role"]
        specforms.run_service(lambda: projects.set_member(principal, now, key, login, role), {})
    except FormError as exc:
        return _project_page(key, {"member": request.form}, {"member": exc.errors}, 400)
    flash(f"{login} is {role} of project {key}.")
    return redirect(url_for("ui.project_page", key=key))


@bp.route("/projects/<string:key>/members/<string:login>/remove", methods=["POST"])
@ui_require(roles.MEMBER_REMOVE)
def member_remove(key, login):
    """Take a user out of the project after a confirmation step."""
    principal, now = g.ui_principal, current_runtime().clock.now()
    projects.may_manage(principal, key)
    if not confirmed(request.form):
        return render_template(
            "confirm.html",
            title="Remove member",
            question=f"Take {login} out of project {key}? It can no longer submit work there.",
            action=url_for("ui.member_remove", key=key, login=login),
            hidden={},
            button="Remove",
            back=url_for("ui.project_page", key=key),
        )
    projects.remove_member(principal, now, key, login)
    flash(f"{login} is no longer a member of project {key}.")
    return redirect(url_for("ui.project_page", key=key))


@bp.route("/projects/<string:key>/service-accounts", methods=["POST"])
@ui_require(roles.SERVICE_ACCOUNT_CREATE)
def service_account_create(key):
    """Create a service account of the project; its token is in this response only."""
    principal, now = g.ui_principal, current_runtime().clock.now()
    projects.may_manage(principal, key)
    try:
        body = load_form(
            ServiceAccountCreateSchema(),
            request.form,
            multipliers={"expires_in_seconds": 86400},
        )
        row, token = specforms.run_service(
            lambda: projects.create_service_account(
                principal, now, key, body["name"], body["expires_in_seconds"]
            ),
            {},
        )
    except FormError as exc:
        return _project_page(key, {"account": request.form}, {"account": exc.errors}, 400)
    return _project_page(key, created={"row": row, "token": token})
