"""Identity providers: OpenID Connect providers users sign in with (the device authorization grant
of RFC 8628 for the CLI, an ID token exchanged for a session for API clients, the authorization
code flow with PKCE for browsers: services.identity.browser), and what fleetd knows of them (their
discovery document and signing keys, cached per process).

An ID token is checked with joserfc against the provider's JWKS: its signature (an asymmetric
algorithm the key allows; never `none` or a shared-secret one), issuer, audience, expiry and issue
time, and a nonce where fleetd sent one. Keys are read once and again only when a token names a
key id fleetd does not hold (a key rotation), at most once a minute per provider."""

import base64
import json
import re
import threading
import time
from typing import Any

import requests
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from fleetd.db import write_transaction
from fleetd.errors import InvalidRequest, NotFound, ProviderUnavailable, SignInError, Unauthorized
from fleetd.models import AuthProvider
from fleetd.services.notify.events import record_event

ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
HTTP_TIMEOUT = 5.0  # seconds for one call to a provider
KEYS_REFRESH_SECONDS = 60.0  # the least time between two reads of one provider's keys
LEEWAY_SECONDS = 60  # clock skew allowed for exp, iat and nbf
DEFAULT_SCOPES = ("openid", "profile", "email", "groups", "offline_access")
DEFAULT_CLAIMS = {
    "login": "preferred_username",
    "display_name": "name",
    "email": "email",
    "groups": "groups",
}
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
PROVIDER_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,63}")


class OidcCache:
    """Discovery documents and key sets of the providers, by name (one per Runtime)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._discovery = {}  # name -> (issuer, document)
        self._keys = {}  # name -> (jwks_url, KeySet, read at: monotonic seconds)

    def forget(self, name):
        with self._lock:
            self._discovery.pop(name, None)
            self._keys.pop(name, None)

    def discovery(self, provider):
        found = self._discovery.get(provider.name)
        if found is not None and found[0] == provider.issuer:
            return found[1]
        document = _get_json(provider.issuer.rstrip("/") + "/.well-known/openid-configuration")
        if document.get("issuer") != provider.issuer:
            raise ProviderUnavailable(
                f"provider {provider.name}'s discovery document names issuer "
                f"{document.get('issuer')!r}, not {provider.issuer!r}"
            )
        with self._lock:
            self._discovery[provider.name] = (provider.issuer, document)
        return document

    def keys(self, provider, kid):
        """The provider's KeySet, read again when it lacks `kid` and was read over a minute ago."""
        url = provider.jwks_url or self.discovery(provider).get("jwks_uri")
        if not url:
            raise ProviderUnavailable(f"provider {provider.name} publishes no jwks_uri")
        found = self._keys.get(provider.name)
        now = time.monotonic()
        if (
            found is not None
            and found[0] == url
            and (_holds(found[1], kid) or now - found[2] < KEYS_REFRESH_SECONDS)
        ):
            return found[1]
        try:
            key_set = KeySet.import_key_set(_get_json(url))
        except (JoseError, ValueError, TypeError) as e:
            raise ProviderUnavailable(
                f"provider {provider.name}'s keys at {url} do not read: {e}"
            ) from e
        with self._lock:
            self._keys[provider.name] = (url, key_set, now)
        return key_set


def _holds(key_set, kid):
    return kid is None or any(k.kid == kid for k in key_set.keys)


def _get_json(url):
    try:
        resp = requests.get(url, timeout=HTTP_TIMEOUT)
        resp.raise_for_status()
        document = resp.json()
    except (requests.RequestException, ValueError) as e:
        raise ProviderUnavailable(f"the identity provider is unreachable ({url}): {e}") from e
    if not isinstance(document, dict):
        raise ProviderUnavailable(f"the identity provider answered {url} with no JSON object")
    return document


# ---------------------------------------------------------------- configuration


def put_provider(rt, now, name, body):
    """Create or replace a provider; a `client_secret` left out keeps the one stored."""
    with write_transaction():
        row = AuthProvider.get_or_none_by_id(name)
        secret = body.get("client_secret", row.client_secret if row is not None else None)
        fields = {
            "kind": body["kind"],
            "issuer": body["issuer"],
            "client_id": body.get("client_id"),
            "client_secret": secret,
            "audience": body.get("audience"),
            "jwks_url": body.get("jwks_url"),
            "scopes": body.get("scopes"),
            "claims": body.get("claims"),
        }
        if fields["kind"] == "oidc" and not fields["client_id"]:
            raise InvalidRequest(
                "an oidc provider needs its client_id",
                {"fields": {"json": {"client_id": ["required for kind oidc"]}}},
            )
        if fields["kind"] == "jwt" and not fields["audience"]:
            raise InvalidRequest(
                "a jwt issuer needs the audience its tokens name for fleetd",
                {"fields": {"json": {"audience": ["required for kind jwt"]}}},
            )
        if row is None:
            row = AuthProvider.create(name=name, created_at=now, **fields)
        else:
            for field, value in fields.items():
                setattr(row, field, value)
            row.save()
        record_event(
            now, "auth.provider", "auth_provider", name, f"provider {name} ({fields['kind']}) set"
        )
    rt.oidc.forget(name)
    return row


def get_provider(name):
    row = AuthProvider.get_or_none_by_id(name)
    if row is None:
        raise NotFound(f"provider {name} not found")
    return row


def list_providers():
    return list(AuthProvider.select().order_by(AuthProvider.name))


def delete_provider(rt, now, name):
    with write_transaction():
        if not AuthProvider.delete().where(AuthProvider.name == name).execute():
            raise NotFound(f"provider {name} not found")
        record_event(now, "auth.provider", "auth_provider", name, f"provider {name} deleted")
    rt.oidc.forget(name)


def sign_in_provider_names():
    """The names of the providers users sign in with (kind `oidc`), in order."""
    query = (
        AuthProvider.select(AuthProvider.name)
        .where(AuthProvider.kind == "oidc")
        .order_by(AuthProvider.name)
    )
    return [row.name for row in query]


def claim_names(provider):
    """The claim each of fleetd's fields is read from (the provider's `claims`, else the
    defaults)."""
    return {**DEFAULT_CLAIMS, **(provider.claims or {})}


def sign_in_provider(name):
    """The `oidc` provider of this name; InvalidRequest when there is none."""
    row = AuthProvider.get_or_none_by_id(name)
    if row is None or row.kind != "oidc":
        raise InvalidRequest(
            f"no sign-in provider {name!r}",
            {"fields": {"json": {"provider": [f"no oidc provider {name!r}"]}}},
        )
    return row


# ---------------------------------------------------------------- ID tokens


def verify_id_token(rt, provider, token, nonce=None, audience=None):
    """The claims of an ID token (or a workload's JWT) this provider signed for fleetd;
    Unauthorized,
    naming what is wrong, otherwise."""
    if not isinstance(token, str) or token.count(".") != 2 or len(token) > 16384:
        raise Unauthorized("not a signed JWT")
    try:
        header = json.loads(b64decode(token.split(".", 1)[0]))
    except ValueError as e:
        raise Unauthorized("the token's header does not read") from e
    if not isinstance(header, dict) or header.get("alg") not in ALGORITHMS:
        raise Unauthorized(
            f"the token's algorithm {header.get('alg') if isinstance(header, dict) else None!r} "
            f"is not accepted (one of {', '.join(ALGORITHMS)})"
        )
    keys = rt.oidc.keys(provider, header.get("kid"))
    try:
        decoded = jwt.decode(token, keys, algorithms=list(ALGORITHMS))
    except JoseError as e:
        raise Unauthorized(
            f"the token's signature does not verify with provider {provider.name}'s keys "
            f"({e.error})"
        ) from e
    expected: dict[str, Any] = {
        "iss": {"essential": True, "value": provider.issuer},
        "aud": {"essential": True, "value": audience or provider.audience or provider.client_id},
        "exp": {"essential": True},
        "sub": {"essential": True},
    }
    if nonce is not None:
        expected["nonce"] = {"essential": True, "value": nonce}
    try:
        jwt.JWTClaimsRegistry(None, LEEWAY_SECONDS, **expected).validate(decoded.claims)
    except JoseError as e:
        raise Unauthorized(f"the token is refused: {e.description or e.error}") from e
    return decoded.claims


def b64decode(segment):
    """A JWT segment's bytes (base64url without its padding)."""
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def b64encode(raw):
    """Bytes as base64url without padding (a JWT segment, a PKCE code challenge)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


# ---------------------------------------------------------------- flows


def _token_call(rt, provider, data):
    """POST to the provider's token endpoint with the client's credentials; its JSON answer."""
    url = rt.oidc.discovery(provider).get("token_endpoint")
    if not url:
        raise ProviderUnavailable(f"provider {provider.name} publishes no token_endpoint")
    return _post(rt, url, provider, data)


def _post(rt, url, provider, data):
    """POST a form to one of the provider's endpoints with the client's credentials as its
    discovery document says it takes them: HTTP Basic (client_secret_basic, the default) unless it
    lists client_secret_post and not basic; a client without a secret sends its client_id alone."""
    auth = None
    if not provider.client_secret:
        data = dict(data, client_id=provider.client_id)
    elif _posts_secret(rt.oidc.discovery(provider)):
        data = dict(data, client_id=provider.client_id, client_secret=provider.client_secret)
    else:
        auth = (provider.client_id, provider.client_secret)
    try:
        resp = requests.post(
            url, data=data, auth=auth, timeout=HTTP_TIMEOUT, headers={"Accept": "application/json"}
        )
        answer = resp.json()
    except (requests.RequestException, ValueError) as e:
        raise ProviderUnavailable(f"provider {provider.name} is unreachable ({url}): {e}") from e
    if not isinstance(answer, dict):
        raise ProviderUnavailable(f"provider {provider.name} answered {url} with no JSON object")
    if resp.status_code >= 400 or "error" in answer:
        answer.setdefault("error", f"http_{resp.status_code}")
    return answer


def _posts_secret(document):
    methods = document.get("token_endpoint_auth_methods_supported") or ()
    return "client_secret_post" in methods and "client_secret_basic" not in methods


def start_device(rt, name):
    """Begin a device sign-in (RFC 8628) at the provider: {device_code, user_code, verification_uri,
    verification_uri_complete?, interval, expires_in}."""
    provider = sign_in_provider(name)
    url = rt.oidc.discovery(provider).get("device_authorization_endpoint")
    if not url:
        raise InvalidRequest(
            f"provider {name} offers no device sign-in (no device_authorization_endpoint)",
            {"fields": {"json": {"provider": ["no device authorization endpoint"]}}},
        )
    answer = _post(rt, url, provider, {"scope": " ".join(provider.scopes or DEFAULT_SCOPES)})
    if "error" in answer:
        raise SignInError(
            "access_denied",
            f"provider {name} refused the device sign-in: "
            f"{answer.get('error_description') or answer['error']}",
        )
    keys = (
        "device_code",
        "user_code",
        "verification_uri",
        "verification_uri_complete",
        "interval",
        "expires_in",
    )
    out = {k: answer.get(k) for k in keys}
    out["interval"] = out["interval"] or 5
    return out


def poll_device(rt, name, device_code):
    """The provider's verified ID token claims and refresh token once the user approved the device
    sign-in; SignInError while it waits (authorization_pending, slow_down) or when it ended."""
    provider = sign_in_provider(name)
    answer = _token_call(rt, provider, {"grant_type": DEVICE_GRANT, "device_code": device_code})
    return provider, _claims_of(rt, provider, answer)


def exchange_refresh(rt, provider, refresh_token):
    """New claims (and refresh token) for a session's provider refresh token; Unauthorized when the
    provider no longer gives them (the user was removed or its grant revoked)."""
    answer = _token_call(
        rt, provider, {"grant_type": "refresh_token", "refresh_token": refresh_token}
    )
    if "error" in answer:
        raise Unauthorized(
            f"provider {provider.name} refused to refresh the sign-in: "
            f"{answer.get('error_description') or answer['error']}"
        )
    return _claims_of(rt, provider, answer)


def exchange_code(rt, provider, code, redirect_uri, code_verifier, nonce):
    """The verified ID token claims (its nonce the one sent) and the refresh token for an
    authorization code the provider sent the browser back with (the code flow with PKCE)."""
    answer = _token_call(
        rt,
        provider,
        {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": code_verifier,
        },
    )
    return _claims_of(rt, provider, answer, nonce)


def _claims_of(rt, provider, answer, nonce=None):
    error = answer.get("error")
    if error in ("authorization_pending", "slow_down", "expired_token", "access_denied"):
        raise SignInError(
            error,
            {
                "authorization_pending": "the user has not approved the sign-in yet; ask again "
                "after `interval`",
                "slow_down": "asking too often; add 5 seconds to the interval",
                "expired_token": "the device code expired; start the sign-in again",
                "access_denied": "the user refused the sign-in",
            }[error],
        )
    if error:
        raise SignInError(
            "access_denied",
            f"provider {provider.name} refused: {answer.get('error_description') or error}",
        )
    id_token = answer.get("id_token")
    if not id_token:
        raise ProviderUnavailable(
            f"provider {provider.name} answered without an id_token (is `openid` a scope?)"
        )
    claims = verify_id_token(rt, provider, id_token, nonce)
    return claims, answer.get("refresh_token")


def login_with_token(rt, name, id_token):
    """The verified claims of an ID token the client got from the provider itself."""
    provider = sign_in_provider(name)
    return provider, verify_id_token(rt, provider, id_token)
