"""The UI's sign-in state: the secret key, the session cookie, CSRF tokens and role checks.

The session cookie (signed, not encrypted) holds only a random session id, recorded
server-side as a hash, and a CSRF token; the API token itself never leaves the sign-in
request. A session acts as an API token or as a user's session that a sign-in with an
identity provider made (fleetd.ui.sso). Every request loads the session's row and its
token's or user's session's row again, so signing out, a revoked or expired token, an ended
session or a deactivated user ends the session at once.
"""

import datetime as dt
import functools
import hmac
import logging
import os
import secrets

from flask import g, request, session
from flask.sessions import SecureCookieSessionInterface
from itsdangerous import URLSafeTimedSerializer

from fleetd.auth import resolve_api_token_id, resolve_session_id
from fleetd.errors import Forbidden, InvalidRequest, ProviderUnavailable, SignInError, Unauthorized
from fleetd.services.identity import signin
from fleetd.services.identity.tokens import end_ui_session, start_ui_session, ui_session_of

log = logging.getLogger(__name__)

SECRET_FILE = "ui-secret"
SESSION_LIFETIME = dt.timedelta(hours=12)
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
SIGN_IN_CALLBACK_PATH = "/api/v1/auth/callback/"  # where a provider sends the browser back


class SignInRequired(Exception):
    """No valid session: the browser is sent to the sign-in page."""


def load_secret_key(data_dir):
    """The key that signs UI session cookies: data_dir/ui-secret (mode 0600), created on first
    use."""
    path = os.path.join(data_dir, SECRET_FILE)
    try:
        with open(path, "rb") as fh:
            key = fh.read().strip()
        if len(key) >= 32:
            return key
        raise OSError(f"{path} holds fewer than 32 bytes")
    except FileNotFoundError:
        pass
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    key = secrets.token_hex(32).encode("ascii")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it first: use theirs
        with open(path, "rb") as fh:
            return fh.read().strip()
    with os.fdopen(fd, "wb") as fh:
        fh.write(key + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    return key


def secret_key_for(data_dir):
    """load_secret_key, or a per-process key (sessions then end at restart) when the data dir is
    unwritable."""
    try:
        return load_secret_key(data_dir)
    except OSError as exc:
        log.warning(
            "admin UI: cannot keep a session key in %s (%s); sign-ins last until fleetd restarts",
            data_dir,
            exc,
        )
        return secrets.token_hex(32).encode("ascii")


class UiSessionInterface(SecureCookieSessionInterface):
    """Flask's signed cookie session, Secure whenever the browser reached us over HTTPS.

    Only the UI has a session: the cookie's path is /ui, so no other request can carry one, and
    they get Flask's null session without the signing machinery (most requests are the API's).
    The provider's redirect back after a browser sign-in (fleetd.ui.sso) gets a fresh one: the
    browser sends it no cookie, and it sets the UI's.
    The signer is made once per secret key rather than per request.
    """

    _signer: tuple[str | bytes | None, URLSafeTimedSerializer | None] = (
        None,
        None,
    )  # (secret key, serializer)

    def open_session(self, app, request):
        if not request.path.startswith((app.config["SESSION_COOKIE_PATH"], SIGN_IN_CALLBACK_PATH)):
            return None  # Flask makes it a null session
        return super().open_session(app, request)

    def get_signing_serializer(self, app):
        key, serializer = self._signer
        if key is not app.secret_key or serializer is None:
            serializer = super().get_signing_serializer(app)
            self._signer = (app.secret_key, serializer)
        return serializer

    def get_cookie_secure(self, app):
        return request_is_https()


def request_is_https():
    """Whether the browser reached us over HTTPS: its cookies are then Secure. X-Forwarded-Proto
    only ever makes a cookie stricter, so trusting it is harmless."""
    return request.is_secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def configure_session(app, data_dir):
    """Secret key and cookie settings for the UI's session."""
    app.secret_key = secret_key_for(data_dir)
    app.session_interface = UiSessionInterface()
    app.config.update(
        SESSION_COOKIE_NAME="fleetd_ui",
        SESSION_COOKIE_PATH="/ui",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME,
    )


def csrf_token():
    """This session's CSRF token, made on first use."""
    token = session.get("csrf")
    if not token:
        token = session["csrf"] = secrets.token_urlsafe(32)
    return token


def check_csrf():
    """Refuse a state-changing request whose CSRF token does not match the session's."""
    expected = session.get("csrf")
    sent = request.form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER) or ""
    if not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise InvalidRequest(
            "the form expired or did not come from this site; reload the page and try again"
        )


def sign_in(principal, now):
    """Start a session for an API token's principal, or a user's session a sign-in with an
    identity provider made (recorded server-side; a fresh CSRF token too)."""
    if principal.kind == "api":
        sid = start_ui_session(now, SESSION_LIFETIME, token_id=principal.id)
    elif principal.kind == "session":
        sid = start_ui_session(now, SESSION_LIFETIME, auth_session_id=principal.id)
    else:
        raise InvalidRequest("sign in with an API token (fla_...), not a node or join token")
    session.clear()
    session.permanent = True
    session["sid"] = sid
    session["csrf"] = secrets.token_urlsafe(32)


def sign_out(now, principal):
    """End the session on the server, so that a copy of the cookie signs no one in either; a
    user's session (a sign-in with a provider) ends with it, its refresh token too."""
    session_id = session.get("sid")
    if isinstance(session_id, str):
        end_ui_session(session_id)
    session.clear()
    if principal is not None and principal.kind == "session":
        signin.logout(now, principal)


def session_principal(rt, now):
    """The principal the session acts as: its API token's, or its user's session's (renewed
    through the provider when its hour is up); None when the session ended, or what it acts as is
    gone, revoked, expired, deactivated or no longer bound to a role."""
    session_id = session.get("sid")
    if not session_id or not isinstance(session_id, str) or len(session_id) > 128:
        return None
    held = ui_session_of(now, session_id)
    if held is None:
        return None
    token_id, auth_session_id = held
    try:
        if token_id is not None:
            return resolve_api_token_id(token_id, now)
        return _user_session_principal(rt, now, auth_session_id)
    except Unauthorized:
        return None


def _user_session_principal(rt, now, auth_session_id):
    try:
        return resolve_session_id(auth_session_id, now)
    except Unauthorized:
        pass  # expired (or ended: then renew refuses at once, without asking the provider)
    try:
        signin.renew(rt, now, auth_session_id)
    except (Unauthorized, Forbidden, SignInError):
        pass  # another request of this browser may have renewed it meanwhile: looked up below
    except ProviderUnavailable as exc:
        log.warning("admin UI: a user's session cannot be renewed: %s", exc.message)
        return None
    return resolve_session_id(auth_session_id, now)


def safe_next(target):
    """Only a path inside the UI: never an open redirect to another site."""
    if target and target.startswith("/ui/") and not target.startswith("//") and "\\" not in target:
        return target
    return None


def ui_require(roles):
    """Allow a UI view only to signed-in principals whose role is in `roles` (the API's roles for
    it)."""
    roles = frozenset(roles)

    def decorator(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            principal = g.get("ui_principal")
            if principal is None:
                raise SignInRequired()
            if principal.role not in roles:
                raise Forbidden(
                    f"your token's role ({principal.role}) may not open this page or do this"
                )
            return view(*args, **kwargs)

        vars(wrapper)["required_roles"] = roles  # fleetd/ui/roles.py reads it
        return wrapper

    return decorator
