"""/scim/v2: SCIM 2.0 (RFC 7644) for an identity provider's provisioning client, with a token of
role `scim`. Bodies are SCIM's (application/scim+json), and so are errors: every error here,
authentication's included, is a SCIM Error message, not fleetd's envelope."""

import logging

from flask import Blueprint, Response, json, request
from scim2_models import Context, Error
from scim2_models.exceptions import SCIMException
from werkzeug.exceptions import HTTPException

from fleetd.api.parser import BadJson, loads
from fleetd.auth import SCIM, require
from fleetd.errors import FleetdError
from fleetd.runtime import current_runtime
from fleetd.services.identity import scim, scim_read

log = logging.getLogger(__name__)
blp = Blueprint("scim", __name__, url_prefix="/scim/v2")
CONTENT_TYPE = "application/scim+json"
_DISCOVERY = ("ServiceProviderConfig", "Schemas", "ResourceTypes")
_VERBS = {
    "User": (scim.create_user, scim.replace_user, scim.patch_user, scim.delete_user),
    "Group": (scim.create_group, scim.replace_group, scim.patch_group, scim.delete_group),
}


def _answer(body, status=200, headers=None):
    return Response(json.dumps(body), status, headers, content_type=CONTENT_TYPE)


def _error(status, detail, scim_type=None, headers=None):
    error = Error(status=status, detail=detail, scim_type=scim_type)
    return _answer(error.model_dump(scim_ctx=Context.DEFAULT), status, headers)


@blp.errorhandler(SCIMException)
def _scim_error(exc):
    return _error(exc.status, str(exc), exc.scim_type or None)


@blp.errorhandler(FleetdError)
def _fleetd_error(exc):
    """Authentication, roles, rate limits and bad URLs, as SCIM errors."""
    scim_type = "invalidValue" if exc.http_status == 400 else None
    return _error(exc.http_status, exc.message, scim_type, exc.headers)


@blp.errorhandler(HTTPException)
def _http_error(exc):
    status = exc.code or 500
    if status >= 500:
        return _error(500, "internal server error")
    return _error(status, exc.description if isinstance(exc.description, str) else exc.name)


@blp.errorhandler(Exception)
def _unexpected(exc):
    log.error("unhandled error", exc_info=exc)
    return _error(500, "internal server error")


def _base():
    public = current_runtime().settings.public_url
    return (public or request.url_root).rstrip("/") + "/scim/v2"


def _body():
    try:
        body = loads(request.get_data())
    except BadJson as exc:
        raise _syntax(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _syntax("the body is a JSON object")
    return body


def _syntax(detail):
    exc = SCIMException(detail=detail)
    exc.scim_type = "invalidSyntax"
    return exc


def _list(items):
    return {
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:ListResponse"],
        "totalResults": len(items),
        "startIndex": 1,
        "itemsPerPage": len(items),
        "Resources": items,
    }


# ---------------------------------------------------------------- discovery


@blp.route("/ServiceProviderConfig", methods=["GET"])
@require(SCIM)
def service_provider_config():
    return _answer(scim_read.service_provider_config(_base()))


@blp.route("/Schemas", methods=["GET"])
@require(SCIM)
def schemas():
    return _answer(_list(scim_read.schemas(_base())))


@blp.route("/Schemas/<string:urn>", methods=["GET"])
@require(SCIM)
def schema(urn):
    return _answer(scim_read.schema(_base(), urn))


@blp.route("/ResourceTypes", methods=["GET"])
@require(SCIM)
def resource_types():
    return _answer(_list(scim_read.resource_types(_base())))


@blp.route("/ResourceTypes/<string:name>", methods=["GET"])
@require(SCIM)
def resource_type(name):
    return _answer(scim_read.resource_type(_base(), name))


# ---------------------------------------------------------------- users and groups


def _query_params():
    names = ("filter", "startIndex", "count", "attributes", "excludedAttributes")
    return {name: request.args[name] for name in names if name in request.args}


def _page(kind, params):
    search = scim_read.search_request(kind, params)
    page = scim_read.list_resources(kind, _base(), search)
    return _answer(page.model_dump(scim_ctx=Context.SEARCH_RESPONSE, response_parameters=search))


def _collection(kind):
    if request.method == "GET":
        return _page(kind, _query_params())
    rt = current_runtime()
    created = _VERBS[kind][0](rt, rt.clock.now(), _base(), _body())
    return _answer(
        created.model_dump(scim_ctx=Context.RESOURCE_CREATION_RESPONSE),
        201,
        {"Location": created.meta.location},
    )


def _resource(kind, resource_id):
    rt = current_runtime()
    _create, replace, patch, delete = _VERBS[kind]
    if request.method == "DELETE":
        delete(rt, rt.clock.now(), resource_id)
        return Response(status=204)
    if request.method == "GET":
        search = scim_read.search_request(kind, _query_params())
        get = scim_read.get_user if kind == "User" else scim_read.get_group
        found = get(_base(), resource_id)
        return _answer(
            found.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE, response_parameters=search)
        )
    if request.method == "PUT":
        done, ctx = (
            replace(rt, rt.clock.now(), _base(), resource_id, _body()),
            Context.RESOURCE_REPLACEMENT_RESPONSE,
        )
    else:
        done, ctx = (
            patch(rt, rt.clock.now(), _base(), resource_id, _body()),
            Context.RESOURCE_PATCH_RESPONSE,
        )
    return _answer(done.model_dump(scim_ctx=ctx))


@blp.route("/Users", methods=["GET", "POST"])
@require(SCIM)
def users():
    return _collection("User")


@blp.route("/Groups", methods=["GET", "POST"])
@require(SCIM)
def groups():
    return _collection("Group")


@blp.route("/Users/.search", methods=["POST"])
@require(SCIM)
def search_users():
    return _page("User", _body())


@blp.route("/Groups/.search", methods=["POST"])
@require(SCIM)
def search_groups():
    return _page("Group", _body())


@blp.route("/.search", methods=["POST"])
@require(SCIM)
def search():
    """Users and groups at once (RFC 7644, 3.4.3)."""
    body = _body()
    request_model = scim_read.search_request(None, body)
    page = scim_read.search_all(_base(), request_model)
    return _answer(
        page.model_dump(scim_ctx=Context.SEARCH_RESPONSE, response_parameters=request_model)
    )


@blp.route("/Users/<string:resource_id>", methods=["GET", "PUT", "PATCH", "DELETE"])
@require(SCIM)
def user(resource_id):
    return _resource("User", resource_id)


@blp.route("/Groups/<string:resource_id>", methods=["GET", "PUT", "PATCH", "DELETE"])
@require(SCIM)
def group(resource_id):
    return _resource("Group", resource_id)


@blp.route("/", defaults={"rest": ""}, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@blp.route("/<path:rest>", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@require(SCIM)
def unknown(rest):
    """Anything else under /scim/v2: 405 for a discovery endpoint's other methods, else 404."""
    if rest.split("/", 1)[0] in _DISCOVERY:
        return _error(405, f"/{rest} takes GET only", headers={"Allow": "GET"})
    if rest.split("/", 1)[0] in ("Users", "Groups"):
        return _error(405, f"{request.method} /{rest} is not supported")
    return _error(404, f"no SCIM endpoint /{rest}")
