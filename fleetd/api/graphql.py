"""POST /graphql (and GET for queries): the GraphQL schema of fleetd.gql over the same services as
the REST routes, with the same roles. Errors come in GraphQL's `errors` array, each with the REST
error code in `extensions.code`."""

import logging

from ariadne import graphql_sync
from flask import Blueprint, jsonify, request
from flask.views import MethodView
from graphql import GraphQLError
from werkzeug.exceptions import MethodNotAllowed

from fleetd.api.parser import BadJson, loads
from fleetd.auth import ADMIN, SUBMITTER, current_principal, require
from fleetd.errors import FleetdError, InvalidRequest, handle_error
from fleetd.gql import limits
from fleetd.gql.schema import SCHEMA
from fleetd.runtime import current_runtime

log = logging.getLogger(__name__)
# Ariadne logs every error of a request, a not_found as loudly as a crash: format_error below logs
# the unexpected ones itself, and Ariadne's own lines go nowhere.
_ARIADNE_LOG = logging.getLogger("fleetd.graphql.ariadne")
_ARIADNE_LOG.propagate = False
_ARIADNE_LOG.addHandler(logging.NullHandler())

blp = Blueprint("graphql", __name__)


def format_error(error, debug=False):
    """A GraphQL error with `extensions.code`: a FleetdError's code and details, invalid_request for
    a document that does not parse or validate or a variable of the wrong type, internal (logged,
    never shown) for anything else."""
    formatted = dict(error.formatted)
    original = error.original_error
    while (
        getattr(original, "original_error", None) is not None
    ):  # a GraphQLError wrapping the cause
        original = original.original_error
    if isinstance(original, FleetdError):
        formatted["message"] = original.message
        formatted["extensions"] = {
            "code": original.code,
            **({"details": original.details} if original.details else {}),
        }
    elif original is None or isinstance(
        original, GraphQLError
    ):  # GraphQL's own: a variable of the wrong type
        formatted["extensions"] = {"code": "invalid_request"}
    else:
        log.error("unhandled error in a GraphQL resolver", exc_info=original)
        formatted["message"] = "internal server error"
        formatted["extensions"] = {"code": "internal"}
    return formatted


def _as_graphql_error(error):
    """An error raised before the document ran (authentication, roles, rate limits, the body) in
    GraphQL's shape, with the status the REST routes give it."""
    body, status, headers = handle_error(error)
    extensions = {"code": body["error"]["code"]}
    if body["error"].get("details"):
        extensions["details"] = body["error"]["details"]
    response = jsonify(
        {"errors": [{"message": body["error"]["message"], "extensions": extensions}]}
    )
    response.headers.update(headers)
    return response, status


blp.register_error_handler(Exception, _as_graphql_error)


def _request_data():
    """{query, variables, operationName} from a JSON body (POST) or the query string (GET)."""
    if request.method == "GET":
        data = {k: request.args.get(k) for k in ("query", "operationName")}
        if request.args.get("variables"):
            data["variables"] = _json(request.args["variables"])
        return data
    if not request.is_json:
        raise InvalidRequest("send the GraphQL request as JSON (Content-Type: application/json)")
    return _json(request.get_data())


def _json(text):
    try:
        data = loads(text)
    except BadJson as exc:
        raise InvalidRequest(str(exc)) from None
    if not isinstance(data, dict):
        raise InvalidRequest(
            "the GraphQL request is a JSON object: {query, variables?, operationName?}"
        )
    return data


def _prepare(data, query_only, rt):
    """The document parsed, bounded and validated (fleetd.gql.limits) in a worker thread, so that no
    document holds the event loop: a refusal is a 400 naming the limit; a mutation sent by GET
    405."""
    query, operation = data.get("query"), data.get("operationName")
    if not isinstance(query, str) or not query:
        return None  # Ariadne answers it in GraphQL's words
    try:
        limits.check_size(query)  # before the body's text goes anywhere
        prepared = rt.offload(
            limits.prepare, SCHEMA, query, operation if isinstance(operation, str) else None
        )
    except limits.Refused as exc:
        raise InvalidRequest(str(exc)) from None
    except GraphQLError:
        return None  # a syntax error: Ariadne parses it again and reports it in GraphQL's words
    if query_only and prepared.mutation:
        raise MethodNotAllowed(["POST"], "a mutation runs by POST; GET runs queries only")
    return prepared


def _run(query_only):
    data = _request_data()
    rt = current_runtime()
    prepared = _prepare(data, query_only, rt)
    checked = (
        {}
        if prepared is None
        else {
            "query_document": prepared.document,
            "query_validator": lambda *_args, **_kwargs: prepared.errors,
        }
    )
    _, result = graphql_sync(
        SCHEMA,
        data,
        context_value={"rt": rt, "principal": current_principal()},
        require_query=query_only,
        introspection=True,
        error_formatter=format_error,
        logger=_ARIADNE_LOG,
        **checked,
    )
    # Nothing ran (the document did not parse or validate, or named no single operation): 400.
    return jsonify(result), 400 if result.get("data") is None else 200


class GraphQL(MethodView):
    @require(ADMIN, SUBMITTER)
    def get(self):
        """Run a GraphQL query (no mutation) given as ?query=&variables=&operationName=."""
        return _run(query_only=True)

    @require(ADMIN, SUBMITTER)
    def post(self):
        """Run a GraphQL query or mutation given as a JSON body {query, variables?,
        operationName?}."""
        return _run(query_only=False)


blp.add_url_rule("/graphql", view_func=GraphQL.as_view("graphql"))
