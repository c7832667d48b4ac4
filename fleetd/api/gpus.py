"""GPU boards by serial number: identity, history across hosts, RMA marks."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, OPERATOR, SUBMITTER, require
from fleetd.runtime import current_runtime
from fleetd.schemas.validation import (
    GpuPageSchema,
    GpuQuerySchema,
    GpuRecordSchema,
    GpuRmaSchema,
    HistoryQuerySchema,
)
from fleetd.services.nodes import gpus

blp = Blueprint("gpus", __name__, url_prefix="/api/v1/gpus", description="GPUs by serial number")


@blp.route("")
class Gpus(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(GpuQuerySchema(), location="query")
    @blp.response(200, GpuPageSchema)
    def get(self, query):
        """GPU boards by serial: every one fleetd has seen, or those marked for RMA (`rma`), marked
        and seen again in a node (`flagged`) or neither (`ok`); `model` narrows to one model."""
        items, next_cursor = gpus.list_gpus(
            query["limit"], query["cursor"], query["state"], query["model"]
        )
        return {"items": items, "next_cursor": next_cursor}


@blp.route("/<string:serial>")
class GpuBySerial(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(HistoryQuerySchema(), location="query")
    @blp.response(200, GpuRecordSchema)
    def get(self, query, serial):
        """A GPU by serial: identity, the node it is in, its RMA mark and its history (hosts, XIDs,
        ECC errors, validation verdicts, health actions), oldest first."""
        return gpus.get_gpu(serial, query["limit"])


@blp.route("/<string:serial>/rma")
class GpuRma(MethodView):
    @require(ADMIN)
    @blp.arguments(GpuRmaSchema())
    @blp.response(200, GpuRecordSchema)
    def post(self, body, serial):
        """Mark a GPU for RMA: it takes no more work, its node is drained for repair (undrained, the
        node validates first), and the board is flagged wherever it shows up again."""
        return gpus.mark_rma(current_runtime(), serial, body["reason"], body["deadline_seconds"])

    @require(ADMIN, OPERATOR)
    @blp.response(200, GpuRecordSchema)
    def delete(self, serial):
        """Clear a GPU's RMA mark (and flag): a repaired or replaced board returns to work; its
        node stays as the operator left it, and the history keeps the mark and its clearing."""
        return gpus.clear_rma(current_runtime(), serial)


@blp.route("/<string:serial>/mig-block")
class GpuMigBlock(MethodView):
    @require(ADMIN, OPERATOR)
    @blp.response(200, GpuRecordSchema)
    def delete(self, serial):
        """Clear a GPU's dynamic MIG block (a repartition failed there): it takes work again and
        may be repartitioned after its fleet's settle time."""
        return gpus.clear_mig_block(current_runtime(), serial)
