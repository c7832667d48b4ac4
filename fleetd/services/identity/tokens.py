"""API tokens: create, list, revoke; and the first admin token of a new installation."""

import datetime as dt
import secrets

import peewee

from fleetd.credentials import (
    API_PREFIX,
    DEFAULT_PROJECT,
    MEMBER,
    USER_ROLES,
    hash_token,
    make_token,
    token_name_problem,
)
from fleetd.db import database, write_transaction
from fleetd.errors import Conflict, InvalidRequest, NotFound
from fleetd.models import (
    ApiToken,
    Event,
    JoinToken,
    Project,
    ProjectMember,
    Role,
    Setting,
    UiSession,
    User,
)
from fleetd.services.identity.identities import unix_user_problem
from fleetd.services.notify.events import list_events
from fleetd.services.pagination import paginate

FIRST_ADMIN_KEY = "first_admin_token_issued"


def create_api_token(
    now,
    name,
    role,
    team=None,
    expires_in_seconds=None,
    unix_user=None,
    limits=None,
    share_unix_user=False,
    allowed_system_users=frozenset(),
    user=None,
):
    """Create a token; returns (row, token). The token is never stored or shown again. `unix_user`:
    the host user its tasks run as (fixed for the token's life); `limits`: its own limits
    (services.identity.limits). The name must be single-line printable text (InvalidRequest) that no
    live token (neither revoked nor expired) has (Conflict): events name their actor `token:<name>`.
    A unix_user is no system account unless `allowed_system_users` names it (InvalidRequest), and no
    other live token's unless `share_unix_user` says that both are one tenant on the hosts
    (Conflict): their tasks read each other's files. `user`: the login of the user that owns it (one
    is made, of the token's role and team, when none has that login), so that all its tokens are one
    owner; without it the token is its own owner."""
    problem = token_name_problem(name)
    if problem:
        raise InvalidRequest(problem, {"fields": {"json": {"name": [problem]}}})
    problem = unix_user_problem(unix_user, allowed_system_users) if unix_user else None
    if problem:
        raise InvalidRequest(problem, {"fields": {"json": {"unix_user": [problem]}}})
    token_id, token = make_token(API_PREFIX)
    expires_at = now + dt.timedelta(seconds=expires_in_seconds) if expires_in_seconds else None
    with write_transaction():
        _refuse_live_name(now, name)
        if unix_user and not share_unix_user:
            _refuse_shared_unix_user(now, unix_user)
        row = ApiToken.create(
            id=token_id,
            name=name,
            role=Role(role).value,
            team=team,
            token_hash=hash_token(token),
            created_at=now,
            expires_at=expires_at,
            unix_user=unix_user,
            limits=_own_limits({}, limits),
            user_id=_owning_user(now, user, token_id, role, team) if user else None,
        )
    return row, token


def _owning_user(now, login, token_id, role, team):
    """The id of the user of this login (inside the creating transaction); a new user, with the
    token's id, role and team and a member of its team's project (else the default one), if none has
    it. Conflict for a deactivated user."""
    found = User.get_or_none(User.login == login)
    if found is not None:
        if not found.active:
            raise Conflict(f"user {login} is deactivated", {"user": login})
        return found.id
    project = (
        Project.select(Project.key).where(Project.team == team).order_by(Project.key).first()
        if team
        else None
    )
    key = project.key if project is not None else DEFAULT_PROJECT
    if Project.get_or_none_by_id(key) is None:
        key = None
    User.create(
        id=token_id,
        login=login,
        display_name=login,
        role=role if role in USER_ROLES else MEMBER,
        team=team,
        default_project=key,
        source="token",
        created_at=now,
    )
    if key is not None:
        ProjectMember.create(project=key, user_id=token_id, role="member")
    return token_id


def live_tokens(now):
    """The condition of tokens that still work: not revoked, not expired."""
    return ApiToken.revoked_at.is_null() & (
        ApiToken.expires_at.is_null() | (ApiToken.expires_at > now)
    )


def _refuse_live_name(now, name):
    """Conflict when a live token has this name (inside the creating transaction). On PostgreSQL a
    lock on the name keeps two creations of it from passing this check at once; SQLite's writers
    queue."""
    if not isinstance(database.obj, peewee.SqliteDatabase):
        database.execute_sql(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", ("api_token.name:" + name,)
        )
    if ApiToken.select(ApiToken.id).where(live_tokens(now) & (ApiToken.name == name)).exists():
        raise Conflict(
            f"a live token is already named {name!r}; revoke it or choose another name",
            {"name": name},
        )


def _refuse_shared_unix_user(now, unix_user):
    """Conflict when a live token runs its tasks as this host user (inside the creating transaction;
    locked on PostgreSQL as the name is)."""
    if not isinstance(database.obj, peewee.SqliteDatabase):
        database.execute_sql(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", ("api_token.unix_user:" + unix_user,)
        )
    holder = (
        ApiToken.select(ApiToken.id, ApiToken.name)
        .where(live_tokens(now) & (ApiToken.unix_user == unix_user))
        .first()
    )
    if holder is not None:
        raise Conflict(
            f"live token {holder.name!r} ({holder.id}) already runs its tasks as host user "
            f"{unix_user!r}: two tokens as one user read each other's files; revoke it, choose "
            f"another user, or say share_unix_user: true when both are one tenant",
            {"unix_user": unix_user, "token_id": holder.id},
        )


def set_token_limits(token_id, limits):
    """Change a token's own limits: a value sets one, None gives it back to the setting, a limit not
    named stays. The next request of the token (and its next write) sees them."""
    with write_transaction():
        row = ApiToken.get_or_none(ApiToken.id == token_id)
        if row is None or row.revoked_at is not None:  # a revoked token is gone, but listed
            raise NotFound(f"token {token_id} not found (or revoked)")
        row.limits = _own_limits(row.limits or {}, limits)
        row.save()
    return row


def _own_limits(stored, changes):
    """The limits a token keeps after `changes` ({name: value or None}); None when it has none of
    its own."""
    merged = {
        name: value for name, value in {**stored, **(changes or {})}.items() if value is not None
    }
    return merged or None


def list_api_tokens(limit, cursor=None):
    """One page of tokens, oldest first, without secrets."""
    return paginate(ApiToken.select(), ApiToken.id, limit, cursor)


def list_user_tokens(user_id, limit):
    """The API tokens a user owns, newest first (at most `limit`), without secrets."""
    return list(
        ApiToken.select()
        .where(ApiToken.user_id == user_id)
        .order_by(ApiToken.created_at.desc(), ApiToken.id)
        .limit(limit)
    )


def list_token_events(token_id, limit, cursor=None, after=None):
    """A token's own events, oldest first (`token.renamed`: migration 0017 renamed it); NotFound for
    an id that is neither a token nor the subject of an event (one deleted after its retention)."""
    rows, next_cursor = list_events("token", token_id, limit, cursor, after)
    if not rows and ApiToken.get_or_none(ApiToken.id == token_id) is None:
        seen = (
            Event.select()
            .where((Event.subject_type == "token") & (Event.subject_id == token_id))
            .exists()
        )
        if not seen:
            raise NotFound(f"token {token_id} not found")
    return rows, next_cursor


def revoke_api_token(now, token_id):
    """Revoke a token; it stops working at once. Revoking twice is harmless."""
    with write_transaction():
        row = ApiToken.get_or_none(ApiToken.id == token_id)
        if row is None:
            raise NotFound(f"token {token_id} not found")
        if row.revoked_at is None:
            row.revoked_at = now
            row.save()
    return row


def issue_first_admin_token(now):
    """Create the first admin token of this database once; None if it was issued before."""
    token_id, token = make_token(API_PREFIX)
    with write_transaction():
        if Setting.get_or_none(Setting.key == FIRST_ADMIN_KEY) is not None:
            return None
        ApiToken.create(
            id=token_id,
            name="admin",
            role=Role.ADMIN.value,
            token_hash=hash_token(token),
            created_at=now,
        )
        Setting.create(key=FIRST_ADMIN_KEY, value=token_id)
    return token


def delete_expired_tokens(now, retention_seconds):
    """Delete API and join tokens that expired or were revoked more than `retention_seconds` ago."""
    cutoff = now - dt.timedelta(seconds=retention_seconds)
    with write_transaction():
        api = (
            ApiToken.delete()
            .where((ApiToken.expires_at < cutoff) | (ApiToken.revoked_at < cutoff))
            .execute()
        )
        join = JoinToken.delete().where(JoinToken.expires_at < cutoff).execute()
        sessions = UiSession.delete().where(UiSession.expires_at < now).execute()
    return {"api_tokens": api, "join_tokens": join, "ui_sessions": sessions}


def start_ui_session(now, lifetime, token_id=None, auth_session_id=None):
    """Record a new admin UI session of an API token or of a user's session (one of the two);
    returns its secret id (kept only hashed)."""
    session_id = secrets.token_urlsafe(32)
    with write_transaction():
        UiSession.create(
            id=hash_token(session_id),
            token_id=token_id,
            auth_session_id=auth_session_id,
            created_at=now,
            expires_at=now + lifetime,
        )
    return session_id


def ui_session_of(now, session_id):
    """(API token id, user's session id) of a live UI session, one of them None; None when it
    ended, expired or never was."""
    row = UiSession.get_or_none_by_id(hash_token(session_id))
    if row is None or row.expires_at <= now:
        return None
    return row.token_id, row.auth_session_id


def end_ui_session(session_id):
    """End a UI session at once (sign-out): its cookie no longer signs anyone in."""
    with write_transaction():
        UiSession.delete().where(UiSession.id == hash_token(session_id)).execute()
