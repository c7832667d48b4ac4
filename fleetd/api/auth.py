"""Sign-in: identity providers, binding rules, device sign-in, sessions."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, current_principal, require
from fleetd.errors import InvalidRequest, Unauthorized
from fleetd.runtime import current_runtime, request_address
from fleetd.schemas.auth import (
    BindingSchema,
    DeviceStartedSchema,
    DeviceStartSchema,
    DeviceTokenSchema,
    LoginSchema,
    ProviderListSchema,
    ProviderPutSchema,
    ProviderSchema,
    RefreshSchema,
    SessionSchema,
)
from fleetd.services.identity import oidc, signin

blp = Blueprint(
    "auth", __name__, url_prefix="/api/v1/auth", description="Sign-in with an identity provider"
)
SIGNED_IN = ("admin", "operator", "member", "submitter", "viewer")


def _counted(call):
    """Run a sign-in step; a refused credential counts toward the failed-authentication limit."""
    rt = current_runtime()
    try:
        return call()
    except Unauthorized:
        rt.limiter.fail(request_address(), rt.clock.monotonic())
        raise


@blp.route("/providers")
class Providers(MethodView):
    @require(ADMIN)
    @blp.response(200, ProviderListSchema)
    def get(self):
        """The configured identity providers (never a client secret)."""
        return {"items": oidc.list_providers()}


NAME_PARAMETER = {
    "in": "path",
    "name": "name",
    "required": True,
    "schema": {"type": "string", "pattern": oidc.PROVIDER_NAME_RE.pattern.join("^$")},
}


@blp.route("/providers/<string:name>", parameters=[NAME_PARAMETER])
class ProviderByName(MethodView):
    @require(ADMIN)
    @blp.response(200, ProviderSchema)
    def get(self, name):
        """One identity provider."""
        return oidc.get_provider(name)

    @require(ADMIN)
    @blp.arguments(ProviderPutSchema())
    @blp.response(200, ProviderSchema)
    def put(self, body, name):
        """Create or replace an identity provider: `oidc` (users sign in with it) or `jwt` (its
        tokens are bearers, e.g. a CI system's workload identity)."""
        if not oidc.PROVIDER_NAME_RE.fullmatch(name):
            raise InvalidRequest("a provider name: a-z, 0-9 and -, a letter first, at most 64")
        rt = current_runtime()
        return oidc.put_provider(rt, rt.clock.now(), name, body)

    @require(ADMIN)
    @blp.response(204)
    def delete(self, name):
        """Remove an identity provider; its users' sessions end at their next refresh."""
        rt = current_runtime()
        oidc.delete_provider(rt, rt.clock.now(), name)


@blp.route("/bindings")
class Bindings(MethodView):
    @require(ADMIN)
    @blp.response(200, BindingSchema(many=True))
    def get(self):
        """The binding rules, in order."""
        return signin.get_bindings()

    @require(ADMIN)
    @blp.arguments(BindingSchema(many=True))
    @blp.response(200, BindingSchema(many=True))
    def put(self, rules):
        """Replace the binding rules: claims to role, team and projects, applied at every sign-in
        and refresh."""
        if len(rules) > 1000:
            raise InvalidRequest("at most 1000 binding rules")
        return signin.put_bindings(current_runtime().clock.now(), rules)


@blp.route("/device")
class AuthDevice(MethodView):
    @blp.doc(security=[])
    @blp.arguments(DeviceStartSchema())
    @blp.response(200, DeviceStartedSchema)
    def post(self, body):
        """Start a device sign-in (RFC 8628) with a provider: show the user `verification_uri` and
        `user_code`, then ask POST /api/v1/auth/device/token every `interval` seconds."""
        return {
            "provider": body["provider"],
            **oidc.start_device(current_runtime(), body["provider"]),
        }


@blp.route("/device/token")
class AuthDeviceToken(MethodView):
    @blp.doc(security=[])
    @blp.arguments(DeviceTokenSchema())
    @blp.response(200, SessionSchema)
    def post(self, body):
        """The session once the user approved the device sign-in: 428 authorization_pending until
        then (429 slow_down when asked too often), 400 expired_token or access_denied."""
        rt = current_runtime()
        name = body["provider"] or _only_provider()
        provider, (claims, upstream) = _counted(
            lambda: oidc.poll_device(rt, name, body["device_code"])
        )
        return _counted(lambda: signin.sign_in(rt, rt.clock.now(), provider, claims, upstream))


def _only_provider():
    names = oidc.sign_in_provider_names()
    if len(names) != 1:
        raise InvalidRequest(
            "name the `provider` the sign-in started with",
            {"fields": {"json": {"provider": [f"one of {', '.join(names) or '(none)'}"]}}},
        )
    return names[0]


@blp.route("/login")
class AuthLogin(MethodView):
    @blp.doc(security=[])
    @blp.arguments(LoginSchema())
    @blp.response(200, SessionSchema)
    def post(self, body):
        """Exchange an ID token the client got from the provider (for fleetd's client id) for a
        fleetd session."""
        rt = current_runtime()
        provider, claims = _counted(
            lambda: oidc.login_with_token(rt, body["provider"], body["id_token"])
        )
        return _counted(lambda: signin.sign_in(rt, rt.clock.now(), provider, claims))


@blp.route("/refresh")
class AuthRefresh(MethodView):
    @blp.doc(security=[])
    @blp.arguments(RefreshSchema())
    @blp.response(200, SessionSchema)
    def post(self, body):
        """A new session token (and refresh token) for a refresh token; the provider is asked again
        and the binding rules applied to what it says now."""
        rt = current_runtime()
        return _counted(lambda: signin.refresh(rt, rt.clock.now(), body["refresh_token"]))


@blp.route("/logout")
class AuthLogout(MethodView):
    @require(*SIGNED_IN)
    @blp.response(204)
    def post(self):
        """End this session; its refresh token stops working too."""
        signin.logout(current_runtime().clock.now(), current_principal())
