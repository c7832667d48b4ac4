"""Checking presented tokens: principals, the role checks views use, the failed-authentication
limiter. Token formats, roles and making and hashing tokens are fleetd.credentials'."""

import collections
import dataclasses
import functools
import ipaddress
import json
import threading

import peewee
from flask import g, request

from fleetd.credentials import (  # noqa: F401 - views take the roles from here, with the checks
    ADMIN,
    ANY_ROLE,
    API_PREFIX,
    DEFAULT_PROJECT,
    JOIN,
    JOIN_PREFIX,
    MEMBER,
    METRICS,
    NODE,
    NODE_PREFIX,
    OPERATOR,
    SCIM,
    SESSION_PREFIX,
    SUBMITTER,
    TOKEN_RE,
    VIEWER,
    hash_token,
    make_token,
    matches,
)
from fleetd.errors import Forbidden, RateLimited, Unauthorized
from fleetd.models import ApiToken, AuthProvider, AuthSession, JoinToken, Node, NodeStatus, User
from fleetd.services.identity import oidc, signin
from fleetd.services.notify import events
from fleetd.sql import Statement


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who is calling: an API token, a user's session, a node session or a join token.

    `owner_id` owns what it submits: its user's id, or a service account's own token id (a service
    account is a token of a project, without a user). `id` is the token's (or session's) own id."""

    kind: str  # "api", "session", "node" or "join"
    id: str
    role: str
    name: str = ""
    team: str | None = None
    node_id: str | None = None
    fleet: str | None = None
    rate: float | None = None  # an API token's own requests_per_second (None: the setting's)
    node: object = dataclasses.field(
        default=None, compare=False, repr=False
    )  # the whole row, for heartbeats
    user_id: str | None = None
    login: str | None = None  # its user's login
    project: str | None = None  # a service account's project
    default_project: str | None = None

    @property
    def owner_id(self):
        return self.user_id or self.id

    @property
    def label(self):
        """The principal as whoami and events show it: user:alice, token:ci-bot (a service account
        or a token without a user) or node:<id>."""
        if self.login:
            return f"user:{self.login}"
        if self.kind == "api":
            return f"token:{self.name}"
        if self.kind == "node":
            return f"node:{self.node_id}"
        return f"join-token:{self.id}"

    @property
    def token_id(self):
        """The API token's id, for events' actor_token_id (None for a session, node or join
        token)."""
        return self.id if self.kind == "api" else None

    @property
    def via(self):
        """How it authenticated, for events' actor_via: token:<name> for an API token (a user's own
        token too), session for a user's session, jwt for a workload's JWT; None for a node or join
        token."""
        if self.kind == "api":
            return f"token:{self.name}"
        return self.kind if self.kind in ("session", "jwt") else None

    @property
    def described(self):
        """The label with how it authenticated when the label does not say it, as records that keep
        one text name their maker: `user:alice (session)`, `user:alice (token:ansible)`."""
        via = self.via
        return f"{self.label} ({via})" if via and via != self.label else self.label


# Every request reads one of these: only the columns the check needs, so that no JSON or
# timestamp it does not look at is decoded.
_API_TOKEN_AUTH = Statement(
    lambda v: (
        ApiToken.select(
            ApiToken.id,
            ApiToken.name,
            ApiToken.role,
            ApiToken.team,
            ApiToken.token_hash,
            ApiToken.expires_at,
            ApiToken.revoked_at,
            ApiToken.limits,
            ApiToken.user_id,
            ApiToken.project,
            User.login,
            User.active,
            User.default_project,
            User.role.alias("user_role"),
        )
        .join(User, peewee.JOIN.LEFT_OUTER, on=(User.id == ApiToken.user_id))
        .where(ApiToken.id == v("id"))
        .limit(1)
    )
)
# A session, then its user: a deactivated user's next request is refused.
_SESSION_AUTH = Statement(
    lambda v: (
        AuthSession.select(
            AuthSession.id,
            AuthSession.user_id,
            AuthSession.token_hash,
            AuthSession.expires_at,
            AuthSession.ended_at,
        )
        .where(AuthSession.id == v("id"))
        .limit(1)
    )
)
_SESSION_USER = Statement(
    lambda v: (
        User.select(
            User.id,
            User.login,
            User.role,
            User.team,
            User.active,
            User.default_project,
            User.limits,
        )
        .where(User.id == v("id"))
        .limit(1)
    )
)
_NODE_AUTH = Statement(
    lambda v: (
        Node.select(Node.id, Node.hostname, Node.fleet, Node.status, Node.session_hash)
        .where(Node.session_id == v("session_id"))
        .limit(1)
    )
)
_NODE_BY_SESSION = Statement(
    lambda v: Node.select().where(Node.session_id == v("session_id")).limit(1)
)
_REVOKED = NodeStatus.REVOKED.value


def resolve_token(token, now, allow_revoked_node=False, rt=None):
    """Return the Principal for a bearer token, or raise Unauthorized.

    `allow_revoked_node`: the caller is a node's heartbeat, which a revoked node may still send
    (to learn that it is revoked); its Principal carries the node's whole row as `node`. With the
    Runtime `rt`, a JWT of a configured `jwt` issuer is a bearer too (jwt_principal).
    """
    match = TOKEN_RE.match(token or "")
    if not match:
        if rt is not None and token.count(".") == 2:
            return jwt_principal(rt, token, now)
        raise Unauthorized("malformed or unknown token")
    prefix, token_id, _ = match.groups()
    if prefix == API_PREFIX:
        row = _API_TOKEN_AUTH.first(id=token_id)
        if row is None or not matches(token, row.token_hash):
            raise Unauthorized("malformed or unknown token")
        return api_token_principal(row, now)
    if prefix == SESSION_PREFIX:
        return session_principal(_SESSION_AUTH.first(id=token_id), token, now)
    if prefix == NODE_PREFIX:
        node = (_NODE_BY_SESSION if allow_revoked_node else _NODE_AUTH).first(session_id=token_id)
        if node is None or not matches(token, node.session_hash):
            raise Unauthorized("malformed or unknown token")
        if node.status == _REVOKED and not allow_revoked_node:
            raise Unauthorized("node revoked")
        return Principal(
            "node",
            token_id,
            NODE,
            name=node.hostname,
            node_id=node.id,
            fleet=node.fleet_id,
            node=node if allow_revoked_node else None,
        )
    row = JoinToken.get_or_none_by_id(token_id)
    if row is None or not matches(token, row.token_hash):
        raise Unauthorized("malformed or unknown token")
    if row.revoked:
        raise Unauthorized("join token revoked")
    if row.expires_at <= now:
        raise Unauthorized("join token expired")
    if row.max_uses is not None and row.uses >= row.max_uses:
        raise Unauthorized("join token used up")
    return Principal("join", row.id, JOIN, fleet=row.fleet_id)


_JWT_PROVIDER = Statement(
    lambda v: (
        AuthProvider.select()
        .where((AuthProvider.kind == "jwt") & (AuthProvider.issuer == v("issuer")))
        .limit(1)
    )
)


def jwt_principal(rt, token, now):
    """The Principal of a workload's JWT (a CI system's identity token): its issuer must be a
    configured `jwt` provider, its signature, audience and times good, and a binding rule must give
    it a role; it acts as a user of its own (services.identity.signin.workload_user)."""
    try:
        claims = json.loads(oidc.b64decode(token.split(".")[1]))
    except ValueError:
        raise Unauthorized("malformed or unknown token") from None
    issuer = claims.get("iss") if isinstance(claims, dict) else None
    provider = _JWT_PROVIDER.first(issuer=issuer) if isinstance(issuer, str) else None
    if provider is None:
        raise Unauthorized("a JWT whose issuer is no configured jwt provider")
    verified = oidc.verify_id_token(rt, provider, token)
    user = signin.workload_user(rt, now, provider, verified)
    return Principal(
        "jwt",
        user.id,
        user.role,
        name=user.login,
        team=user.team,
        user_id=user.id,
        login=user.login,
        default_project=user.default_project,
    )


def api_token_principal(row, now):
    """The Principal of a stored API token (read by _API_TOKEN_AUTH, with its user); Unauthorized
    when it is revoked or expired, or its user is deactivated."""
    if row.revoked_at is not None:
        raise Unauthorized("token revoked")
    if row.expires_at is not None and row.expires_at <= now:
        raise Unauthorized("token expired")
    # The user's columns come flat on the row (peewee maps a joined model's columns onto the first).
    login = getattr(row, "login", None)
    if row.user_id is not None and (login is None or not row.active):
        raise Unauthorized("the token's user is deactivated")
    # A user the binding rules give no role any more (a SCIM group it left) acts with none.
    role = signin.NO_ROLE if getattr(row, "user_role", None) == signin.NO_ROLE else row.role
    return Principal(
        "api",
        row.id,
        role,
        name=row.name,
        team=row.team,
        rate=(row.limits or {}).get("requests_per_second"),
        user_id=row.user_id,
        login=login,
        project=row.project,
        default_project=row.default_project if login else (row.project or DEFAULT_PROJECT),
    )


def session_principal(row, token, now):
    """The Principal of a user's session (fls_...): Unauthorized when it is unknown, ended or
    expired, or its user is deactivated."""
    if row is None or not matches(token, row.token_hash):
        raise Unauthorized("malformed or unknown token")
    return _live_session_principal(row, now)


def resolve_session_id(session_id, now):
    """The Principal of the user's session with this id (authenticated once already: the admin
    UI's session signed in with a provider)."""
    row = _SESSION_AUTH.first(id=session_id)
    if row is None:
        raise Unauthorized("unknown session")
    return _live_session_principal(row, now)


def _live_session_principal(row, now):
    if row.ended_at is not None:
        raise Unauthorized("session ended")
    if row.expires_at <= now:
        raise Unauthorized("session expired; refresh it or sign in again")
    user = _SESSION_USER.first(id=row.user_id)
    if user is None or not user.active:
        raise Unauthorized("the user is deactivated")
    return Principal(
        "session",
        row.id,
        user.role,
        name=user.login,
        team=user.team,
        user_id=user.id,
        login=user.login,
        default_project=user.default_project,
        rate=(user.limits or {}).get("requests_per_second"),
    )


def resolve_api_token_id(token_id, now):
    """The Principal of the API token with this id (already authenticated once, e.g. a UI
    session)."""
    row = _API_TOKEN_AUTH.first(id=token_id)
    if row is None:
        raise Unauthorized("unknown token")
    return api_token_principal(row, now)


class FailureLimiter:
    """Counts failed authentications, per client address and in all, in a sliding window.

    It limits failures, not identities: only a request whose credential already failed is ever
    refused, so a valid token is let through from an address (a NAT, a proxy) where others keep
    failing. Past `limit` failures from one address, or `global_limit` from all, failing requests
    get 429 instead of 401 until the window moves on.
    """

    def __init__(self, limit, window_seconds, global_limit=None, max_addresses=100_000):
        self.limit = limit
        self.window = window_seconds
        self.global_limit = global_limit
        self.max_addresses = max_addresses
        self._failures = {}
        self._all: collections.deque[float] = (
            collections.deque()
        )  # monotonic times of every recent failure
        self._lock = threading.Lock()

    def fail(self, address, now):
        """Note one failed authentication from `address`; raise RateLimited when over a budget."""
        with self._lock:
            if address not in self._failures and len(self._failures) >= self.max_addresses:
                self._prune(now)
            times = self._failures.setdefault(address, collections.deque())
            over = self._add(times, now, self.limit)
            if self.global_limit:
                over_all = self._add(self._all, now, self.global_limit)
                if over_all is not None and (over is None or over_all > over):
                    raise RateLimited(
                        "too many failed authentications; retry later", retry_after=over_all
                    )
            if over is not None:
                raise RateLimited(
                    "too many failed authentications from this address", retry_after=over
                )

    def _add(self, times, now, limit):
        """Append a failure at `now`; seconds until the budget is back when it is exceeded, else
        None."""
        while times and times[0] <= now - self.window:
            times.popleft()
        times.append(now)
        while len(times) > limit + 1:
            times.popleft()
        if len(times) > limit:
            return times[1] + self.window - now if limit else self.window
        return None

    def _prune(self, now):
        stale = [a for a, t in self._failures.items() if not t or t[-1] <= now - self.window]
        for address in stale:
            del self._failures[address]
        if len(self._failures) >= self.max_addresses:
            self._failures.clear()


class RequestRates:
    """A token bucket per API token: each holds up to `burst_seconds` of its rate in requests and
    refills at its rate; a request finding its bucket empty gets 429 with the seconds until one
    request's worth is back. In memory, per process (each replica counts the requests it serves)."""

    def __init__(self, default_rate, burst_seconds, max_tokens=100_000):
        self.default_rate = default_rate
        self.burst_seconds = burst_seconds
        self.max_tokens = max_tokens
        self._buckets = {}  # token id -> [requests left, monotonic time of the last refill]
        self._lock = threading.Lock()

    def take(self, token_id, rate, now, what="requests for this token"):
        """Spend one request of this token at `rate` per second (None: the default; 0: unlimited);
        raise RateLimited (saying too many `what`) when its bucket is empty."""
        rate = self.default_rate if rate is None else rate
        if not rate:
            return
        capacity = max(1.0, rate * self.burst_seconds)
        with self._lock:
            bucket = self._buckets.get(token_id)
            if bucket is None:
                if len(self._buckets) >= self.max_tokens:
                    self._buckets.clear()  # full buckets for all: only ever lets more through
                bucket = self._buckets[token_id] = [capacity, now]
            left = min(capacity, bucket[0] + (now - bucket[1]) * rate)
            bucket[1] = now
            if left < 1.0:
                bucket[0] = left
                raise RateLimited(
                    f"too many {what} (limit {rate:g}/s); retry later",
                    retry_after=(1.0 - left) / rate,
                )
            bucket[0] = left - 1.0


def client_address(remote_addr, forwarded_for, trusted):
    """The address of the client: `remote_addr`, or when that is a trusted proxy the nearest
    address in X-Forwarded-For that is not one (proxies append, so only the right end is
    trusted)."""
    address = remote_addr or "unknown"
    if not trusted or not forwarded_for or not _in_networks(address, trusted):
        return address
    hops = [hop.strip() for hop in forwarded_for.split(",")]
    for hop in reversed(hops):
        if not _in_networks(hop, trusted):
            return hop if _is_ip(hop) else address
    return hops[0] if _is_ip(hops[0]) else address


def _is_ip(text):
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _in_networks(address, networks):
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


def current_principal():
    """The authenticated principal of this request."""
    return g.principal


# Roles a view's list implies: what a submitter may, a member may; a read (GET) that a member may
# make, a viewer and an operator may make too.
_WITH_SUBMITTER = (MEMBER,)
_READERS = (VIEWER, OPERATOR)


def allowed_roles(roles, method):
    """Every role that may call a view that names `roles`, with the HTTP `method` of the call."""
    allowed = set(roles)
    if SUBMITTER in allowed:
        allowed.update(_WITH_SUBMITTER)
        if method in ("GET", "HEAD"):
            allowed.update(_READERS)
    return allowed


def require(*roles):
    """Allow a view method only to principals whose role is one of `roles` (with what they imply:
    allowed_roles)."""
    readable = frozenset(allowed_roles(roles, "GET"))
    writable = frozenset(allowed_roles(roles, "POST"))

    def decorator(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            principal = g.get("principal")
            if principal is None:
                raise Unauthorized("authentication required")
            if principal.role not in (readable if request.method in ("GET", "HEAD") else writable):
                raise Forbidden(
                    f"role {principal.role!r} may not do this",
                    {"role": principal.role, "required_roles": list(roles)},
                )
            return view(*args, **kwargs)

        vars(wrapper)["required_roles"] = roles  # fleetd/ui/roles.py reads it
        return wrapper

    return decorator


def enter_actor(principal):
    """Events written while this request is served name its principal as their actor: the services
    read it from fleetd.services.notify.events, never from the request (called once the request is
    authenticated; leave_actors, at its teardown, ends it)."""
    entered = events.enter_request(principal.label, principal.token_id, principal.via)
    g.setdefault("fleetd_actors", []).append(entered)


def leave_actors(exc=None):
    """At a request's teardown: what enter_actor() began ends."""
    for entered in reversed(g.pop("fleetd_actors", [])):
        events.leave_request(entered)
