"""Projects: groups of work inside a team. Every job and instance belongs to exactly one; a user
submits to a project it is a member (or project admin) of, a service account to its own project.
Admins manage every project; a project admin manages its members and service accounts."""

import datetime as dt
import re

from fleetd.clock import utcnow
from fleetd.credentials import (
    ADMIN,
    API_PREFIX,
    DEFAULT_PROJECT,
    PROJECT_ROLES,
    READ_ALL,
    hash_token,
    make_token,
    token_name_problem,
)
from fleetd.db import write_transaction
from fleetd.errors import Conflict, Forbidden, InvalidRequest, NotFound
from fleetd.models import (
    ApiToken,
    Instance,
    InstanceState,
    Job,
    JobState,
    Project,
    ProjectMember,
    Role,
    User,
)
from fleetd.names import PROJECT_KEY
from fleetd.services.identity.access import project_role
from fleetd.services.notify.events import record_event
from fleetd.services.pagination import paginate
from fleetd.sql import Statement

_KEY = re.compile(PROJECT_KEY)
_PROJECT = Statement(
    lambda v: Project.select(Project.key, Project.team).where(Project.key == v("key")).limit(1)
)
_SUBMITTING = ("admin", "member")


def project_for(principal, wanted):
    """The Project (key, team) that work of this principal goes to: `wanted` (a key), else its
    default project. InvalidRequest when it names none or an unknown one; Forbidden when the
    principal may not submit there (admins may anywhere; a service account only to its own)."""
    key = wanted or principal.default_project
    if not key:
        raise InvalidRequest(
            "no project given and you have no default project; name one with `project`",
            {"fields": {"json": {"project": ["required: you have no default project"]}}},
        )
    project = _PROJECT.first(key=key)
    if project is None and key == DEFAULT_PROJECT:
        project = _make_default()
    if project is None:
        raise InvalidRequest(
            f"no project {key!r}", {"fields": {"json": {"project": [f"no project {key!r}"]}}}
        )
    if principal.role == ADMIN:
        return project
    if principal.user_id is None:  # a service account, or a token no user owns
        if principal.project is not None and principal.project != key:
            raise Forbidden(
                f"this service account belongs to project {principal.project!r}, not {key!r}",
                {"project": key},
            )
        return project
    role = project_role(principal, key)
    if role not in _SUBMITTING:
        raise Forbidden(
            f"you may not submit to project {key!r} ({role or 'not a member'})",
            {"project": key},
        )
    return project


def _make_default():
    """The project `default` (migration 0031 made it; a database emptied of projects lacks it)."""
    with write_transaction():
        Project.insert(
            key=DEFAULT_PROJECT, name=DEFAULT_PROJECT, display_name="Default", created_at=utcnow()
        ).on_conflict_ignore().execute()
    return _PROJECT.first(key=DEFAULT_PROJECT)


def project_roles(user_id):
    """[{key, role}] of this user's projects, by key."""
    rows = (
        ProjectMember.select(ProjectMember.project, ProjectMember.role)
        .where(ProjectMember.user_id == user_id)
        .order_by(ProjectMember.project)
    )
    return [{"key": r.project, "role": r.role} for r in rows]


def _key_problem(key):
    return (
        None
        if isinstance(key, str) and _KEY.match(key)
        else ("a key is 2 to 32 characters: lower-case letters, digits and '-', a letter first")
    )


def create_project(now, key, name=None, display_name=None, team=None, description=""):
    problem = _key_problem(key)
    if problem:
        raise InvalidRequest(problem, {"fields": {"json": {"key": [problem]}}})
    with write_transaction():
        if Project.get_or_none_by_id(key) is not None:
            raise Conflict(f"project {key!r} exists", {"key": key})
        project = Project.create(
            key=key,
            name=name or key,
            display_name=display_name or name or key,
            team=team,
            description=description or "",
            created_at=now,
        )
        record_event(
            now, "project.created", "project", key, f"project {key} of team {team or '(none)'}"
        )
    return project


def get_project(principal, key):
    """The project, if this principal may read it (admins, operators and viewers of the fleet: any;
    others: those they are members of)."""
    project = Project.get_or_none_by_id(key)
    if project is None or not _may_read(principal, key):
        raise NotFound(f"project {key} not found")
    return project


def _may_read(principal, key):
    if principal.role in READ_ALL:
        return True
    if principal.user_id is None:
        return principal.project == key
    return project_role(principal, key) is not None


def list_projects(principal, limit, cursor=None):
    """One page of projects by key: every one for admins, operators and viewers; a member's own."""
    query = Project.select()
    if principal.role not in READ_ALL:
        if principal.user_id is None:
            query = query.where(Project.key == principal.project)
        else:
            query = query.where(
                Project.key.in_(
                    ProjectMember.select(ProjectMember.project).where(
                        ProjectMember.user_id == principal.user_id
                    )
                )
            )
    return paginate(query, Project.key, limit, cursor)


def update_project(now, key, changes):
    with write_transaction():
        project = Project.get_or_none_by_id(key)
        if project is None:
            raise NotFound(f"project {key} not found")
        for field in ("name", "display_name", "team", "description"):
            if field in changes:
                setattr(
                    project,
                    field,
                    changes[field] if field != "description" else changes[field] or "",
                )
        project.save()
    return project


def delete_project(now, key):
    """Delete a project that holds no live work (Conflict otherwise); its members and service
    accounts go with it (the accounts' tokens are revoked)."""
    if key == DEFAULT_PROJECT:
        raise Conflict(
            "the project `default` holds the work of tokens without a project; it stays",
            {"key": key},
        )
    with write_transaction():
        if Project.get_or_none_by_id(key) is None:
            raise NotFound(f"project {key} not found")
        live_jobs = (
            Job.select()
            .where(
                (Job.project == key)
                & Job.state.not_in([s.value for s in JobState if s.is_terminal()])
            )
            .exists()
        )
        live_instances = (
            Instance.select()
            .where((Instance.project == key) & (Instance.state != InstanceState.DELETED.value))
            .exists()
        )
        if live_jobs or live_instances:
            raise Conflict(
                f"project {key} still holds work that has not ended; cancel or delete it first",
                {"key": key},
            )
        ProjectMember.delete().where(ProjectMember.project == key).execute()
        ApiToken.update(revoked_at=now).where(
            (ApiToken.project == key) & ApiToken.user_id.is_null() & ApiToken.revoked_at.is_null()
        ).execute()
        User.update(default_project=None).where(User.default_project == key).execute()
        Project.delete().where(Project.key == key).execute()
        record_event(now, "project.deleted", "project", key, f"project {key} deleted")


def may_manage(principal, key):
    """NotFound unless this principal may read the project (get_project), Forbidden unless it is an
    admin or an admin of this project."""
    get_project(principal, key)
    if principal.role == ADMIN or project_role(principal, key) == "admin":
        return
    raise Forbidden(f"only an admin or an admin of project {key} may do this", {"project": key})


def set_member(principal, now, key, login, role):
    """Make the user a member of the project with this role (admin, member or viewer)."""
    may_manage(principal, key)
    if role not in PROJECT_ROLES:
        raise InvalidRequest(
            f"a project role is one of {', '.join(PROJECT_ROLES)}",
            {"fields": {"json": {"role": [f"one of {', '.join(PROJECT_ROLES)}"]}}},
        )
    with write_transaction():
        if Project.get_or_none_by_id(key) is None:
            raise NotFound(f"project {key} not found")
        user = User.get_or_none(User.login == login)
        if user is None:
            raise NotFound(f"user {login} not found")
        ProjectMember.insert(project=key, user_id=user.id, role=role, bound=False).on_conflict(
            conflict_target=[ProjectMember.project, ProjectMember.user_id],
            update={ProjectMember.role: role, ProjectMember.bound: False},
        ).execute()
        if user.default_project is None:
            user.default_project = key
            user.save()
        record_event(now, "project.member", "project", key, f"{login} is {role} of {key}")
    return {"project": key, "login": login, "role": role}


def remove_member(principal, now, key, login):
    may_manage(principal, key)
    with write_transaction():
        user = User.get_or_none(User.login == login)
        if (
            user is None
            or not ProjectMember.delete()
            .where((ProjectMember.project == key) & (ProjectMember.user_id == user.id))
            .execute()
        ):
            raise NotFound(f"{login} is not a member of project {key}")
        if user.default_project == key:
            user.default_project = None
            user.save()
        record_event(
            now, "project.member", "project", key, f"{login} is no longer a member of {key}"
        )


def list_members(principal, key):
    get_project(principal, key)
    rows = (
        ProjectMember.select(
            ProjectMember.project, ProjectMember.role, User.login, User.display_name
        )
        .join(User, on=(User.id == ProjectMember.user_id))
        .where(ProjectMember.project == key)
        .order_by(User.login)
        .dicts()
    )
    return list(rows)


def create_service_account(principal, now, key, name, expires_in_seconds):
    """A token owned by the project (no user), role member there, that expires: for CI. Returns
    (row, token); the token is shown once."""
    may_manage(principal, key)
    problem = token_name_problem(name)
    if problem:
        raise InvalidRequest(problem, {"fields": {"json": {"name": [problem]}}})
    token_id, token = make_token(API_PREFIX)
    with write_transaction():
        project = Project.get_or_none_by_id(key)
        if project is None:
            raise NotFound(f"project {key} not found")
        row = ApiToken.create(
            id=token_id,
            name=name,
            role=Role.MEMBER.value,
            team=project.team,
            token_hash=hash_token(token),
            created_at=now,
            expires_at=now + dt.timedelta(seconds=expires_in_seconds),
            project=key,
        )
        record_event(
            now, "project.service_account", "project", key, f"service account {name} made for {key}"
        )
    return row, token


def list_service_accounts(principal, key):
    may_manage(principal, key)
    return list(
        ApiToken.select()
        .where((ApiToken.project == key) & ApiToken.user_id.is_null())
        .order_by(ApiToken.created_at)
    )
