"""Sign-in with an API token (or the buttons of the identity providers: fleetd.ui.sso), and
sign-out."""

from flask import g, redirect, render_template, request, url_for

from fleetd.auth import resolve_token
from fleetd.errors import InvalidRequest, RateLimited, Unauthorized
from fleetd.runtime import current_runtime, request_address
from fleetd.services.identity import oidc
from fleetd.ui import roles
from fleetd.ui.blueprint import bp
from fleetd.ui.security import safe_next, sign_in, sign_out


def _landing(principal):
    return url_for("ui.overview") if principal.role in roles.OVERVIEW else url_for("ui.job_list")


@bp.route("/login", methods=["GET", "POST"])
def login():
    """The sign-in form (public); POST checks the token the way the API checks bearer tokens."""
    target = safe_next(request.values.get("next"))
    if request.method == "GET":
        if g.ui_principal is not None:
            return redirect(target or _landing(g.ui_principal))
        return _page(target, None), 200
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
        if principal.kind != "api":
            raise InvalidRequest(
                "sign in with an API token (fla_...), not a node or join token (a user signs in "
                "with an identity provider's button)"
            )
        sign_in(principal, rt.clock.now())
    except (Unauthorized, RateLimited, InvalidRequest) as exc:
        return _page(target, f"Sign-in refused: {exc.message}."), exc.http_status
    return redirect(target or _landing(principal))


def _page(target, error):
    """The sign-in page: a button per identity provider users sign in with, and the token form."""
    return render_template(
        "login.html", next=target, error=error, providers=oidc.sign_in_provider_names()
    )


@bp.route("/logout", methods=["POST"])
def logout():
    """End the session (a POST with the CSRF token, so no other site can sign you out); a session
    signed in with a provider ends with it."""
    sign_out(current_runtime().clock.now(), g.ui_principal)
    return redirect(url_for("ui.login"))
