"""Health."""

from flask.views import MethodView

from fleetd import __version__
from fleetd.api.parser import Blueprint
from fleetd.runtime import current_runtime
from fleetd.schemas.tokens import HealthSchema

blp = Blueprint("health", __name__, url_prefix="/api/v1", description="Health and identity")


@blp.route("/health")
class Health(MethodView):
    @blp.doc(security=[])
    @blp.response(200, HealthSchema)
    def get(self):
        """Liveness of fleetd itself, and its place among the replicas; needs no token."""
        return {"status": "ok", "version": __version__, **current_runtime().leader.status()}
