"""Sign-in with an API token, and sign-out."""

from flask import g, redirect, render_template, request, url_for

from fleetd.auth import resolve_token
from fleetd.errors import InvalidRequest, RateLimited, Unauthorized
from fleetd.runtime import current_runtime, request_address
from fleetd.ui import roles
from fleetd.ui.blueprint import bp
from fleetd.ui.security import sign_in, sign_out


def _safe_next(target):
    """Only a path inside the UI: never an open redirect to another site."""
    if target and target.startswith("/ui/") and not target.startswith("//") and "\\" not in target:
        return target
    return None


def _landing(principal):
    return url_for("ui.overview") if principal.role in roles.OVERVIEW else url_for("ui.job_list")


@bp.route("/login", methods=["GET", "POST"])
def login():
    """The sign-in form (public); POST checks the token the way the API checks bearer tokens."""
    target = _safe_next(request.values.get("next"))
    if request.method == "GET":
        if g.ui_principal is not None:
            return redirect(target or _landing(g.ui_principal))
        return render_template("login.html", next=target, error=None)
    rt = current_runtime()
    token = request.form.get("token", "").strip()
    try:
        if not token:
            raise Unauthorized("paste an API token")
        try:
            principal = resolve_token(token, rt.clock.now())
        except Unauthorized:
            rt.limiter.fail(request_address(), rt.clock.monotonic())
            raise
        sign_in(principal, rt.clock.now())
    except (Unauthorized, RateLimited, InvalidRequest) as exc:
        return render_template(
            "login.html", next=target, error=f"Sign-in refused: {exc.message}."
        ), exc.http_status
    return redirect(target or _landing(principal))


@bp.route("/logout", methods=["POST"])
def logout():
    """End the session (a POST with the CSRF token, so no other site can sign you out)."""
    sign_out()
    return redirect(url_for("ui.login"))
