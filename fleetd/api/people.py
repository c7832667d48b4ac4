"""Users, projects (with their members and service accounts), and who is calling."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import (
    ADMIN,
    ANY_ROLE,
    MEMBER,
    OPERATOR,
    SUBMITTER,
    VIEWER,
    current_principal,
    require,
)
from fleetd.models import User
from fleetd.runtime import current_runtime
from fleetd.schemas.common import PageQuerySchema
from fleetd.schemas.people import (
    MemberListSchema,
    MemberPutSchema,
    MemberSchema,
    ProjectCreateSchema,
    ProjectPageSchema,
    ProjectPatchSchema,
    ProjectSchema,
    ServiceAccountCreatedSchema,
    ServiceAccountCreateSchema,
    ServiceAccountListSchema,
    UserPageSchema,
    UserPatchSchema,
    UserQuerySchema,
    UserSchema,
    WhoamiSchema,
)
from fleetd.services.identity import limits, projects, users

PEOPLE = (
    ADMIN,
    OPERATOR,
    MEMBER,
    SUBMITTER,
    VIEWER,
)  # every role a person (or a service account) may have

blp = Blueprint(
    "people", __name__, url_prefix="/api/v1", description="Users, projects and who is calling"
)


def whoami():
    """What GET /api/v1/whoami and /api/v1/auth/whoami answer."""
    p = current_principal()
    user = User.get_or_none_by_id(p.user_id) if p.user_id else None
    if p.user_id is not None:
        roles = projects.project_roles(p.user_id)
    else:
        roles = [{"key": p.project, "role": "member"}] if p.project else []
    return {
        "principal": p.label,
        "role": p.role,
        "team": p.team,
        "node_id": p.node_id,
        "user": user,
        "projects": roles,
        "default_project": p.default_project,
        "auth": {"api": "token", "session": "session", "jwt": "jwt"}.get(p.kind),
        "tokens": users.own_tokens(p.user_id, current_runtime().clock.now()) if p.user_id else [],
        **limits.limits_of(current_runtime().settings, p),
    }


@blp.route("/whoami")
class Whoami(MethodView):
    @require(*ANY_ROLE)
    @blp.response(200, WhoamiSchema)
    def get(self):
        """Who the presented token belongs to: its user and projects, its role, and for a user's
        token or session the limits that hold and what it holds."""
        return whoami()


@blp.route("/auth/whoami")
class AuthWhoami(MethodView):
    @require(*ANY_ROLE)
    @blp.response(200, WhoamiSchema)
    def get(self):
        """The same as GET /api/v1/whoami."""
        return whoami()


@blp.route("/users")
class Users(MethodView):
    @require(ADMIN)
    @blp.arguments(UserQuerySchema(), location="query")
    @blp.response(200, UserPageSchema)
    def get(self, query):
        """List users (`active`: only those that are, or are not)."""
        items, next_cursor = users.list_users(query["limit"], query["cursor"], query["active"])
        return {"items": items, "next_cursor": next_cursor}


@blp.route("/users/<string:login>")
class UserByLogin(MethodView):
    @require(*PEOPLE)
    @blp.response(200, UserSchema)
    def get(self, login):
        """A user: admins read any, others themselves."""
        return users.get_user(current_principal(), login)

    @require(ADMIN)
    @blp.arguments(UserPatchSchema(), required=False)
    @blp.response(200, UserSchema)
    def patch(self, body, login):
        """Change a user's role, default project or `active` (false ends its sessions and tokens at
        once)."""
        rt = current_runtime()
        return users.update_user(rt, rt.clock.now(), login, body)

    @require(ADMIN)
    @blp.response(204)
    def delete(self, login):
        """Deactivate a user and take its project memberships away; its work and usage keep its
        name."""
        rt = current_runtime()
        users.delete_user(rt, rt.clock.now(), login)


@blp.route("/projects")
class Projects(MethodView):
    @require(*PEOPLE)
    @blp.arguments(PageQuerySchema(), location="query")
    @blp.response(200, ProjectPageSchema)
    def get(self, query):
        """List projects: every one for admins, operators and viewers; a member's own."""
        items, next_cursor = projects.list_projects(
            current_principal(), query["limit"], query["cursor"]
        )
        return {"items": items, "next_cursor": next_cursor}

    @require(ADMIN)
    @blp.arguments(ProjectCreateSchema())
    @blp.response(201, ProjectSchema)
    def post(self, body):
        """Create a project in a team."""
        return projects.create_project(current_runtime().clock.now(), **body)


@blp.route("/projects/<string:key>")
class ProjectByKey(MethodView):
    @require(*PEOPLE)
    @blp.response(200, ProjectSchema)
    def get(self, key):
        """A project its members (and admins, operators, viewers) may read."""
        return projects.get_project(current_principal(), key)

    @require(ADMIN)
    @blp.arguments(ProjectPatchSchema(), required=False)
    @blp.response(200, ProjectSchema)
    def patch(self, body, key):
        """Change a project's names, team or description."""
        return projects.update_project(current_runtime().clock.now(), key, body)

    @require(ADMIN)
    @blp.response(204)
    def delete(self, key):
        """Delete a project that holds no live work (409 otherwise); its service accounts are
        revoked."""
        projects.delete_project(current_runtime().clock.now(), key)


@blp.route("/projects/<string:key>/members")
class Members(MethodView):
    @require(*PEOPLE)
    @blp.response(200, MemberListSchema)
    def get(self, key):
        """A project's members and their roles in it."""
        return {"items": projects.list_members(current_principal(), key)}


@blp.route("/projects/<string:key>/members/<string:login>")
class Member(MethodView):
    @require(ADMIN, MEMBER, SUBMITTER)
    @blp.arguments(MemberPutSchema())
    @blp.response(200, MemberSchema)
    def put(self, body, key, login):
        """Make a user a member of the project with a role (an admin, or an admin of the
        project)."""
        return projects.set_member(
            current_principal(), current_runtime().clock.now(), key, login, body["role"]
        )

    @require(ADMIN, MEMBER, SUBMITTER)
    @blp.response(204)
    def delete(self, key, login):
        """Take a user out of the project."""
        projects.remove_member(current_principal(), current_runtime().clock.now(), key, login)


@blp.route("/projects/<string:key>/service-accounts")
class ServiceAccounts(MethodView):
    @require(ADMIN, MEMBER, SUBMITTER)
    @blp.response(200, ServiceAccountListSchema)
    def get(self, key):
        """A project's service accounts (never their secrets)."""
        return {"items": projects.list_service_accounts(current_principal(), key)}

    @require(ADMIN, MEMBER, SUBMITTER)
    @blp.arguments(ServiceAccountCreateSchema())
    @blp.response(201, ServiceAccountCreatedSchema)
    def post(self, body, key):
        """A token of the project, role member there, that expires: for CI. The token is shown
        once."""
        row, token = projects.create_service_account(
            current_principal(),
            current_runtime().clock.now(),
            key,
            body["name"],
            body["expires_in_seconds"],
        )
        row.token = token
        return row
