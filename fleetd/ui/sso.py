"""Signing a browser in to the admin UI with an identity provider: the authorization code flow with
PKCE (services.identity.browser) behind two API routes that take no bearer token.

GET /api/v1/auth/login/{provider} sends the browser to the provider, with a cookie that binds the
sign-in to this browser; the provider sends it back to GET /api/v1/auth/callback/{provider}, which
signs it in to the UI (the UI's session cookie, acting as the user's new session) or answers a
page that says why not. They live with the UI rather than in fleetd.api because what they answer
is the UI's: its session cookie and its pages."""

import secrets

from flask import make_response, redirect, render_template, request, url_for
from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import resolve_token
from fleetd.errors import FleetdError, ProviderUnavailable, SignInError, Unauthorized
from fleetd.runtime import current_runtime, public_url, request_address
from fleetd.services.identity import browser
from fleetd.services.identity.oidc import PROVIDER_NAME_RE
from fleetd.ui.blueprint import security_headers
from fleetd.ui.security import SIGN_IN_CALLBACK_PATH, request_is_https, safe_next, sign_in

BROWSER_COOKIE = "fleetd_signin"  # binds a sign-in under way to the browser that started it
BROWSER_COOKIE_PATH = "/api/v1/auth/"  # sent to the start (which keeps it) and the callback

blp = Blueprint(
    "signin",
    __name__,
    url_prefix="/api/v1/auth",
    description="Browser sign-in to the admin UI with an identity provider",
)
blp.after_request(security_headers)

PROVIDER_PARAMETER = {
    "in": "path",
    "name": "provider",
    "required": True,
    "schema": {"type": "string", "pattern": PROVIDER_NAME_RE.pattern.join("^$")},
}
NEXT_PARAMETER = {
    "in": "query",
    "name": "next",
    "required": False,
    "description": "the UI page (a path under /ui/) to land on once signed in",
    "schema": {"type": "string"},
}


# What either route answers when the sign-in does not happen: a page for the person, not JSON.
PAGE = {"type": "string", "description": "an HTML page that says why"}


def _pages(*statuses):
    """Document the HTML pages a route answers with these statuses."""

    def decorator(view):
        for status in statuses:
            view = blp.alt_response(status, schema=PAGE, content_type="text/html")(view)
        return view

    return decorator


def _redirect_uri(provider):
    """Where the provider sends the browser back: the public URL's (or this request's) callback."""
    return f"{public_url().rstrip('/')}{SIGN_IN_CALLBACK_PATH}{provider}"


def _refused(error):
    """The page saying why the sign-in did not happen, with the error's status."""
    if isinstance(error, ProviderUnavailable):
        title = "Identity provider unreachable"
    elif error.http_status == 403:
        title = "No access to fleetd"
    elif isinstance(error, SignInError):
        title = "The provider did not sign you in"
    else:
        title = "Sign-in failed"
    page = render_template(
        "sign_in_refused.html",
        principal=None,
        title=title,
        status=error.http_status,
        code=error.code,
        message=error.message,
    )
    return make_response(page, error.http_status)


@blp.route("/login/<string:provider>", parameters=[PROVIDER_PARAMETER, NEXT_PARAMETER])
class BrowserSignIn(MethodView):
    @blp.doc(security=[])
    @blp.response(302, description="to the provider's authorization endpoint")
    @_pages(400, 503)
    def get(self, provider):
        """Send the browser to the provider to sign in to the admin UI (the authorization code flow
        with PKCE, S256); the provider sends it back to GET /api/v1/auth/callback/{provider}."""
        rt = current_runtime()
        held = request.cookies.get(BROWSER_COOKIE, "")
        binding = held if 32 <= len(held) <= 128 else secrets.token_urlsafe(32)
        try:
            url = browser.start(
                rt,
                rt.clock.now(),
                provider,
                _redirect_uri(provider),
                binding,
                safe_next(request.args.get("next")),
            )
        except FleetdError as exc:
            return _refused(exc)
        response = redirect(url, 302)
        response.set_cookie(
            BROWSER_COOKIE,
            binding,
            max_age=browser.ATTEMPT_SECONDS,
            path=BROWSER_COOKIE_PATH,
            secure=request_is_https(),
            httponly=True,
            samesite="Lax",
        )
        return response


@blp.route("/callback/<string:provider>", parameters=[PROVIDER_PARAMETER])
class BrowserSignInCallback(MethodView):
    @blp.doc(security=[])
    @blp.response(302, description="signed in: to the admin UI")
    @_pages(400, 401, 403, 409, 429, 503)
    def get(self, provider):
        """Where the provider sends the browser back (`code` and `state`, or `error`): signs it in
        to the admin UI as the person the ID token names, with the role the binding rules give.
        Otherwise an HTML page saying why: 400 for an unknown, replayed or expired `state` or a
        refused sign-in, 401 for an ID token that does not verify, 403 when no binding rule gives
        the person access, 503 when the provider is unreachable."""
        rt = current_runtime()
        now = rt.clock.now()
        try:
            try:
                made, target = browser.finish(
                    rt, now, provider, request.cookies.get(BROWSER_COOKIE), request.args
                )
            except Unauthorized:
                rt.limiter.fail(request_address(), rt.clock.monotonic())
                raise
            sign_in(resolve_token(made["token"], now), now)
            response = redirect(target or url_for("ui.login"), 302)
        except FleetdError as exc:
            response = _refused(exc)
        response.delete_cookie(BROWSER_COOKIE, path=BROWSER_COOKIE_PATH)
        return response
