"""The admin UI through Flask's test client: a browser-like client with cookies and CSRF tokens."""

import re

import pytest

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


class UiClient:
    """A cookie-keeping test client that signs in like a browser and sends the page's CSRF token."""

    def __init__(self, app, base_url="http://localhost"):
        self.http = app.test_client()
        self.base_url = base_url
        self.csrf = None

    def get(self, path, **kw):
        resp = self.http.get(path, base_url=self.base_url, **kw)
        match = CSRF_RE.search(resp.get_data(as_text=True))
        if match:
            self.csrf = match.group(1)
        return resp

    def post(self, path, data=None, csrf=True, **kw):
        data = dict(data or {})
        if csrf:
            data.setdefault("csrf_token", self.csrf)
        resp = self.http.post(path, data=data, base_url=self.base_url, **kw)
        match = CSRF_RE.search(resp.get_data(as_text=True))
        if match:
            self.csrf = match.group(1)
        return resp

    def login(self, token, expect=302):
        self.get("/ui/login")
        resp = self.post("/ui/login", {"token": token})
        assert resp.status_code == expect, resp.get_data(as_text=True)
        return resp

    def text(self, path, expect=200):
        resp = self.get(path)
        assert resp.status_code == expect, resp.get_data(as_text=True)[:2000]
        return resp.get_data(as_text=True)


def enrol(api, fleet="gpu-a", name="gpu-host-1", gpu_count=2):
    """A node that registered and sent its first heartbeat: (node_id, session_token)."""
    if api.get(f"/api/v1/fleets/{fleet}").status_code == 404:
        api.create_fleet(fleet)
    reg = api.register(api.create_join_token(fleet), machine_id=name, hostname=name, gpu_count=gpu_count)
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
    """Sign in a new UI client with a fresh token of this role: signed_in("submitter") -> UiClient."""

    def make(role, name=None):
        client = UiClient(app)
        client.login(api.create_token(role, name=name))
        return client

    return make
