"""A browser's sign-in to the admin UI with a real OpenID provider (panva's oidc-provider): the
authorization code flow with PKCE through GET /api/v1/auth/login/{provider} and the callback,
driven over HTTP with Flask's test client as the browser. A tampered, replayed or foreign `state`,
an ID token with another nonce, a person no rule binds and a provider that is down each get a page
saying so and no session."""

import base64
import datetime as dt
import hashlib
import urllib.parse

import pytest

from fleetd.credentials import hash_token
from fleetd.db import database
from fleetd.models import AuthSession, SignInAttempt, UiSession, User
from fleetd.services.identity.browser import pkce_challenge
from tests.conftest import admin_client
from tests.support.http import UiClient
from tests.support.oidc_provider import (  # noqa: F401 - lab_provider: a fixture
    LAB_ACCOUNTS,
    OidcProvider,
    authorize,
    lab_provider,
)
from tests.support.oidc_provider import TEST_CLIENT_CALLBACK as CALLBACK


@pytest.fixture
def admin(app, clock, provider):
    return provider.configure_lab(admin_client(app, clock))


def start(browser, next_path="/ui/jobs"):
    """The browser asks fleetd to sign in with `lab`: (the redirect, its query parameters)."""
    resp = browser.get(f"/api/v1/auth/login/lab?next={urllib.parse.quote(next_path)}")
    assert resp.status_code == 302, resp.get_data(as_text=True)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(resp.headers["Location"]).query)
    return resp, {k: v[0] for k, v in query.items()}


def callback_path(url):
    """The path and query of the provider's redirect back, for Flask's test client."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.path}?{parts.query}"


def sign_in_at_provider(browser, login):
    """start, then the person signs in at the provider: the callback's path and query."""
    resp, _ = start(browser)
    return callback_path(authorize(resp.headers["Location"], login, CALLBACK))


def rows(model):
    with database.connection_context():
        return list(model.select())


def test_the_redirect_carries_pkce_s256_a_state_and_a_nonce_kept_for_this_browser(admin, provider):
    browser = UiClient(admin.app)
    resp, query = start(browser)
    assert resp.headers["Location"].startswith(f"{provider.issuer}/")
    assert (query["response_type"], query["client_id"], query["redirect_uri"]) == (
        "code",
        "fleetd",
        CALLBACK,
    )
    assert query["code_challenge_method"] == "S256"
    assert set(query["scope"].split()) >= {"openid", "profile", "groups"}
    (attempt,) = rows(SignInAttempt)
    assert attempt.id == hash_token(query["state"]) and attempt.nonce == query["nonce"]
    digest = hashlib.sha256(attempt.code_verifier.encode()).digest()
    assert base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == query["code_challenge"]
    assert len(attempt.code_verifier) >= 43 and attempt.next_path == "/ui/jobs"
    cookie = resp.headers["Set-Cookie"]
    assert "fleetd_signin=" in cookie and "HttpOnly" in cookie and "Path=/api/v1/auth/" in cookie
    # An open redirect is never kept: the landing page is a UI path or none.
    start(browser, "https://evil.example/ui/")
    assert {a.next_path for a in rows(SignInAttempt)} == {"/ui/jobs", None}


def test_the_code_challenge_is_rfc_7636s_s256():
    # RFC 7636, appendix B.
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert pkce_challenge(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_a_browser_signs_in_to_the_ui_as_the_user_and_signing_out_ends_the_session(admin, provider):
    browser = UiClient(admin.app)
    back = browser.get(sign_in_at_provider(browser, "alice"))
    assert back.status_code == 302 and back.headers["Location"].endswith("/ui/jobs")
    page = browser.text("/ui/jobs")
    assert 'id="user-login">alice<' in page and "Alice Liddell" in page
    assert 'id="user-role">member<' in page
    (session,) = rows(AuthSession)
    (ui,) = rows(UiSession)
    assert (ui.auth_session_id, ui.token_id) == (session.id, None) and session.ended_at is None
    assert rows(SignInAttempt) == []  # used up

    assert browser.post("/ui/logout").status_code == 302
    (session,) = rows(AuthSession)
    assert session.ended_at is not None and rows(UiSession) == []
    assert browser.get("/ui/jobs").status_code == 302  # to the sign-in page


def test_the_ui_session_ends_with_the_user_and_renews_through_the_provider(admin, provider, clock):
    browser = UiClient(admin.app)
    browser.get(sign_in_at_provider(browser, "alice"))
    (first,) = rows(AuthSession)
    # The user session's hour is up: the UI renews it through the provider, which still binds it.
    clock._now += dt.timedelta(hours=2)
    assert 'id="user-login">alice<' in browser.text("/ui/jobs")
    (renewed,) = rows(AuthSession)
    assert renewed.expires_at > first.expires_at and renewed.ended_at is None
    # Deactivated by an admin: signed out of the UI at its next request.
    assert admin.patch("/api/v1/users/alice", {"active": False}).status_code == 200
    assert browser.get("/ui/jobs").status_code == 302


def test_a_tampered_replayed_or_foreign_state_gets_400_and_no_session(admin, provider):
    browser = UiClient(admin.app)
    back = sign_in_at_provider(browser, "alice")
    path, _, query = back.partition("?")
    params = urllib.parse.parse_qs(query)
    tampered = urllib.parse.urlencode({**{k: v[0] for k, v in params.items()}, "state": "x" * 43})
    resp = browser.get(f"{path}?{tampered}")
    assert resp.status_code == 400 and "Sign-in failed" in resp.get_data(as_text=True)
    assert "matches none under way" in resp.get_data(as_text=True)
    assert rows(AuthSession) == []
    # Another browser (without this one's cookie) cannot complete this browser's sign-in.
    stranger = UiClient(admin.app)
    assert stranger.get(back).status_code == 400
    assert rows(AuthSession) == [] and "alice" not in {u.login for u in rows(User)}
    # The attempt was used by the foreign callback: a second use is refused too.
    assert browser.get(back).status_code == 400

    back = sign_in_at_provider(browser, "alice")
    assert browser.get(back).status_code == 302
    replayed = browser.get(back)
    assert replayed.status_code == 400 and len(rows(AuthSession)) == 1


def test_an_id_token_with_another_nonce_gets_401_and_no_session(admin, provider):
    browser = UiClient(admin.app)
    back = sign_in_at_provider(browser, "alice")
    # What the provider signed names the nonce this attempt sent; fleetd now expects another.
    with database.connection_context():
        SignInAttempt.update(nonce="another-nonce").execute()
    resp = browser.get(back)
    assert resp.status_code == 401 and "nonce" in resp.get_data(as_text=True)
    assert rows(AuthSession) == [] and rows(UiSession) == []


def test_a_person_no_rule_binds_sees_a_no_access_page_and_gets_nothing(admin, provider):
    browser = UiClient(admin.app)
    resp = browser.get(sign_in_at_provider(browser, "bob"))
    text = resp.get_data(as_text=True)
    assert resp.status_code == 403 and "No access to fleetd" in text
    assert "no binding rule gives bob access" in text
    assert rows(AuthSession) == [] and rows(UiSession) == []
    assert admin.get("/api/v1/users/bob").status_code == 404
    assert browser.get("/ui/jobs").status_code == 302


def test_a_refused_sign_in_or_a_provider_that_is_down_gets_a_page_saying_so(admin, provider):
    browser = UiClient(admin.app)
    _, query = start(browser)
    resp = browser.get(
        f"/api/v1/auth/callback/lab?error=access_denied&error_description=no&state={query['state']}"
    )
    assert resp.status_code == 400 and "did not sign you in" in resp.get_data(as_text=True)

    back = sign_in_at_provider(browser, "alice")
    provider.kill()
    resp = browser.get(back)
    assert resp.status_code == 503 and "unreachable" in resp.get_data(as_text=True)
    assert rows(AuthSession) == []
    assert browser.get("/api/v1/auth/login/nobody").status_code == 400


def test_a_provider_that_takes_the_client_secret_in_the_body_signs_in_too(app, clock, tmp_path):
    # Its discovery lists client_secret_post alone: fleetd sends the secret in the form.
    posting = OidcProvider(tmp_path, LAB_ACCOUNTS, client_auth="client_secret_post").start()
    try:
        posting.configure_lab(admin_client(app, clock))
        browser = UiClient(app)
        back = browser.get(sign_in_at_provider(browser, "alice"))
        assert back.status_code == 302, back.get_data(as_text=True)
        assert 'id="user-login">alice<' in browser.text("/ui/jobs")
    finally:
        posting.kill()
