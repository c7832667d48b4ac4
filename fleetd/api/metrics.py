"""Prometheus metrics and the metrics history."""

from flask import Response
from flask.views import MethodView
from marshmallow import Schema, fields
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, METRICS, SUBMITTER, require
from fleetd.runtime import current_runtime
from fleetd.schemas.common import Int
from fleetd.services.fleet_ops import metrics

blp = Blueprint("metrics", __name__, description="Prometheus metrics and history")


class HistoryQuerySchema(Schema):
    minutes = Int(minimum=1, maximum=metrics.MAX_HISTORY_MINUTES, load_default=60, strict=False)


class HistorySchema(Schema):
    minutes = fields.Integer()
    samples = fields.List(fields.Dict())
    gpus = fields.List(fields.Dict())


@blp.route("/metrics")
class PrometheusMetrics(MethodView):
    @require(ADMIN, SUBMITTER, METRICS)
    @blp.response(200, content_type=CONTENT_TYPE_LATEST)
    def get(self):
        """Prometheus text format: nodes, GPUs per series and state, jobs, latencies, DCGM-named GPU
        gauges."""
        return Response(
            generate_latest(current_runtime().instruments.registry), mimetype=CONTENT_TYPE_LATEST
        )


@blp.route("/api/v1/metrics/history")
class MetricsHistory(MethodView):
    @require(ADMIN, SUBMITTER, METRICS)
    @blp.arguments(HistoryQuerySchema(), location="query")
    @blp.response(200, HistorySchema)
    def get(self, query):
        """Cluster and per-GPU samples of the last `minutes` (at most 24 h)."""
        return metrics.history(current_runtime(), query["minutes"])
