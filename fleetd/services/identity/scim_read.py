"""SCIM 2.0 (RFC 7643, RFC 7644), the reading half: what fleetd publishes of itself (its service
provider configuration, schemas and resource types), the parsing of requests, and the users and
groups as SCIM resources, one or a filtered page of them. services.identity.scim writes them."""

import datetime as dt
import json
import re
from typing import Any

import pydantic
from scim2_models import (
    Context,
    Group,
    ListResponse,
    Meta,
    Resource,
    ResourceType,
    ScimFilter,
    SearchRequest,
    ServiceProviderConfig,
)
from scim2_models import User as ScimUserModel
from scim2_models.exceptions import InvalidValueException, NotFoundException, SCIMException

from fleetd.models import ScimGroup, ScimGroupMember, ScimUser, User

USER_ATTRIBUTES = ("userName", "name", "displayName", "emails", "active", "groups")
MAX_RESULTS = 200  # a page of a list holds at most this many resources
_USER_SCHEMA = ScimUserModel.to_schema()
_USER_SCHEMA.attributes = [a for a in _USER_SCHEMA.attributes or () if a.name in USER_ATTRIBUTES]
UserModel: Any = Resource.from_schema(_USER_SCHEMA)  # a model made at run time
_GROUP_SCHEMA = Group.to_schema()
_MODELS: dict[str, Any] = {"User": UserModel, "Group": Group}
_EQ_FILTER = re.compile(
    r'^\s*(userName|externalId|displayName)\s+eq\s+("(?:[^"\\]|\\.)*")\s*$', re.I
)


# ---------------------------------------------------------------- discovery


def service_provider_config(base):
    return ServiceProviderConfig.model_validate(
        {
            "documentationUri": None,
            "patch": {"supported": True},
            "bulk": {"supported": False, "maxOperations": 0, "maxPayloadSize": 0},
            "filter": {"supported": True, "maxResults": MAX_RESULTS},
            "changePassword": {"supported": False},
            "sort": {"supported": False},
            "etag": {"supported": False},
            "authenticationSchemes": [
                {
                    "type": "oauthbearertoken",
                    "name": "Bearer token",
                    "description": "A fleetd API token of role scim",
                    "primary": True,
                }
            ],
            "meta": {
                "resourceType": "ServiceProviderConfig",
                "location": _url(base, "ServiceProviderConfig"),
            },
        }
    ).model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)


def schemas(base):
    return [_schema(s, base) for s in (_USER_SCHEMA, _GROUP_SCHEMA)]


def schema(base, urn):
    for s in (_USER_SCHEMA, _GROUP_SCHEMA):
        if s.id == urn:
            return _schema(s, base)
    raise NotFoundException(detail=f"no schema {urn}")


def _schema(s, base):
    body = s.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
    body["meta"] = {"resourceType": "Schema", "location": _url(base, f"Schemas/{s.id}")}
    return body


def resource_types(base):
    return [resource_type(base, name) for name in ("User", "Group")]


def resource_type(base, name):
    model: Any = {"User": UserModel, "Group": Group}.get(name)
    if model is None:
        raise NotFoundException(detail=f"no resource type {name}")
    body = ResourceType.from_resource(model).model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
    body["meta"] = {"resourceType": "ResourceType", "location": _url(base, f"ResourceTypes/{name}")}
    return body


def _url(base, path):
    return f"{base.rstrip('/')}/{path}"


# ---------------------------------------------------------------- parsing


def parse(model, payload, ctx):
    """The payload as `model` in this context; invalidValue/invalidSyntax/mutability otherwise."""
    try:
        return model.model_validate(payload, scim_ctx=ctx)
    except pydantic.ValidationError as exc:
        raise invalid(exc) from None


def invalid(exc):
    first = exc.errors()[0]
    scim_type = first["type"][5:] if first["type"].startswith("scim_") else "invalidValue"
    where = ".".join(str(p) for p in first["loc"])
    error = InvalidValueException(detail=f"{where}: {first['msg']}" if where else first["msg"])
    error.scim_type = scim_type
    return error


def search_request(kind, params):
    """A SearchRequest from a list's query parameters (or a POST .search body)."""
    model: Any = {"User": UserModel, "Group": Group}.get(kind)
    message = SearchRequest[model] if model is not None else SearchRequest
    request = parse(message, params, Context.SEARCH_REQUEST)
    if request.count is not None and request.count < 0:
        request.count = 0
    return request


# ---------------------------------------------------------------- reading


def _meta(kind, row_id, created, updated, base):
    return Meta(
        resource_type=kind,
        created=created.replace(tzinfo=dt.timezone.utc),
        last_modified=updated.replace(tzinfo=dt.timezone.utc),
        location=_url(base, f"{kind}s/{row_id}"),
    )


def user_resource(row, user, base, groups=None):
    doc = dict(row.doc)
    if "active" in doc or not user.active:  # an admin may have deactivated it meanwhile
        doc["active"] = bool(user.active)
    if groups is None:
        groups = _groups_of([user.id]).get(user.id, [])
    if groups:
        doc["groups"] = [
            {"value": g.id, "$ref": _url(base, f"Groups/{g.id}"), "display": g.display_name}
            for g in groups
        ]
    resource = UserModel.model_validate(doc)
    resource.id, resource.meta = (
        user.id,
        _meta("User", user.id, row.created_at, row.updated_at, base),
    )
    return resource


def group_resource(row, base):
    resource = Group.model_validate(row.doc)
    resource.id, resource.meta = (
        row.id,
        _meta("Group", row.id, row.created_at, row.updated_at, base),
    )
    return resource


def _groups_of(user_ids):
    found: dict[str, list[Any]] = {}
    query: Any = (
        ScimGroup.select(ScimGroup.id, ScimGroup.display_name, ScimGroupMember.member_id)
        .join(ScimGroupMember, on=ScimGroupMember.group_id == ScimGroup.id)
        .where(ScimGroupMember.member_id.in_(user_ids))
        .objects()
    )
    for row in query:
        found.setdefault(row.member_id, []).append(row)
    return found


def dump(resource, ctx, request=None):
    return resource.model_dump(scim_ctx=ctx, response_parameters=request)


def get_user(base, user_id):
    row, user = scim_user(user_id)
    return user_resource(row, user, base)


def get_group(base, group_id):
    return group_resource(scim_group(group_id), base)


def scim_user(user_id):
    row = ScimUser.get_or_none_by_id(user_id)
    user = User.get_or_none_by_id(user_id) if row is not None else None
    if user is None:
        raise NotFoundException(detail=f"no user {user_id}")
    return row, user


def scim_group(group_id):
    row = ScimGroup.get_or_none_by_id(group_id)
    if row is None:
        raise NotFoundException(detail=f"no group {group_id}")
    return row


def list_resources(kind, base, request):
    """A ListResponse of the users or groups the request's filter selects, one page of them. An
    equality on userName, externalId or displayName is looked up; other filters are matched
    against every resource."""
    start = max(request.start_index or 1, 1)
    count = MAX_RESULTS if request.count is None else min(request.count, MAX_RESULTS)
    resources = _filtered(kind, base, request.filter)
    page = resources[start - 1 : start - 1 + count]
    model: Any = UserModel if kind == "User" else Group
    return ListResponse[model](
        total_results=len(resources), start_index=start, items_per_page=len(page), resources=page
    )


def _bound_filter(kind, text):
    model: Any = _MODELS[kind]
    return ScimFilter[model](text)


def search_all(base, request):
    """POST /.search: users, then groups, that the request's filter selects, one page of them."""
    start = max(request.start_index or 1, 1)
    count = MAX_RESULTS if request.count is None else min(request.count, MAX_RESULTS)
    resources = []
    for kind in ("User", "Group"):
        try:
            kind_filter = (
                _bound_filter(kind, str(request.filter)) if request.filter is not None else None
            )
        except (ValueError, SCIMException):
            continue  # a filter on attributes this resource type does not have selects none
        resources += _filtered(kind, base, kind_filter)
    page = resources[start - 1 : start - 1 + count]
    both: Any = UserModel | Group
    return ListResponse[both](
        total_results=len(resources), start_index=start, items_per_page=len(page), resources=page
    )


def _filtered(kind, base, scim_filter):
    text = str(scim_filter) if scim_filter is not None else None
    match = _EQ_FILTER.match(text) if text else None
    if kind == "User":
        query = ScimUser.select().order_by(ScimUser.created_at, ScimUser.user_id)
        if match and match.group(1).lower() == "username":
            query = query.where(ScimUser.user_name_key == json.loads(match.group(2)).lower())
        rows = list(query)
        users = {u.id: u for u in User.select().where(User.id.in_([r.user_id for r in rows]))}
        groups = _groups_of(list(users))
        resources = [
            user_resource(r, users[r.user_id], base, groups.get(r.user_id, []))
            for r in rows
            if r.user_id in users
        ]
    else:
        groups_query = ScimGroup.select().order_by(ScimGroup.created_at, ScimGroup.id)
        if match and match.group(1).lower() == "displayname":
            groups_query = groups_query.where(ScimGroup.display_name == json.loads(match.group(2)))
        resources = [group_resource(r, base) for r in groups_query]
    if scim_filter is None:
        return resources
    return [r for r in resources if scim_filter.match(r)]
