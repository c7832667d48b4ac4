"""Signing in: binding rules turn a provider's claims into a user's role, team and projects, at
every sign-in and every refresh (a group removed in the provider takes the access away at the next
refresh); a signed-in user holds a short session (fls_...) and a refresh token, both kept only as
hashes.

A rule is `{provider, claim, contains | equals, role, team?, projects?: [{project, role}]}`; the
rules are read in order and, per field, the first matching rule that sets it wins (the projects
of every matching rule are given, each with the role of the first rule that names it). A user no
rule gives a role gets no access: no user is made, and a session it held ends."""

import datetime as dt
import json
import re
import secrets

from fleetd.credentials import SESSION_PREFIX, hash_token, make_token
from fleetd.db import write_transaction
from fleetd.errors import Conflict, Forbidden, InvalidRequest, Unauthorized
from fleetd.models import (
    AuthProvider,
    AuthSession,
    Project,
    ProjectMember,
    ScimGroup,
    ScimGroupMember,
    Setting,
    User,
    new_id,
)
from fleetd.names import LOGIN
from fleetd.services.identity.oidc import claim_names, exchange_refresh
from fleetd.services.notify.events import record_event
from fleetd.sql import Statement

BINDINGS_KEY = "auth_bindings"
SESSION_SECONDS = 3600  # a session token's life; the refresh token makes the next one
REFRESH_SECONDS = 14 * 86400  # a refresh token's life: sign in again after two weeks without use
REFRESH_PREFIX = "flr_"
SCIM_GROUPS = "scim_groups"  # the claim binding rules read a user's SCIM groups from
SCIM_PROVIDER = "scim"  # the provider a rule on scim_groups alone may name
NO_ROLE = "none"  # a SCIM user no binding rule gives a role: it exists, with no access
_LOGIN = re.compile(LOGIN)


# ---------------------------------------------------------------- binding rules


_BINDINGS = Statement(
    lambda v: Setting.select(Setting.value).where(Setting.key == v("key")).limit(1)
)


def get_bindings():
    row = _BINDINGS.first(key=BINDINGS_KEY)  # read at every use: a change holds at once
    return json.loads(row.value) if row is not None else []


def put_bindings(now, rules):
    """Replace the rules (validated by the schema); InvalidRequest for a project that does not exist
    or a rule naming an unknown provider."""
    providers = {p.name for p in AuthProvider.select(AuthProvider.name)}
    for n, rule in enumerate(rules):
        if rule["provider"] not in providers and not (
            rule["provider"] == SCIM_PROVIDER and rule["claim"] == SCIM_GROUPS
        ):
            raise InvalidRequest(
                f"rule {n}: no provider {rule['provider']!r}",
                {"fields": {"json": {str(n): {"provider": ["no such provider"]}}}},
            )
        for p in rule.get("projects") or ():
            if Project.get_or_none_by_id(p["project"]) is None:
                raise InvalidRequest(
                    f"rule {n}: no project {p['project']!r}",
                    {"fields": {"json": {str(n): {"projects": [f"no project {p['project']!r}"]}}}},
                )
    with write_transaction():
        Setting.insert(key=BINDINGS_KEY, value=json.dumps(rules)).on_conflict(
            conflict_target=[Setting.key], update={Setting.value: json.dumps(rules)}
        ).execute()
        record_event(now, "auth.bindings", "auth", "bindings", f"{len(rules)} binding rule(s) set")
    return rules


def _matches(rule, claims):
    value = claims.get(rule["claim"])
    if "equals" in rule and rule["equals"] is not None:
        return value == rule["equals"] or (isinstance(value, list) and rule["equals"] in value)
    wanted = rule.get("contains")
    if wanted is None:
        return False
    if isinstance(value, list):
        return wanted in value
    return isinstance(value, str) and wanted in value


def bind(rules, provider, claims):
    """{role, team, projects: {key: role}} the rules give these claims, or None (no access)."""
    role = team = None
    projects: dict[str, str] = {}
    for rule in rules:
        scim = rule["claim"] == SCIM_GROUPS  # the user's SCIM groups, whatever it signs in with
        if (rule["provider"] != provider and not scim) or not _matches(rule, claims):
            continue
        role = role or rule["role"]
        team = team or rule.get("team")
        for p in rule.get("projects") or ():
            projects.setdefault(p["project"], p["role"])
    if role is None:
        return None
    return {"role": role, "team": team, "projects": projects}


# ---------------------------------------------------------------- users from claims


def _login_of(provider, claims):
    names = claim_names(provider)
    raw = claims.get(names["login"])
    login = raw.strip().lower() if isinstance(raw, str) else None
    if login and "@" in login and names["login"] == "email":
        login = login.split("@", 1)[0]
    if not login or not _LOGIN.fullmatch(login):
        raise Forbidden(
            f"provider {provider.name}'s `{names['login']}` claim ({raw!r}) is no login fleetd "
            "accepts (a POSIX user name: a-z, 0-9, _ . -, a letter or _ first)"
        )
    return login


def _text(value, size):
    return value[:size] if isinstance(value, str) else None


def _posix(provider, claims):
    names = claim_names(provider)
    uid = claims.get(names["uid"]) if names.get("uid") else None
    gid = claims.get(names["gid"]) if names.get("gid") else None
    groups = claims.get(names["groups_gids"]) if names.get("groups_gids") else None
    if not isinstance(uid, int) or isinstance(uid, bool) or not 1000 <= uid < 2**31:
        return None  # no uid, or a system account's: never taken from a claim
    return {
        "uid": uid,
        "gid": gid if isinstance(gid, int) and 0 < gid < 2**31 else uid,
        "groups": sorted({g for g in groups if isinstance(g, int) and 0 < g < 2**31})
        if isinstance(groups, list)
        else [],
    }


def _apply(user, provider, claims, granted, now):
    """Bring the user's fields and bound project memberships to what the claims and rules say
    (inside the caller's transaction). Memberships an admin gave (bound = false) are kept."""
    names = claim_names(provider)
    if user.source != "scim":  # a SCIM user's name and email are the SCIM resource's
        user.display_name = _text(claims.get(names["display_name"]), 200) or user.login
        user.email = _text(claims.get(names["email"]), 320)
    groups = claims.get(names["groups"])
    user.groups = (
        [g for g in groups if isinstance(g, str)][:1000] if isinstance(groups, list) else []
    )
    user.posix = _posix(provider, claims)
    apply_grant(user, granted)


def apply_grant(user, granted):
    """Give the user the role, team and bound project memberships the rules give it (inside the
    caller's transaction), or no role at all (`granted` None); saves it."""
    granted = granted or {"role": NO_ROLE, "team": None, "projects": {}}
    user.role, user.team = granted["role"], granted["team"]
    kept = {m.project: m for m in ProjectMember.select().where(ProjectMember.user_id == user.id)}
    for key, held in kept.items():
        if held.bound and key not in granted["projects"]:
            ProjectMember.delete().where(
                (ProjectMember.project == key) & (ProjectMember.user_id == user.id)
            ).execute()
    for key, role in granted["projects"].items():
        member = kept.get(key)
        if member is None:
            ProjectMember.create(project=key, user_id=user.id, role=role, bound=True)
        elif member.bound and member.role != role:
            ProjectMember.update(role=role).where(
                (ProjectMember.project == key) & (ProjectMember.user_id == user.id)
            ).execute()
    member_of = {
        m.project
        for m in ProjectMember.select(ProjectMember.project).where(ProjectMember.user_id == user.id)
    }
    if user.default_project not in member_of:
        user.default_project = min(member_of) if member_of else None
    user.save()


def provider_of(user):
    """The provider the user signed in with, or None."""
    return AuthProvider.get_or_none_by_id(user.provider) if user.provider else None


def scim_groups_of(user_id):
    """The display names of the SCIM groups the user is a member of."""
    query = (
        ScimGroup.select(ScimGroup.display_name)
        .join(ScimGroupMember, on=ScimGroupMember.group_id == ScimGroup.id)
        .where(ScimGroupMember.member_id == user_id)
    )
    return sorted(row.display_name for row in query)


def _with_scim_groups(provider, claims, login):
    """The claims, with `scim_groups` when the user they name was made through SCIM (the binding
    rules read the groups the provider keeps in fleetd through SCIM too)."""
    user = User.get_or_none((User.provider == provider.name) & (User.subject == claims["sub"]))
    if user is None:
        user = User.get_or_none(
            (User.login == login) & (User.source == "scim") & User.provider.is_null()
        )
    if user is None or user.source != "scim":
        return claims
    return {**claims, SCIM_GROUPS: scim_groups_of(user.id)}


def _granted(provider, claims, known=None):
    """(login, what the rules give it); Forbidden when no rule gives it access. `known`: the user
    of these claims when the caller read it already."""
    login = _login_of(provider, claims)
    if known is None:
        claims = _with_scim_groups(provider, claims, login)
    elif known.source == "scim":
        claims = {**claims, SCIM_GROUPS: scim_groups_of(known.id)}
    granted = bind(get_bindings(), provider.name, claims)
    if granted is None:
        raise Forbidden(
            f"no binding rule gives {login} access to fleetd; ask an admin to add one",
            {"login": login, "provider": provider.name},
        )
    return login, granted


def _bound_user(now, provider, claims, login, granted, source):
    """The user of these claims (inside the caller's transaction), made at its first use and
    brought to what the rules give it. Conflict when its login belongs to another user (one made
    from a token, or another provider's); Unauthorized for a deactivated one."""
    user = User.get_or_none((User.provider == provider.name) & (User.subject == claims["sub"]))
    if user is None:
        taken = User.get_or_none(User.login == login)
        if taken is not None and taken.source == "scim" and taken.provider is None:
            # Provisioned through SCIM before its first sign-in: this is that user.
            taken.provider, taken.subject, user = provider.name, claims["sub"], taken
        elif taken is not None:
            raise Conflict(
                f"the login {login} belongs to another user (source {taken.source}); an admin "
                "must delete or rename it before it can sign in",
                {"login": login},
            )
        else:
            user = User.create(
                id=new_id(),
                login=login,
                role=granted["role"],
                source=source,
                provider=provider.name,
                subject=claims["sub"],
                created_at=now,
            )
            record_event(
                now,
                "user.created",
                "user",
                user.id,
                f"user {login} made at its first sign-in with {provider.name}",
            )
    if not user.active:
        raise Unauthorized(f"user {user.login} is deactivated")
    _apply(user, provider, claims, granted, now)
    return user


def sign_in(rt, now, provider, claims, upstream_refresh=None):
    """A session for the person these verified claims name: the user (made at its first sign-in)
    is brought to what the binding rules give it. Forbidden when no rule gives it access, Conflict
    when its login belongs to another user (one made from a token, or another provider's)."""
    login, granted = _granted(provider, claims)
    with write_transaction():
        user = _bound_user(now, provider, claims, login, granted, "oidc")
        session = _new_session(user, provider.name, upstream_refresh, now)
        record_event(
            now,
            "user.signed_in",
            "user",
            user.id,
            f"{user.login} signed in with {provider.name}",
            actor=f"user:{user.login}",
        )
    rt.identities.forget(user.id)
    return session


_WORKLOAD_USER = Statement(
    lambda v: (
        User.select(
            User.id,
            User.login,
            User.role,
            User.team,
            User.active,
            User.default_project,
            User.groups,
            User.source,
        )
        .where((User.provider == v("provider")) & (User.subject == v("subject")))
        .limit(1)
    )
)


def workload_user(rt, now, provider, claims):
    """The user a workload's JWT (a `jwt` issuer's, e.g. a CI system's) acts as: made at its first
    use like a person's, and written again only when what the rules give it changed."""
    user = _WORKLOAD_USER.first(provider=provider.name, subject=claims["sub"])
    login, granted = _granted(provider, claims, user)
    groups = claims.get(claim_names(provider)["groups"])
    if (
        user is not None
        and user.active
        and (user.role, user.team) == (granted["role"], granted["team"])
        and (user.groups or []) == (groups if isinstance(groups, list) else [])
    ):
        return user
    with write_transaction():
        user = _bound_user(now, provider, claims, login, granted, "jwt")
    rt.identities.forget(user.id)
    return user


def _new_session(user, provider, upstream_refresh, now):
    session_id, token = make_token(SESSION_PREFIX)
    refresh = REFRESH_PREFIX + secrets.token_urlsafe(32)
    row = AuthSession.create(
        id=session_id,
        user_id=user.id,
        provider=provider,
        token_hash=hash_token(token),
        refresh_hash=hash_token(refresh),
        created_at=now,
        expires_at=now + dt.timedelta(seconds=SESSION_SECONDS),
        refresh_expires_at=now + dt.timedelta(seconds=REFRESH_SECONDS),
        upstream_refresh=upstream_refresh,
    )
    return {"token": token, "expires_at": row.expires_at, "refresh_token": refresh, "user": user}


def refresh(rt, now, refresh_token):
    """A new session token and refresh token for a refresh token (the old ones stop working). When
    the session came from a provider that gave a refresh token, the provider is asked again and the
    binding rules applied to what it says now: no rule left, no session."""
    row = AuthSession.get_or_none(AuthSession.refresh_hash == hash_token(refresh_token or ""))
    if row is None or row.ended_at is not None or row.refresh_expires_at <= now:
        raise Unauthorized("unknown, used or expired refresh token; sign in again")
    return _renewed(rt, now, row)


def renew(rt, now, session_id):
    """The next term of a session held by its id rather than its refresh token (the admin UI's,
    whose browser holds neither token): as refresh, the provider is asked again and the binding
    rules applied; its new tokens go to no one."""
    row = AuthSession.get_or_none_by_id(session_id)
    if row is None or row.ended_at is not None or row.refresh_expires_at <= now:
        raise Unauthorized("the session ended; sign in again")
    _renewed(rt, now, row)


def _renewed(rt, now, row):
    """refresh's work on the session's row: Unauthorized or Forbidden when it may not go on."""
    user = User.get_or_none_by_id(row.user_id)
    if user is None or not user.active:
        raise Unauthorized("the user is deactivated")
    provider = AuthProvider.get_or_none_by_id(row.provider) if row.provider else None
    upstream = row.upstream_refresh
    granted = claims = None
    if provider is not None and upstream:
        # ProviderUnavailable passes through: the session works on until it expires.
        claims, upstream = exchange_refresh(rt, provider, upstream)
        upstream = upstream or row.upstream_refresh
        if user.source == "scim":
            claims = {**claims, SCIM_GROUPS: scim_groups_of(user.id)}
        granted = bind(get_bindings(), provider.name, claims)
    if claims is not None and granted is None:  # the provider's groups no longer bind it
        with write_transaction():
            AuthSession.update(ended_at=now, upstream_refresh=None).where(
                AuthSession.id == row.id
            ).execute()
            record_event(
                now,
                "user.signed_out",
                "user",
                user.id,
                f"{user.login}'s session ended at refresh: no binding rule gives it access"
                " any more",
            )
        raise Forbidden(
            f"no binding rule gives {user.login} access to fleetd any more", {"login": user.login}
        )
    with write_transaction():
        row = AuthSession.get_by_id(row.id)
        if row.ended_at is not None:
            raise Unauthorized("the session ended meanwhile; sign in again")
        if granted is not None:
            _apply(user, provider, claims, granted, now)
        token = _rotate(row, upstream, now)
    rt.identities.forget(user.id)
    return {
        "token": token,
        "expires_at": row.expires_at,
        "refresh_token": row.refresh_token,
        "user": user,
    }


def _rotate(row, upstream, now):
    """New secrets for the session (inside the caller's transaction); returns its new token."""
    token = f"{SESSION_PREFIX}{row.id}.{secrets.token_urlsafe(32)}"
    refresh = REFRESH_PREFIX + secrets.token_urlsafe(32)
    row.token_hash, row.refresh_hash = hash_token(token), hash_token(refresh)
    row.expires_at = now + dt.timedelta(seconds=SESSION_SECONDS)
    row.refresh_expires_at = now + dt.timedelta(seconds=REFRESH_SECONDS)
    row.upstream_refresh = upstream
    row.save()
    row.refresh_token = refresh
    return token


def logout(now, principal):
    """End the caller's session (its refresh token stops working too)."""
    if principal.kind != "session":
        raise Conflict("only a session signs out; an API token is revoked instead")
    with write_transaction():
        AuthSession.update(ended_at=now, upstream_refresh=None).where(
            (AuthSession.id == principal.id) & AuthSession.ended_at.is_null()
        ).execute()
        record_event(
            now, "user.signed_out", "user", principal.user_id, f"{principal.login} signed out"
        )
