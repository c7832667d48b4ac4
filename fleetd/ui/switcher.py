"""The header's project switcher: the projects a principal may submit to, and the one it chose,
kept in the UI's session and used as the default project of the deploy forms."""

from flask import session

from fleetd.credentials import ADMIN
from fleetd.services.identity import projects

SESSION_KEY = "project"
CHOICES_SHOWN = 200  # an admin without a user picks among the first projects by key


def choices(principal):
    """[{key, role}] the principal may pick: its user's projects; a service account's one project;
    for an admin's token without a user, every project (an admin submits anywhere)."""
    if principal is None:
        return []
    if principal.user_id is not None:
        return projects.project_roles(principal.user_id)
    if principal.project is not None:
        return [{"key": principal.project, "role": "member"}]
    if principal.role == ADMIN:
        rows, _ = projects.list_projects(principal, CHOICES_SHOWN)
        return [{"key": p.key, "role": ADMIN} for p in rows]
    return []


def chosen(principal):
    """The project the session chose, while it is still one of the principal's choices; else the
    principal's default project (None: the service decides)."""
    keys = [c["key"] for c in choices(principal)]
    picked = session.get(SESSION_KEY)
    if isinstance(picked, str) and picked in keys:
        return picked
    return principal.default_project if principal is not None else None


def choose(principal, key):
    """Keep `key` as the session's project (None or "": forget the choice). ValueError when the
    principal may not pick it."""
    if not key:
        session.pop(SESSION_KEY, None)
        return
    if key not in [c["key"] for c in choices(principal)]:
        raise ValueError(f"you have no project {key[:64]!r} to switch to")
    session[SESSION_KEY] = key
