"""Browser sign-in with an identity provider: the authorization code flow with PKCE (RFC 7636,
method S256) and a nonce, for the admin UI.

`start` records the attempt (the hash of its `state`, its nonce and PKCE verifier, the hash of the
cookie that binds it to the browser, where to go afterwards) and gives the URL of the provider's
authorization endpoint; `finish` takes the attempt back exactly once (a replayed callback finds
none), exchanges the code at the provider with the verifier, checks the ID token (signature,
issuer, audience, expiry and its nonce) and signs the user in through the binding rules. The
provider is only ever called outside a database transaction."""

import datetime as dt
import hashlib
import hmac
import secrets
import urllib.parse

from fleetd.credentials import hash_token
from fleetd.db import write_transaction
from fleetd.errors import InvalidRequest, ProviderUnavailable, SignInError
from fleetd.models import SignInAttempt
from fleetd.services.identity import signin
from fleetd.services.identity.oidc import (
    DEFAULT_SCOPES,
    b64encode,
    exchange_code,
    sign_in_provider,
)

ATTEMPT_SECONDS = 600  # how long the person has at the provider's pages
MAX_PARAMETER = 4096  # the longest code or state taken from the provider's redirect


def pkce_challenge(verifier):
    """The S256 code challenge of a PKCE code verifier (RFC 7636, section 4.2)."""
    return b64encode(hashlib.sha256(verifier.encode("ascii")).digest())


def start(rt, now, name, redirect_uri, browser, next_path=None):
    """The provider's authorization URL for a new sign-in by the browser that holds the secret
    `browser` (its binding cookie); the provider sends the browser back to `redirect_uri`."""
    provider = sign_in_provider(name)
    endpoint = rt.oidc.discovery(provider).get("authorization_endpoint")
    if not endpoint:
        raise ProviderUnavailable(f"provider {name} publishes no authorization_endpoint")
    state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    verifier = secrets.token_urlsafe(64)  # 86 characters: RFC 7636 asks for 43 to 128
    with write_transaction():
        SignInAttempt.delete().where(SignInAttempt.expires_at <= now).execute()
        SignInAttempt.create(
            id=hash_token(state),
            provider=name,
            nonce=nonce,
            code_verifier=verifier,
            browser_hash=hash_token(browser),
            redirect_uri=redirect_uri,
            next_path=next_path,
            created_at=now,
            expires_at=now + dt.timedelta(seconds=ATTEMPT_SECONDS),
        )
    query = urllib.parse.urlencode(
        {
            "response_type": "code",
            "client_id": provider.client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(provider.scopes or DEFAULT_SCOPES),
            "state": state,
            "nonce": nonce,
            "code_challenge": pkce_challenge(verifier),
            "code_challenge_method": "S256",
        }
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


def _take(now, state, browser):
    """The attempt `state` names, deleted so that no second callback finds it; InvalidRequest
    when there is none, it expired, or another browser started it."""
    row = None
    if state and len(state) <= MAX_PARAMETER:
        with write_transaction():
            row = SignInAttempt.get_or_none_by_id(hash_token(state))
            if row is not None:
                SignInAttempt.delete().where(SignInAttempt.id == row.id).execute()
    if (
        row is None
        or row.expires_at <= now
        or not browser
        or not hmac.compare_digest(hash_token(browser), row.browser_hash)
    ):
        raise InvalidRequest(
            "this sign-in is not one this browser started, or it was used or expired already "
            "(the `state` the provider sent back matches none under way); sign in again"
        )
    return row


def finish(rt, now, name, browser, params):
    """(the new session, the UI path to go to) for the provider's redirect back with `params`
    (its query: code and state, or error). InvalidRequest for an unknown, replayed or expired
    state; SignInError when the provider did not sign the person in or refused the code;
    Unauthorized for an ID token that does not verify (its nonce among its claims); Forbidden when
    no binding rule gives the person access; ProviderUnavailable when the provider is down."""
    attempt = _take(now, params.get("state"), browser)
    if attempt.provider != name:
        raise InvalidRequest(f"this sign-in was started with provider {attempt.provider}")
    if params.get("error"):
        raise SignInError(
            "access_denied",
            f"provider {name} did not sign you in: "
            f"{(params.get('error_description') or params['error'])[:300]}",
        )
    code = params.get("code")
    if not code or len(code) > MAX_PARAMETER:
        raise InvalidRequest(f"provider {name} sent the browser back without a code")
    provider = sign_in_provider(name)
    claims, upstream = exchange_code(
        rt, provider, code, attempt.redirect_uri, attempt.code_verifier, attempt.nonce
    )
    return signin.sign_in(rt, now, provider, claims, upstream), attempt.next_path
