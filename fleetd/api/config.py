"""The effective configuration of the answering fleetd process."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, require
from fleetd.runtime import current_runtime
from fleetd.schemas.config import EffectiveConfigSchema
from fleetd.services.fleet_ops.config import effective_config

blp = Blueprint("config", __name__, url_prefix="/api/v1", description="Configuration")


@blp.route("/config")
class Config(MethodView):
    @require(ADMIN)
    @blp.response(200, EffectiveConfigSchema)
    def get(self):
        """The settings this process runs with (defaults, the config file, FLEETD_* variables),
        secrets redacted."""
        return effective_config(current_runtime().settings)
