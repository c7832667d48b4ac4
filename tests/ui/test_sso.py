"""Signing in to the admin UI with an identity provider, in Debian's headless Chromium against a
real `fleetd serve` and a real OpenID provider (panva's oidc-provider): the person clicks "Sign in
with lab", signs in at the provider's own login page and lands in the UI as its user; a person no
rule binds sees a page saying it has no access; a tampered `state` gets a 400 page; signing out
ends the user's session."""

import sqlite3

import pytest

from tests.support.browser import BROWSER_MARKS, artifacts_dir, checked_page, shot
from tests.support.http import Http
from tests.support.oidc_provider import LAB_ACCOUNTS, OidcProvider, free_port
from tests.support.server import FleetdProcess

pytestmark = BROWSER_MARKS


@pytest.fixture
def port():
    """fleetd's port, chosen first: the provider must know fleetd's callback before it starts."""
    return free_port()


@pytest.fixture
def provider(tmp_path, port):
    started = OidcProvider(
        tmp_path, LAB_ACCOUNTS, [f"http://127.0.0.1:{port}/api/v1/auth/callback/lab"]
    ).start()
    yield started
    started.kill()


@pytest.fixture
def server(data_dir, admin, port, provider):  # noqa: F811 - overrides tests/support/server.py's
    proc = FleetdProcess(data_dir, bind=f"127.0.0.1:{port}").start()
    http = Http(proc.url, admin)
    for method, path, body in provider.lab_requests():
        assert http(method, path, json=body).status_code in (200, 201)
    yield proc
    proc.kill()


@pytest.fixture
def page(browser, server, request, tmp_path):
    with checked_page(browser, server.url, artifacts_dir(request.node.name, tmp_path)) as tab:
        yield tab


def auth_sessions(data_dir, login):
    """(id, ended_at) of the user's sessions, read from fleetd's database."""
    with sqlite3.connect(data_dir / "fleetd.db") as db:
        return db.execute(
            "SELECT s.id, s.ended_at FROM auth_session s JOIN user u ON u.id = s.user_id"
            " WHERE u.login = ?",
            (login,),
        ).fetchall()


def sign_in_at_provider(page, login):
    """From fleetd's sign-in page: the button, then the provider's login form (and its consent
    page, where it shows one)."""
    page.goto("/ui/login")
    shot(page, "sign-in-page")
    page.get_by_role("link", name="Sign in with lab").click()
    page.wait_for_selector("input[name=login]")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any")
    page.get_by_role("button", name="Sign-in").click()
    page.wait_for_load_state()
    if page.get_by_role("button", name="Continue").count():
        page.get_by_role("button", name="Continue").click()
        page.wait_for_load_state()


def test_a_person_signs_in_with_the_provider_and_out_again(page, server, data_dir):
    sign_in_at_provider(page, "alice")
    page.wait_for_selector("#user-login")
    assert page.url.startswith(server.url + "/ui/")
    assert page.inner_text("#user-login") == "alice"
    assert page.inner_text("#user-name") == "Alice Liddell"
    assert page.inner_text("#user-role") == "member"
    shot(page, "signed-in-with-lab")
    ((session_id, ended),) = auth_sessions(data_dir, "alice")
    assert ended is None

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_selector("#token")  # the sign-in page again
    assert auth_sessions(data_dir, "alice")[0] == (
        session_id,
        auth_sessions(data_dir, "alice")[0][1],
    )
    assert auth_sessions(data_dir, "alice")[0][1] is not None  # the user's session ended
    page.goto("/ui/jobs")
    assert "/ui/login" in page.url


def test_a_person_no_rule_binds_sees_that_it_has_no_access(page, data_dir):
    sign_in_at_provider(page, "bob")
    page.wait_for_selector("#sign-in-refused")
    assert page.inner_text("h1") == "No access to fleetd"
    assert "no binding rule gives bob access" in page.inner_text("#error-message")
    shot(page, "no-access")
    assert auth_sessions(data_dir, "bob") == []
    page.goto("/ui/jobs")
    assert "/ui/login" in page.url


def test_a_tampered_state_gets_a_400_page_and_no_session(page, server, data_dir):
    page.goto("/ui/login")
    page.get_by_role("link", name="Sign in with lab").click()
    page.wait_for_selector("input[name=login]")  # at the provider, the sign-in under way
    answer = page.goto("/api/v1/auth/callback/lab?code=stolen&state=tampered")
    assert answer is not None and answer.status == 400
    assert page.inner_text("h1") == "Sign-in failed"
    assert "matches none under way" in page.inner_text("#error-message")
    assert auth_sessions(data_dir, "alice") == []
