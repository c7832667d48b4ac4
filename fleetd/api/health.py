"""Health and identity."""

from flask.views import MethodView

from fleetd import __version__
from fleetd.api.parser import Blueprint
from fleetd.auth import ANY_ROLE, current_principal, require
from fleetd.runtime import current_runtime
from fleetd.schemas.tokens import HealthSchema, WhoamiSchema
from fleetd.services.identity import limits

blp = Blueprint("health", __name__, url_prefix="/api/v1", description="Health and identity")


@blp.route("/health")
class Health(MethodView):
    @blp.doc(security=[])
    @blp.response(200, HealthSchema)
    def get(self):
        """Liveness of fleetd itself, and its place among the replicas; needs no token."""
        return {"status": "ok", "version": __version__, **current_runtime().leader.status()}


@blp.route("/whoami")
class Whoami(MethodView):
    @require(*ANY_ROLE)
    @blp.response(200, WhoamiSchema)
    def get(self):
        """Who the presented token belongs to, its role, and for an API token its limits and what it holds."""
        p = current_principal()
        return {"principal": p.label, "role": p.role, "team": p.team, "node_id": p.node_id,
                **limits.limits_of(current_runtime().settings, p)}
