"""The application factory: settings, database, API, authentication, error handling."""

import base64
import logging
import time

from flask import Flask, g, redirect, request, url_for
from flask_smorest import Api

from fleetd import __version__
from fleetd.api import BLUEPRINTS, docs, graphql, scim
from fleetd.api.agent import PROTOCOL_HEADER, PROTOCOL_VERSION
from fleetd.api.parser import forbidden_text, null_means_null
from fleetd.auth import enter_actor, leave_actors, resolve_token
from fleetd.db import bind, database, hand_back, open_database, request_durable, request_started
from fleetd.errors import FleetdError, InvalidRequest, ProtocolMismatch, Unauthorized, handle_error
from fleetd.runtime import Runtime, current_runtime, request_address
from fleetd.schemas.common import ErrorSchema
from fleetd.settings import Settings
from fleetd.ui import init_ui, is_ui_endpoint

log = logging.getLogger(__name__)

# Endpoints that need no token (docs/api.md, Conventions).
PUBLIC_ENDPOINTS = frozenset(
    {
        "health.Health",
        "api-docs.openapi_json",
        "api-docs-ui.page",
        "api-docs-ui.start",
        "api-docs-ui.assets",
        "root",
        # Sign-in: the credential is in the body (a provider's token, a device or refresh code).
        "auth.AuthDevice",
        "auth.AuthDeviceToken",
        "auth.AuthLogin",
        "auth.AuthRefresh",
        # A job's share link: the token in the path is the credential (services/workloads/shares).
        "shares.SharedJob",
        # Browser sign-in with a provider: the browser holds no token yet (fleetd.ui.sso).
        "signin.BrowserSignIn",
        "signin.BrowserSignInCallback",
    }
)
HEARTBEAT_ENDPOINT = "agent.AgentHeartbeat"
# Endpoints whose callers cannot send a bearer token and present it as HTTP Basic's password
# (Terraform's http state backend).
BASIC_AUTH_ENDPOINTS = frozenset({"fleets.FleetTerraformState"})
# Endpoints whose callers may send the API token as ?api_key= (the GPU-cloud GraphQL API's way);
# server.py keeps its value out of the access log.
API_KEY_ENDPOINTS = frozenset({"graphql.graphql"})


class FleetApi(Api):
    """flask-smorest's Api, with every error rendered as the fleetd envelope."""

    ERROR_SCHEMA = ErrorSchema

    def handle_http_exception(self, error):
        return handle_error(error)


def create_app(
    settings: Settings | None = None,
    clock=None,
    db=None,
    offload=None,
    after_full_read=None,
    pause=None,
) -> Flask:
    """Build the app. Background tasks are registered but only `fleetd serve` starts them
    (`offload`, `after_full_read` and `pause`: see Runtime.build)."""
    settings = settings or Settings.load()
    app = Flask("fleetd")
    app.config.update(
        MAX_CONTENT_LENGTH=settings.max_body_bytes,
        API_TITLE="fleetd",
        API_VERSION=__version__,
        OPENAPI_VERSION="3.0.3",
        OPENAPI_URL_PREFIX="/api",
        OPENAPI_JSON_PATH="openapi.json",
        API_SPEC_OPTIONS={
            "security": [{"bearerAuth": []}],
            "components": {"securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
            "info": {
                "description": "The fleetd REST API, v1. Errors always use the error envelope."
            },
        },
    )
    bind(db or open_database(settings.database_url, settings.sqlite_synchronous))
    app.extensions["fleetd"] = Runtime.build(settings, clock, app, offload, after_full_read, pause)

    api = FleetApi(app)
    api.ma_plugin.converter.add_attribute_function(null_means_null)
    for blueprint in BLUEPRINTS:
        api.register_blueprint(blueprint)
    init_ui(app, api, settings)
    app.register_error_handler(FleetdError, handle_error)
    app.register_error_handler(Exception, handle_error)

    app.register_blueprint(docs.blp)
    app.register_blueprint(graphql.blp)
    app.register_blueprint(scim.blp)
    app.add_url_rule("/", "root", _root)
    app.before_request(request_started)
    app.before_request(_start_timer)
    app.after_request(_observe_latency)
    app.after_request(_durable)
    app.after_request(_no_store)
    app.before_request(_authenticate)
    app.before_request(_check_url)
    app.teardown_request(leave_actors)
    app.teardown_request(_close_db)
    return app


def _root():
    """`/` is the admin UI (a browser pointed at the server's address lands there)."""
    return redirect(url_for("ui.overview"), 302)


def _authenticate():
    """Check the bearer token (or ?api_key= where API_KEY_ENDPOINTS allow), then the agent protocol
    header, of every non-public route."""
    endpoint = request.endpoint
    if endpoint is None or endpoint in PUBLIC_ENDPOINTS or is_ui_endpoint(endpoint):
        return  # the UI signs in with its own session (fleetd.ui.security)
    header = request.headers.get("Authorization", "")
    if not header and endpoint in API_KEY_ENDPOINTS and request.args.get("api_key"):
        header = "Bearer " + request.args["api_key"]
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "basic" and endpoint in BASIC_AUTH_ENDPOINTS:
        token = _basic_password(token)
    elif scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    rt = current_runtime()
    try:
        g.principal = resolve_token(
            token.strip(),
            rt.clock.now(),
            allow_revoked_node=endpoint == HEARTBEAT_ENDPOINT,
            rt=rt,
        )
    except Unauthorized as exc:
        rt.limiter.fail(request_address(), rt.clock.monotonic())  # 429 once over the failure budget
        exc.headers.setdefault("WWW-Authenticate", "Bearer")
        raise
    enter_actor(g.principal)
    if g.principal.kind in ("api", "session", "jwt"):  # node sessions and join tokens are exempt
        rt.rates.take(
            g.principal.id, g.principal.rate, rt.clock.monotonic()
        )  # 429 past the token's rate
    if (
        request.path.startswith("/api/v1/agent/")
        and request.headers.get(PROTOCOL_HEADER) != PROTOCOL_VERSION
    ):
        raise ProtocolMismatch(
            f"this server speaks agent protocol {PROTOCOL_VERSION}; send {PROTOCOL_HEADER}: "
            f"{PROTOCOL_VERSION}",
            {"supported": [PROTOCOL_VERSION]},
        )


def _basic_password(credentials):
    """The password of HTTP Basic credentials ("" when they are not base64 of user:password)."""
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return ""
    return decoded.partition(":")[2]


def _check_url():
    """Refuse a path or query value with a NUL or an unpaired surrogate before any view sees it."""
    values = list((request.view_args or {}).values())
    for key, value in request.args.items(multi=True):
        values += (key, value)
    if any(isinstance(v, str) and forbidden_text(v) for v in values):
        raise InvalidRequest("the path or query holds a NUL character or an unpaired surrogate")


def _durable(response):
    """A response to a request that wrote leaves once its writes are on disk (db.GroupCommit).

    The pooled connection goes back first: the requests that run while this one waits for the
    sync take the same connection, whose page cache only their own writes keep valid, instead
    of each taking another one whose cache the others' writes made stale.
    """
    hand_back()
    request_durable()
    return response


def _no_store(response):
    """API answers are never cached: some carry a secret shown once (new tokens, registrations),
    all of them carry state that a cache would serve stale."""
    response.headers.setdefault("Cache-Control", "no-store")
    return response


def _start_timer():
    g.started = time.perf_counter()


def _observe_latency(response):
    """Request latency by route template (not by URL: ids would explode the label set)."""
    started = g.get("started")
    if started is not None:
        route = request.url_rule.rule if request.url_rule is not None else "unmatched"
        current_runtime().instruments.http_latency.labels(
            request.method, route, str(response.status_code)
        ).observe(time.perf_counter() - started)
    return response


def _close_db(exc):
    if not database.is_closed():
        database.close()
