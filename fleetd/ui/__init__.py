"""The admin web UI at /ui/: server-rendered pages over the same services as the REST API."""

from fleetd.ui.blueprint import bp
from fleetd.ui.pages import (  # noqa: F401 - register routes
    admin,
    deploy,
    fleets,
    instances,
    jobs,
    nodes,
    overview,
    profile,
    projects,
    session,
    sign_in,
    tokens,
    usage,
    users,
    webhooks,
)
from fleetd.ui.security import configure_session
from fleetd.ui.sso import blp as sso_blp

ENDPOINT_PREFIX = "ui."


def init_ui(app, api, settings):
    """Mount the UI on an app: its blueprint, the signed session cookie it signs in with, and the
    API routes a browser signs in through with an identity provider (on `api`, the app's Api)."""
    configure_session(app, settings.data_dir)
    app.register_blueprint(bp)
    api.register_blueprint(sso_blp)


def is_ui_endpoint(endpoint):
    """Whether a request goes to the UI, which authenticates with its session, not a bearer
    token."""
    return endpoint is not None and endpoint.startswith(ENDPOINT_PREFIX)
