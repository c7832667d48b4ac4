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
    session,
    tokens,
    usage,
    webhooks,
)
from fleetd.ui.security import configure_session

ENDPOINT_PREFIX = "ui."


def init_ui(app, settings):
    """Mount the UI on an app: its blueprint, and the signed session cookie it signs in with."""
    configure_session(app, settings.data_dir)
    app.register_blueprint(bp)


def is_ui_endpoint(endpoint):
    """Whether a request goes to the UI, which authenticates with its session, not a bearer
    token."""
    return endpoint is not None and endpoint.startswith(ENDPOINT_PREFIX)
