"""Cluster capacity, schedule simulation, GPU types and quotas."""

from flask import request
from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, METRICS, SUBMITTER, current_principal, require
from fleetd.runtime import current_runtime
from fleetd.schemas.cluster import (
    SIMULATE_BODY,
    AllocationQuerySchema,
    ClusterAllocationSchema,
    ClusterStatusQuerySchema,
    ClusterStatusSchema,
    GpuTypePageSchema,
    GpuTypeQuerySchema,
    GpuTypeSchema,
    GpuTypeUpdateSchema,
    QuotaDeleteQuerySchema,
    QuotaPageSchema,
    QuotaSchema,
    QuotaUpdateSchema,
    SimulateSpecSchema,
    SimulationSchema,
)
from fleetd.services.fleet_ops import metrics
from fleetd.services.placement import capacity, policy, status
from fleetd.services.placement.cluster import current_state

blp = Blueprint(
    "cluster", __name__, url_prefix="/api/v1", description="Capacity, scheduling policy"
)


def _state():
    rt = current_runtime()
    return current_state(rt)


@blp.route("/cluster/status")
class ClusterStatus(MethodView):
    @require(ADMIN, SUBMITTER, METRICS)
    @blp.arguments(ClusterStatusQuerySchema(), location="query")
    @blp.response(200, ClusterStatusSchema)
    def get(self, query):
        """GPUs used, free and blocked (total = used + free + blocked), queued demand, running
        jobs and instances (`active_limit` of each listed, all counted)."""
        principal = current_principal()
        storage = metrics.storage_view(current_runtime()) if principal.role == ADMIN else {}
        return status.cluster_status(
            _state(), principal, storage, current_runtime().offload, query["active_limit"]
        )


@blp.route("/cluster/allocation")
class ClusterAllocation(MethodView):
    @require(ADMIN)
    @blp.arguments(AllocationQuerySchema(), location="query")
    @blp.response(200, ClusterAllocationSchema)
    def get(self, query):
        """Every GPU with its reservations, every node, every task's allocation (of one node with
        ?node_id=)."""
        return current_runtime().offload(capacity.cluster_allocation, _state(), query["node_id"])


@blp.route("/cluster/simulate-schedule")
class SimulateSchedule(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.doc(requestBody=SIMULATE_BODY)
    @blp.response(200, SimulationSchema)
    def post(self):
        """Where this JobSpec or InstanceSpec would be placed now, or per node why not; reserves
        nothing."""
        # Parsed here, not by @blp.arguments: the document states the body as either spec (anyOf).
        spec = blp.ARGUMENTS_PARSER.parse(SimulateSpecSchema(), request, location="json")
        return policy.simulate(current_runtime(), current_principal(), spec)


@blp.route("/gpu-types")
class GpuTypes(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, GpuTypePageSchema)
    def get(self):
        """GPU models in the fleet with capacity, availability and prices."""
        return {"items": capacity.gpu_types(_state()), "next_cursor": None}


@blp.route("/gpu-types/<path:model>")
class GpuTypeByModel(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(GpuTypeQuerySchema(), location="query")
    @blp.response(200, GpuTypeSchema)
    def get(self, query, model):
        """One GPU model by its id (the model name); with ?gpu_count=, its lowest prices for that
        many GPUs."""
        return capacity.get_gpu_type(_state(), model, query["gpu_count"])

    @require(ADMIN)
    @blp.arguments(GpuTypeUpdateSchema(), required=False)
    @blp.response(200, GpuTypeSchema)
    def put(self, body, model):
        """Set the price per hour and the spot minimum bid of a GPU model."""
        policy.set_gpu_type(current_runtime(), model[:128], **body)
        return next(t for t in capacity.gpu_types(_state()) if t["model"] == model[:128])

    @require(ADMIN)
    @blp.response(204)
    def delete(self, model):
        """Forget a GPU model's prices."""
        policy.delete_gpu_type(current_runtime(), model)


@blp.route("/quotas")
class Quotas(MethodView):
    @require(ADMIN)
    @blp.response(200, QuotaPageSchema)
    def get(self):
        """Team GPU quotas."""
        return {"items": policy.list_quotas(), "next_cursor": None}


@blp.route("/quotas/<string:team>")
class QuotaByTeam(MethodView):
    @require(ADMIN)
    @blp.arguments(QuotaUpdateSchema())
    @blp.response(200, QuotaSchema)
    def put(self, body, team):
        """Set the most GPUs a team's running jobs may hold (per priority class, or "any")."""
        return policy.set_quota(
            current_runtime(), team[:200], body["priority_class"], body["max_gpus"]
        )

    @require(ADMIN)
    @blp.arguments(QuotaDeleteQuerySchema(), location="query")
    @blp.response(204)
    def delete(self, query, team):
        """Remove a team's quota (one class with ?priority_class=, else all)."""
        policy.delete_quota(current_runtime(), team, query["priority_class"])
