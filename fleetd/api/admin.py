"""Administration: background tasks."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, require
from fleetd.runtime import current_runtime
from fleetd.schemas.admin import (
    BackgroundTaskPageSchema,
    BackgroundTaskSchema,
    GcResultSchema,
    GcSchema,
)
from fleetd.services.fleet_ops import retention

blp = Blueprint("admin", __name__, url_prefix="/api/v1/admin", description="Administration")


@blp.route("/tasks")
class BackgroundTasks(MethodView):
    @require(ADMIN)
    @blp.response(200, BackgroundTaskPageSchema)
    def get(self):
        """Background tasks with their last run and next run."""
        return {"items": current_runtime().tasks.list(), "next_cursor": None}


@blp.route("/tasks/<string:name>/run")
class BackgroundTaskRun(MethodView):
    @require(ADMIN)
    @blp.response(200, BackgroundTaskSchema)
    def post(self, name):
        """Run a background task now; returns the record of this run."""
        return current_runtime().tasks.run(name)


@blp.route("/gc")
class GarbageCollection(MethodView):
    @require(ADMIN)
    @blp.arguments(GcSchema(), required=False)
    @blp.response(200, GcResultSchema)
    def post(self, body):
        """Remove old metric samples and, with delete_jobs, ended jobs and unreferenced
        artifacts."""
        return retention.collect_garbage(current_runtime(), **body)
