"""The admin UI through Flask's test client: fixtures of the browser-like client with cookies and
CSRF tokens (tests/support/http.py)."""

import pytest

from tests.support.browser import launch
from tests.support.http import CSRF_RE, UiClient  # noqa: F401 - tests import them from here


def enrol(api, fleet="gpu-a", name="gpu-host-1", gpu_count=2):
    """A node that registered and sent its first heartbeat: (node_id, session_token)."""
    if api.get(f"/api/v1/fleets/{fleet}").status_code == 404:
        api.create_fleet(fleet)
    reg = api.register(
        api.create_join_token(fleet), machine_id=name, hostname=name, gpu_count=gpu_count
    )
    api.heartbeat(reg["session_token"])
    return reg["node_id"], reg["session_token"]


@pytest.fixture
def ui(app):
    """A UI client, not signed in."""
    return UiClient(app)


@pytest.fixture
def admin_ui(app, api):
    """A UI client signed in with the first admin token."""
    client = UiClient(app)
    client.login(api.token)
    return client


@pytest.fixture
def signed_in(app, api):
    """Sign in a new UI client with a fresh token of this role: signed_in("submitter") ->
    UiClient."""

    def make(role, name=None):
        client = UiClient(app)
        client.login(api.create_token(role, name=name))
        return client

    return make


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for a browser test module (tests/support/browser.py)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = launch(pw)
        yield chromium
        chromium.close()
