"""Administration: background tasks."""

from flask.views import MethodView
from flask_smorest import Blueprint

from fleetd.auth import ADMIN, require
from fleetd.runtime import current_runtime
from fleetd.schemas.admin import BackgroundTaskPageSchema, BackgroundTaskSchema

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
