"""Share links to jobs: made and revoked by the job's owner, read by anyone who holds one."""

from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, SUBMITTER, current_principal, require
from fleetd.runtime import current_runtime, public_url
from fleetd.schemas.shares import ShareCreatedSchema, ShareCreateSchema, SharedJobSchema
from fleetd.services.workloads import shares

blp = Blueprint("shares", __name__, url_prefix="/api", description="Share links to jobs")


@blp.route("/v1/jobs/<string:job_id>/share")
class JobShare(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(ShareCreateSchema(), required=False)
    @blp.response(201, ShareCreatedSchema)
    def post(self, body, job_id):
        """Make a read-only link to a job (its owner, an admin of its project, or an admin). The
        token is shown once; GET /api/share/{token} needs no other credential."""
        row, token = shares.create_share(
            current_runtime().clock.now(),
            current_principal(),
            job_id,
            (body or {}).get("expires_in_seconds"),
        )
        return {
            "token": token,
            "url": f"{public_url().rstrip('/')}/api/share/{token}",
            "expires_at": row.expires_at,
        }


@blp.route("/v1/shares/<string:token>")
class ShareByToken(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(204)
    def delete(self, token):
        """Revoke a link: it stops working at once (404 for a token that is no link to a job this
        caller may read)."""
        shares.revoke_share(current_runtime().clock.now(), current_principal(), token)


@blp.route("/share/<string:token>")
class SharedJob(MethodView):
    @blp.doc(security=[])
    @blp.response(200, SharedJobSchema)
    def get(self, token):
        """A shared job, read-only, for anyone who holds the link: its name, state, outcome, exit
        codes, times and the tail of its output; nothing of its spec or owner. A link that is
        unknown, revoked or expired is one 404."""
        return shares.shared_job(current_runtime().clock.now(), token)
