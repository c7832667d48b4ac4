"""The first minutes with a running fleetd: `/` leads to the admin UI, and `fleetd serve` says where
it is."""

import pytest
import requests


def test_the_root_redirects_to_the_admin_ui_without_a_token(api):
    resp = api.get("/", token=None)
    assert resp.status_code == 302
    assert resp.headers["Location"].endswith("/ui/")
    ui = api.get(resp.headers["Location"], token=None)
    assert (
        ui.status_code in (200, 302) and not ui.is_json
    )  # the UI (or its sign-in), not a JSON error


@pytest.mark.integration
def test_serve_prints_the_admin_ui_url_and_serves_the_redirect(server):
    assert f"admin UI at {server.url}/ui/" in server.log
    resp = requests.get(server.url + "/", allow_redirects=False, timeout=10)
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/ui/")
