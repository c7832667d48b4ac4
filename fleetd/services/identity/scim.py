"""SCIM 2.0 provisioning (RFC 7643, RFC 7644): an identity provider creates, updates, deactivates
and deletes users, and keeps groups whose members feed the binding rules (claim `scim_groups`).

scim2-models parses and writes every SCIM message (resources, filters, PATCH operations, list
responses, errors); this module keeps the resources and maps them onto fleetd's users:

- A SCIM user is a fleetd user (source `scim`) whose id is its SCIM id. Its login is its userName
  in lower case (the part before `@` of an e-mail address), with characters a POSIX user name may
  not hold made `_`; its display name and email come from the resource; `active: false`
  deactivates it (its sessions end and its tokens are revoked at once; its running work stops
  or is kept, per `scim_deactivated_work`). The resource is kept as the provider wrote it, so what
  it reads back is what it wrote.
- SCIM sees and changes only the users it made: a login that belongs to a user fleetd got
  otherwise (a migrated token's, a sign-in's) is a uniqueness conflict, so SCIM can never take over
  or lock out a break-glass admin.
- DELETE deactivates the user and forgets its resource; its work and usage keep their owner, and a
  later POST of the same userName gives the same user back.
- After every change to a user or a group, the binding rules are applied again to the users it
  touches: they see the user's SCIM groups as `scim_groups` (and, for a user that signed in, its
  provider's groups, email and login as they were at its last sign-in). A user no rule gives a
  role has none: it exists, and may do nothing.
"""

import re
from typing import Any

import pydantic
from scim2_models import Context, Group, PatchOp
from scim2_models.exceptions import InvalidValueException, UniquenessException

from fleetd.db import write_transaction
from fleetd.models import (
    Instance,
    InstanceState,
    Job,
    JobState,
    ProjectMember,
    ScimGroup,
    ScimGroupMember,
    ScimUser,
    User,
    new_id,
)
from fleetd.services.identity import signin
from fleetd.services.identity.oidc import claim_names
from fleetd.services.identity.scim_read import (
    UserModel,
    group_resource,
    invalid,
    parse,
    scim_group,
    scim_user,
    user_resource,
)
from fleetd.services.identity.users import deactivate
from fleetd.services.notify.events import record_event
from fleetd.services.workloads import instances as workload_instances
from fleetd.services.workloads.lifecycle import owe_stops
from fleetd.services.workloads.runs import stop_job

_NOT_LOGIN = re.compile(r"[^a-z0-9_.-]")


# ---------------------------------------------------------------- users


def login_of(user_name):
    """The POSIX login of a userName (see the module's docstring)."""
    login = user_name.strip().lower().split("@", 1)[0]
    login = _NOT_LOGIN.sub("_", login)
    if not login or not ("a" <= login[0] <= "z" or login[0] == "_"):
        login = "_" + login
    return login[:32]


def create_user(rt, now, base, payload):
    resource = parse(UserModel, payload, Context.RESOURCE_CREATION_REQUEST)
    with write_transaction():
        key = resource.user_name.strip().lower()
        if ScimUser.get_or_none(ScimUser.user_name_key == key) is not None:
            raise UniquenessException(detail=f"a user with userName {resource.user_name!r} exists")
        login = login_of(resource.user_name)
        user = User.get_or_none(User.login == login)
        if user is not None and not (user.source == "scim" and user.scim_id is None):
            raise UniquenessException(
                detail=f"the login {login} belongs to a user fleetd did not get through SCIM"
            )
        if user is None:
            user = User.create(
                id=new_id(), login=login, role=signin.NO_ROLE, source="scim", created_at=now
            )
            record_event(now, "user.created", "user", user.id, f"user {login} made through SCIM")
        else:  # deleted through SCIM before: the same user again
            user.active, user.deactivated_at = True, None
            record_event(
                now, "user.activated", "user", user.id, f"user {login} made again through SCIM"
            )
        user.scim_id = user.id
        row = ScimUser.create(
            user_id=user.id, user_name_key=key, doc=_doc(resource), created_at=now, updated_at=now
        )
        stopped = _sync_user(user, resource, now)
    _after_user_change(rt, user, stopped, now)
    return user_resource(row, user, base)


def _change(model, payload, replace):
    """A function of the stored resource that gives the new one: a PUT's body, or the stored
    resource with a PATCH's operations applied."""
    if replace:
        resource = parse(model, payload, Context.RESOURCE_REPLACEMENT_REQUEST)
        return lambda old: resource
    message: Any = PatchOp  # parametrized by a model made at run time
    patch = parse(message[model], payload, Context.RESOURCE_PATCH_REQUEST)

    def patched(old):
        try:
            patch.patch(old)
        except pydantic.ValidationError as exc:
            raise invalid(exc) from None
        return old

    return patched


def replace_user(rt, now, base, user_id, payload):
    return _write_user(rt, now, base, user_id, _change(UserModel, payload, True))


def patch_user(rt, now, base, user_id, payload):
    return _write_user(rt, now, base, user_id, _change(UserModel, payload, False))


def _write_user(rt, now, base, user_id, change):
    with write_transaction():
        row, user = scim_user(user_id)
        resource = change(user_resource(row, user, base))
        key = resource.user_name.strip().lower()
        other = ScimUser.get_or_none(
            (ScimUser.user_name_key == key) & (ScimUser.user_id != user_id)
        )
        if other is not None:
            raise UniquenessException(detail=f"a user with userName {resource.user_name!r} exists")
        login = login_of(resource.user_name)
        if login != user.login:
            if User.select().where((User.login == login) & (User.id != user.id)).exists():
                raise UniquenessException(detail=f"the login {login} belongs to another user")
            record_event(now, "user.renamed", "user", user.id, f"user {user.login} is now {login}")
            user.login = login
        row.user_name_key, row.doc, row.updated_at = key, _doc(resource), now
        row.save()
        stopped = _sync_user(user, resource, now)
    _after_user_change(rt, user, stopped, now)
    return user_resource(row, user, base)


def _doc(resource):
    """What is kept of a resource: as written, less what fleetd sets (id, meta, groups)."""
    doc = resource.model_dump(scim_ctx=Context.RESOURCE_REPLACEMENT_REQUEST)
    for field in ("id", "meta", "groups"):
        doc.pop(field, None)
    return doc


def _sync_user(user, resource, now):
    """Bring the user to the resource (inside the caller's transaction): name, email, whether it
    is active, and what the binding rules give it. True when this deactivated it."""
    name = resource.name
    full = " ".join(filter(None, (name.given_name, name.family_name))) if name else ""
    user.display_name = (
        resource.display_name or (name.formatted if name else None) or full or user.login
    )[:200]
    emails = resource.emails or []
    email = next((e for e in emails if e.primary), emails[0] if emails else None)
    user.email = str(email.value)[:320] if email is not None and email.value else None
    user.external_id = resource.external_id
    deactivated = False
    if resource.active is False and user.active:
        deactivate(user, now, "deactivated through SCIM")
        deactivated = True
    elif resource.active is not False and not user.active:
        user.active, user.deactivated_at = True, None
        record_event(
            now, "user.activated", "user", user.id, f"user {user.login} activated through SCIM"
        )
    _rebind(user)
    return deactivated


def _rebind(user):
    """Apply the binding rules to the user again (inside the caller's transaction; saves it)."""
    claims = {signin.SCIM_GROUPS: signin.scim_groups_of(user.id)}
    provider = signin.provider_of(user)
    if provider is not None:
        names = claim_names(provider)
        claims.update(
            {
                names["groups"]: user.groups or [],
                names["email"]: user.email,
                names["login"]: user.login,
            }
        )
    name = provider.name if provider is not None else signin.SCIM_PROVIDER
    signin.apply_grant(user, signin.bind(signin.get_bindings(), name, claims))


def delete_user(rt, now, user_id):
    with write_transaction():
        row, user = scim_user(user_id)
        stopped = bool(user.active)
        if user.active:
            deactivate(user, now, "deleted through SCIM")
        row.delete_instance()
        user.scim_id, user.default_project = None, None
        user.save()
        ProjectMember.delete().where(ProjectMember.user_id == user.id).execute()
        for group_id in [
            m.group_id for m in ScimGroupMember.select().where(ScimGroupMember.member_id == user.id)
        ]:
            _drop_member(group_id, user.id, now)
    _after_user_change(rt, user, stopped, now)


def _after_user_change(rt, user, deactivated, now):
    rt.identities.forget(user.id)
    if deactivated and rt.settings.scim_deactivated_work == "stop":
        stop_work_of(rt, user, now)


def stop_work_of(rt, user, now):
    """Stop a deactivated user's queued and running jobs and its instances."""
    reason = f"user {user.login} was deactivated through SCIM"
    live = [JobState.QUEUED.value, JobState.RUNNING.value]
    with write_transaction():
        held = []
        for job in Job.select().where(
            (Job.owner_token_id == user.id) & Job.instance_id.is_null() & Job.state.in_(live)
        ):
            held += stop_job(rt, job, reason, now)
    owe_stops(rt, held)
    for inst in Instance.select(Instance.id, Instance.state).where(
        Instance.owner_token_id == user.id
    ):
        if InstanceState(inst.state).holds_run() or inst.state == InstanceState.INTERRUPTED.value:
            workload_instances.stop_by_fleetd(rt, inst.id, reason)


# ---------------------------------------------------------------- groups


def create_group(rt, now, base, payload):
    resource = parse(Group, payload, Context.RESOURCE_CREATION_REQUEST)
    with write_transaction():
        row = ScimGroup.create(
            id=new_id(),
            display_name=resource.display_name[:255],
            doc={},
            created_at=now,
            updated_at=now,
        )
        touched = _set_group(row, resource, now)
        record_event(now, "group.created", "group", row.id, f"SCIM group {row.display_name} made")
    _forget(rt, touched)
    return group_resource(row, base)


def replace_group(rt, now, base, group_id, payload):
    return _write_group(rt, now, base, group_id, _change(Group, payload, True))


def patch_group(rt, now, base, group_id, payload):
    return _write_group(rt, now, base, group_id, _change(Group, payload, False))


def _write_group(rt, now, base, group_id, change):
    with write_transaction():
        row = scim_group(group_id)
        resource = change(group_resource(row, base))
        row.display_name, row.updated_at = (resource.display_name or "")[:255], now
        touched = _set_group(row, resource, now)
    _forget(rt, touched)
    return group_resource(row, base)


def _set_group(row, resource, now):
    """Keep the group's resource and members (inside the caller's transaction) and bind its old
    and new members again; returns the users touched."""
    if not resource.display_name:
        raise InvalidValueException(detail="displayName: a group needs one")
    members = {}
    for member in resource.members or []:
        member_id = str(member.value or "")
        if ScimUser.get_or_none_by_id(member_id) is not None:
            members[member_id] = "User"
        elif member_id != row.id and ScimGroup.get_or_none_by_id(member_id) is not None:
            members[member_id] = "Group"
        else:
            raise InvalidValueException(detail=f"members: no user or group {member_id!r}")
    old = {
        m.member_id
        for m in ScimGroupMember.select().where(
            (ScimGroupMember.group_id == row.id) & (ScimGroupMember.kind == "User")
        )
    }
    ScimGroupMember.delete().where(ScimGroupMember.group_id == row.id).execute()
    for member_id, kind in members.items():
        ScimGroupMember.create(group_id=row.id, member_id=member_id, kind=kind)
    doc = resource.model_dump(scim_ctx=Context.RESOURCE_REPLACEMENT_REQUEST)
    for field in ("id", "meta"):
        doc.pop(field, None)
    row.doc = doc
    row.save()
    touched = old | {m for m, kind in members.items() if kind == "User"}
    for user in User.select().where(User.id.in_(list(touched))):
        _rebind(user)
    return touched


def _drop_member(group_id, member_id, now):
    """Take a deleted member out of a group's members (inside the caller's transaction)."""
    row = ScimGroup.get_by_id(group_id)
    doc = dict(row.doc)
    doc["members"] = [m for m in doc.get("members") or [] if m.get("value") != member_id] or None
    if doc["members"] is None:
        doc.pop("members")
    row.doc, row.updated_at = doc, now
    row.save()
    ScimGroupMember.delete().where(
        (ScimGroupMember.group_id == group_id) & (ScimGroupMember.member_id == member_id)
    ).execute()


def delete_group(rt, now, group_id):
    with write_transaction():
        row = scim_group(group_id)
        members = [
            m.member_id
            for m in ScimGroupMember.select().where(
                (ScimGroupMember.group_id == group_id) & (ScimGroupMember.kind == "User")
            )
        ]
        ScimGroupMember.delete().where(ScimGroupMember.group_id == group_id).execute()
        for parent in [
            m.group_id
            for m in ScimGroupMember.select().where(ScimGroupMember.member_id == group_id)
        ]:
            _drop_member(parent, group_id, now)
        row.delete_instance()
        for user in User.select().where(User.id.in_(members)):
            _rebind(user)
        record_event(
            now, "group.deleted", "group", group_id, f"SCIM group {row.display_name} deleted"
        )
    _forget(rt, members)


def _forget(rt, user_ids):
    for user_id in user_ids:
        rt.identities.forget(user_id)
