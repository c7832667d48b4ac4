"""Users: people (and the users migration 0031 made of token names) who own tokens, sessions and
work. An admin lists them and changes their role, default project and whether they are active; a
user reads itself. Deactivating a user ends its sessions and revokes its tokens at once; its work,
usage and uid stay its own. A user is never deleted: DELETE deactivates it and takes its project
memberships away, so that the work and usage it owned keep a name."""

from fleetd.credentials import ADMIN, USER_ROLES
from fleetd.db import write_transaction
from fleetd.errors import InvalidRequest, NotFound
from fleetd.models import ApiToken, AuthSession, Project, ProjectMember, User
from fleetd.services.notify.events import record_event
from fleetd.services.pagination import paginate

# What a listed user shows: not its groups or limits (JSON a page would decode for nothing).
_LISTED = (
    User.id,
    User.login,
    User.display_name,
    User.email,
    User.active,
    User.role,
    User.team,
    User.default_project,
    User.posix,
    User.unix_user,
    User.source,
    User.created_at,
    User.deactivated_at,
)


def list_users(limit, cursor=None, active=None):
    """One page of users by id; `active`: only those that are (or are not)."""
    query = User.select(*_LISTED)
    if active is not None:
        query = query.where(User.active == active)
    return paginate(query, User.id, limit, cursor)


def find_user(user_id):
    """The user of this id, or None (also for None: a principal without a user)."""
    return User.get_or_none_by_id(user_id) if user_id else None


def own_tokens(user_id, now, limit=100):
    """A user's live API tokens (its profile lists them), newest first."""
    return list(
        ApiToken.select(
            ApiToken.id,
            ApiToken.name,
            ApiToken.role,
            ApiToken.created_at,
            ApiToken.expires_at,
            ApiToken.last_used_at,
        )
        .where(
            (ApiToken.user_id == user_id)
            & ApiToken.revoked_at.is_null()
            & (ApiToken.expires_at.is_null() | (ApiToken.expires_at > now))
        )
        .order_by(ApiToken.created_at.desc())
        .limit(limit)
    )


def get_user(principal, login):
    """The user of this login: admins read any, others only themselves (NotFound otherwise)."""
    user = User.get_or_none(User.login == login)
    if user is None or (principal.role != ADMIN and user.id != principal.user_id):
        raise NotFound(f"user {login} not found")
    return user


def update_user(rt, now, login, changes):
    """Change a user's `active`, `role` or `default_project`. Deactivation ends its sessions and
    revokes its tokens in the same transaction; a role change takes effect at its next request (and
    at its next task placement: Identities.forget)."""
    with write_transaction():
        user = User.get_or_none(User.login == login)
        if user is None:
            raise NotFound(f"user {login} not found")
        role = changes.get("role")
        if role is not None and role not in USER_ROLES:
            raise InvalidRequest(
                f"a user's role is one of {', '.join(USER_ROLES)}",
                {"fields": {"json": {"role": [f"one of {', '.join(USER_ROLES)}"]}}},
            )
        if "default_project" in changes and changes["default_project"] is not None:
            _check_default_project(user, changes["default_project"])
        for field in ("role", "default_project"):
            if field in changes and (field != "role" or role is not None):
                setattr(user, field, changes[field])
        if changes.get("active") is False and user.active:
            deactivate(user, now, "deactivated by an admin")
        elif changes.get("active") is True and not user.active:
            user.active, user.deactivated_at = True, None
            record_event(now, "user.activated", "user", user.id, f"user {login} activated")
        user.save()
    rt.identities.forget(user.id)
    return user


def _check_default_project(user, key):
    if Project.get_or_none_by_id(key) is None:
        raise InvalidRequest(
            f"no project {key!r}",
            {"fields": {"json": {"default_project": [f"no project {key!r}"]}}},
        )
    if (
        user.role != ADMIN
        and not ProjectMember.select()
        .where((ProjectMember.project == key) & (ProjectMember.user_id == user.id))
        .exists()
    ):
        raise InvalidRequest(
            f"{user.login} is not a member of project {key}",
            {"fields": {"json": {"default_project": ["the user is not a member of it"]}}},
        )


def deactivate(user, now, why):
    """Inside the caller's transaction: the user is inactive, its sessions end, its tokens are
    revoked."""
    user.active, user.deactivated_at = False, now
    ended = (
        AuthSession.update(ended_at=now)
        .where((AuthSession.user_id == user.id) & AuthSession.ended_at.is_null())
        .execute()
    )
    revoked = (
        ApiToken.update(revoked_at=now)
        .where((ApiToken.user_id == user.id) & ApiToken.revoked_at.is_null())
        .execute()
    )
    record_event(
        now,
        "user.deactivated",
        "user",
        user.id,
        f"user {user.login} {why}: {ended} session(s) ended, {revoked} token(s) revoked",
    )


def delete_user(rt, now, login):
    """Deactivate the user and take its project memberships away (see the module's docstring)."""
    with write_transaction():
        user = User.get_or_none(User.login == login)
        if user is None:
            raise NotFound(f"user {login} not found")
        if user.active:
            deactivate(user, now, "deleted by an admin")
        ProjectMember.delete().where(ProjectMember.user_id == user.id).execute()
        user.default_project = None
        user.save()
    rt.identities.forget(user.id)
