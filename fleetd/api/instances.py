"""Instances: long-running reserved workloads."""

from flask import Response
from flask.views import MethodView

from fleetd.api.output import gzip_asked, text_stream
from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, SUBMITTER, current_principal, require
from fleetd.models import InstanceState
from fleetd.runtime import current_runtime
from fleetd.schemas.instances import (
    ConnectionQuerySchema,
    ConnectionSchema,
    InstancePageSchema,
    InstanceQuerySchema,
    InstanceSchema,
    InstanceSpecSchema,
    InstanceWaitSchema,
    ResumeSchema,
)
from fleetd.schemas.jobs import (
    EventQuerySchema,
    LogPageSchema,
    LogQuerySchema,
    OutputInfoSchema,
    OutputQuerySchema,
)
from fleetd.schemas.nodes import EventPageSchema
from fleetd.services.workloads import connections, instance_views, instances

blp = Blueprint(
    "instances",
    __name__,
    url_prefix="/api/v1",
    description="Instances (long-running reserved workloads)",
)


def _view(inst):
    return instance_views.instance_view(current_runtime(), inst)


@blp.route("/instances")
class Instances(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(InstanceQuerySchema(), location="query")
    @blp.response(200, InstancePageSchema)
    def get(self, query):
        """List instances (a submitter sees its own), oldest first; deleted ones only with
        state=deleted."""
        items, next_cursor = instances.list_instances(
            current_principal(),
            query["limit"],
            query["cursor"],
            query["state"],
            query["owner"],
            query["name"],
        )
        return {
            "items": instance_views.instance_views(current_runtime(), items),
            "next_cursor": next_cursor,
        }

    @require(ADMIN, SUBMITTER)
    @blp.arguments(InstanceSpecSchema())
    @blp.response(201, InstanceSchema)
    def post(self, spec):
        """Create an instance; it is placed as soon as it fits and holds its GPUs until stopped."""
        return _view(instances.create_instance(current_runtime(), current_principal(), spec))


@blp.route("/instances/<string:instance_id>")
class InstanceById(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(InstanceWaitSchema(), location="query")
    @blp.response(200, InstanceSchema)
    def get(self, query, instance_id):
        """An instance; with wait_seconds the answer comes as soon as its state changes."""
        return _view(
            instances.wait_instance(
                current_runtime(), current_principal(), instance_id, query["wait_seconds"]
            )
        )

    @require(ADMIN, SUBMITTER)
    @blp.response(
        202,
        InstanceSchema,
        description="the instance, `deleting` until its processes ended and its "
        "node removed its volume",
    )
    @blp.alt_response(204, description="the instance is gone: a GET of it answers 404")
    def delete(self, instance_id):
        """Delete an instance: its processes are stopped and its node deletes its volume."""
        inst = instances.delete_instance(current_runtime(), current_principal(), instance_id)
        if inst.state == InstanceState.DELETED.value:
            return Response(status=204)  # returned as it is, not dumped
        return _view(inst)


@blp.route("/instances/<string:instance_id>/stop")
class InstanceStop(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, InstanceSchema)
    def post(self, instance_id):
        """Stop an instance: processes end, GPUs are freed, the volume is kept."""
        return _view(instances.stop_instance(current_runtime(), current_principal(), instance_id))


@blp.route("/instances/<string:instance_id>/resume")
class InstanceResume(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(ResumeSchema())
    @blp.response(200, InstanceSchema)
    def post(self, body, instance_id):
        """Run a stopped, interrupted or failed instance again on the node that holds its volume."""
        return _view(
            instances.resume_instance(
                current_runtime(), current_principal(), instance_id, body["gpus"], body["bid"]
            )
        )


@blp.route("/instances/<string:instance_id>/connection")
class InstanceConnection(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(ConnectionQuerySchema(), location="query")
    @blp.response(200, ConnectionSchema)
    def get(self, query, instance_id):
        """Where one of its declared ports is reached; waits (wait_seconds) until it runs; 409 while
        stopped."""
        return connections.connection(
            current_runtime(),
            current_principal(),
            instance_id,
            query["port"],
            query["wait_seconds"],
        )


@blp.route("/instances/<string:instance_id>/logs")
class InstanceLogs(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(LogQuerySchema(), location="query")
    @blp.response(200, LogPageSchema)
    def get(self, query, instance_id):
        """Lines of every run's output in order of arrival; pass the last `seq` (or `next_cursor`)
        as `after` to follow."""
        items, next_cursor = instance_views.instance_logs(
            current_runtime(), current_principal(), instance_id, **query
        )
        return {"items": items, "next_cursor": next_cursor}


@blp.route("/instances/<string:instance_id>/output")
class InstanceOutput(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(OutputQuerySchema(), location="query")
    @blp.response(200, content_type="text/plain")
    def get(self, query, instance_id):
        """The whole output of every run as text (gzip with `gzip=true` or Accept-Encoding)."""
        pieces = instance_views.instance_output(
            current_runtime(), current_principal(), instance_id, **gzip_asked(query)
        )
        return text_stream(pieces, query)


@blp.route("/instances/<string:instance_id>/output/info")
class InstanceOutputInfo(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, OutputInfoSchema)
    def get(self, instance_id):
        """How much output the runs have, how much is stored, which lines nodes still hold."""
        return instance_views.instance_output_info(current_principal(), instance_id)


@blp.route("/instances/<string:instance_id>/events")
class InstanceEvents(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(EventQuerySchema(), location="query")
    @blp.response(200, EventPageSchema)
    def get(self, query, instance_id):
        """An instance's events, oldest first."""
        items, next_cursor = instance_views.instance_events(
            current_principal(), instance_id, query["limit"], query["cursor"], query["after"]
        )
        return {"items": items, "next_cursor": next_cursor}
