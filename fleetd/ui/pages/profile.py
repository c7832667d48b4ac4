"""The signed-in principal's own page (what GET /api/v1/whoami answers: its user, projects, limits
and use, and its tokens) and the header's project switcher."""

from flask import flash, g, redirect, render_template, request, url_for

from fleetd.runtime import current_runtime
from fleetd.services.identity import limits, projects, tokens
from fleetd.services.identity.users import find_user
from fleetd.ui import roles, switcher
from fleetd.ui.blueprint import bp
from fleetd.ui.security import safe_next, ui_require

TOKENS_SHOWN = 200


@bp.route("/profile")
@ui_require(roles.PROFILE)
def profile():
    """Who you are signed in as: your user, projects and default project, the limits that hold for
    you and what you hold of them, and your tokens (never their secrets)."""
    principal = g.ui_principal
    rt = current_runtime()
    user = find_user(principal.user_id)
    if user is not None:
        own_tokens = tokens.list_user_tokens(user.id, TOKENS_SHOWN)
        member_of = projects.project_roles(user.id)
    else:
        own_tokens = []
        member_of = switcher.choices(principal) if principal.project else []
    return render_template(
        "profile.html",
        me=user,  # not `user`: base.html sets that one
        tokens=own_tokens,
        member_of=member_of,
        held=limits.limits_of(rt.settings, principal),
        now=rt.clock.now(),
    )


@bp.route("/project", methods=["POST"])
@ui_require(roles.PROFILE)
def project_switch():
    """Switch the session's project (the default of the deploy forms), then go back."""
    key = request.form.get("project", "").strip()
    try:
        switcher.choose(g.ui_principal, key)
    except ValueError as exc:
        flash(str(exc), "error")
    else:
        flash(
            f"Project {key} chosen: new jobs and instances go there by default."
            if key
            else "Project choice cleared: new work goes to your default project."
        )
    target = safe_next(request.form.get("next")) or url_for("ui.profile")
    return redirect(target)
