"""Who may read and change which work. Admins may everything; operators and viewers read every job
and instance; a member reads and changes its own work; a project's admin and viewers read the
project's work, and its admin may change it (cancel, stop, delete)."""

from fleetd.credentials import ADMIN, READ_ALL
from fleetd.models import ProjectMember
from fleetd.sql import Statement

_SEEING = ("admin", "viewer")  # project roles that read the project's whole work
_PROJECT_ROLE = Statement(
    lambda v: (
        ProjectMember.select(ProjectMember.role)
        .where((ProjectMember.project == v("project")) & (ProjectMember.user_id == v("user_id")))
        .limit(1)
    )
)


def readable(query, principal, owner_field, project_field):
    """`query` narrowed to the rows of work this principal may read."""
    if principal.role in READ_ALL:
        return query
    own = owner_field == principal.owner_id
    if principal.user_id is None:
        return query.where(own)
    seen = ProjectMember.select(ProjectMember.project).where(
        (ProjectMember.user_id == principal.user_id) & ProjectMember.role.in_(_SEEING)
    )
    return query.where(own | project_field.in_(seen))


def project_role(principal, project):
    """The principal's role in the project (admin, member, viewer), or None."""
    if principal.user_id is None or project is None:
        return None
    row = _PROJECT_ROLE.first(project=project, user_id=principal.user_id)
    return row.role if row is not None else None


def may_read(principal, owner_id, project):
    """True when this principal may read work of this owner in this project."""
    if principal.role in READ_ALL or owner_id == principal.owner_id:
        return True
    return project_role(principal, project) in _SEEING


def may_change(principal, owner_id, project):
    """True when this principal may cancel, stop, resume or delete work of this owner in this
    project."""
    if principal.role == ADMIN or owner_id == principal.owner_id:
        return True
    return project_role(principal, project) == "admin"
