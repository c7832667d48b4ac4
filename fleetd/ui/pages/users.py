"""Users (admins): the list with an active filter, a user's page with its projects and tokens, and
its role, default project, deactivation and deletion, over the API's schemas and services."""

from flask import flash, g, redirect, render_template, request, url_for

from fleetd.credentials import USER_ROLES
from fleetd.errors import InvalidRequest
from fleetd.runtime import current_runtime
from fleetd.schemas.people import UserPatchSchema
from fleetd.services.identity import projects, tokens, users
from fleetd.ui import roles, specforms
from fleetd.ui.blueprint import bp
from fleetd.ui.forms import FormError
from fleetd.ui.pages.common import confirmed
from fleetd.ui.security import ui_require

LIST_LIMIT = 200
TOKENS_SHOWN = 200
ACTIVE_FILTER = {"true": True, "false": False, "any": None}
NO_PROJECT = ""  # the default-project select's "none"


@bp.route("/users")
@ui_require(roles.USERS)
def user_list():
    """Users by id: login, name, email, role, team, default project, source and whether active."""
    shown = request.args.get("active", "any") or "any"
    if shown not in ACTIVE_FILTER:
        raise InvalidRequest("active is true, false or any")
    cursor = request.args.get("cursor") or None
    rows, next_cursor = users.list_users(LIST_LIMIT, cursor, ACTIVE_FILTER[shown])
    return render_template("users.html", users=rows, active=shown, next_cursor=next_cursor)


def _user_page(login, form=None, errors=None, status=200):
    principal = g.ui_principal
    user = users.get_user(principal, login)
    member_of = projects.project_roles(user.id)
    project_keys = [p["key"] for p in member_of]
    if user.default_project and user.default_project not in project_keys:
        project_keys.append(user.default_project)
    return render_template(
        "user.html",
        account=user,  # not `user`: base.html sets that one
        member_of=member_of,
        project_keys=project_keys,
        tokens=tokens.list_user_tokens(user.id, TOKENS_SHOWN),
        role_names=USER_ROLES,
        form=form or {"role": user.role, "default_project": user.default_project or NO_PROJECT},
        errors=errors or {},
        now=current_runtime().clock.now(),
    ), status


@bp.route("/users/<string:login>")
@ui_require(roles.USERS)
def user_page(login):
    """A user: its fields, projects and tokens; the forms that change it."""
    return _user_page(login)


@bp.route("/users/<string:login>", methods=["POST"])
@ui_require(roles.USER_UPDATE)
def user_update(login):
    """Change a user's role and default project (PATCH /api/v1/users/{login})."""
    rt = current_runtime()
    users.get_user(g.ui_principal, login)  # NotFound first
    chosen = request.form.get("default_project", NO_PROJECT).strip()
    body = {"role": request.form.get("role", "").strip(), "default_project": chosen or None}
    try:
        changes = specforms.load(UserPatchSchema(), body, {})
        user = specforms.run_service(
            lambda: users.update_user(rt, rt.clock.now(), login, changes), {}
        )
    except FormError as exc:
        return _user_page(login, request.form, exc.errors, 400)
    flash(f"User {user.login} saved: role {user.role}, default project {user.default_project}.")
    return redirect(url_for("ui.user_page", login=login))


@bp.route("/users/<string:login>/active", methods=["POST"])
@ui_require(roles.USER_UPDATE)
def user_active(login):
    """Deactivate a user (its sessions end and its tokens are revoked at once) or activate it
    again, after a confirmation step."""
    rt = current_runtime()
    user = users.get_user(g.ui_principal, login)
    wanted = request.form.get("active")
    if wanted not in ("true", "false"):
        raise InvalidRequest("active is true or false")
    active = wanted == "true"
    if not confirmed(request.form):
        question = (
            f"Activate user {user.login} again? It may sign in and be given new tokens; the tokens "
            "revoked when it was deactivated stay revoked."
            if active
            else f"Deactivate user {user.login}? Its sessions end and its tokens are revoked at "
            "once; its work and usage stay its own."
        )
        return render_template(
            "confirm.html",
            title="Activate user" if active else "Deactivate user",
            question=question,
            action=url_for("ui.user_active", login=login),
            hidden={"active": wanted},
            button="Activate" if active else "Deactivate",
            back=url_for("ui.user_page", login=login),
        )
    users.update_user(rt, rt.clock.now(), login, {"active": active})
    flash(f"User {login} {'activated' if active else 'deactivated'}.")
    if not active and login == g.ui_principal.login:
        return redirect(url_for("ui.login"))
    return redirect(url_for("ui.user_page", login=login))


@bp.route("/users/<string:login>/delete", methods=["POST"])
@ui_require(roles.USER_DELETE)
def user_delete(login):
    """Delete a user after a confirmation step: it is deactivated and leaves its projects; its work
    and usage keep its name."""
    rt = current_runtime()
    users.get_user(g.ui_principal, login)
    if not confirmed(request.form):
        return render_template(
            "confirm.html",
            title="Delete user",
            question=f"Delete user {login}? It is deactivated (its sessions end, its tokens are "
            "revoked) and taken out of every project; its work and usage keep its name.",
            action=url_for("ui.user_delete", login=login),
            hidden={},
            button="Delete",
            back=url_for("ui.user_page", login=login),
        )
    users.delete_user(rt, rt.clock.now(), login)
    flash(f"User {login} deleted: deactivated and out of every project.")
    if login == g.ui_principal.login:
        return redirect(url_for("ui.login"))
    return redirect(url_for("ui.user_list"))
