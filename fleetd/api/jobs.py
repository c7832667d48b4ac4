"""Jobs and artifacts."""

from flask import request, send_file
from flask.views import MethodView

from fleetd.api.output import gzip_asked, text_stream
from fleetd.api.parser import Blueprint
from fleetd.auth import ADMIN, NODE, SUBMITTER, current_principal, require
from fleetd.errors import InvalidRequest, PayloadTooLarge
from fleetd.runtime import current_runtime
from fleetd.schemas.jobs import (
    ArtifactSchema,
    EventQuerySchema,
    JobPageSchema,
    JobQuerySchema,
    JobResultSchema,
    JobSpecSchema,
    JobStatusSchema,
    JobWaitSchema,
    LogPageSchema,
    LogQuerySchema,
    OutputInfoSchema,
    OutputQuerySchema,
    SubmitQuerySchema,
)
from fleetd.schemas.nodes import EventPageSchema
from fleetd.services.workloads import artifacts, jobs

blp = Blueprint("jobs", __name__, url_prefix="/api/v1", description="Jobs and artifacts")


@blp.route("/jobs")
class Jobs(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(JobQuerySchema(), location="query")
    @blp.response(200, JobPageSchema)
    def get(self, query):
        """List jobs (a submitter sees its own), oldest first."""
        items, next_cursor = jobs.list_job_views(
            current_runtime(),
            current_principal(),
            query["limit"],
            query["cursor"],
            state=query["state"],
            owner=query["owner"],
            name=query["name"],
        )
        return {"items": items, "next_cursor": next_cursor}

    @require(ADMIN, SUBMITTER)
    @blp.arguments(SubmitQuerySchema(), location="query")
    @blp.arguments(JobSpecSchema())
    @blp.response(201, JobStatusSchema)
    def post(self, query, spec):
        """Submit a JobSpec; it is queued and placed as soon as it fits."""
        # Accepted even when no enrolled node could ever hold it (nodes may join later), but it says
        # so; refused if the caller asked not to wait for capacity.
        return jobs.submit(current_runtime(), current_principal(), spec, query["wait_for_capacity"])


@blp.route("/jobs/<string:job_id>")
class JobById(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(JobWaitSchema(), location="query")
    @blp.response(200, JobStatusSchema)
    def get(self, query, job_id):
        """A job; with wait_seconds the answer comes as soon as the job is terminal."""
        return jobs.wait_job(current_runtime(), current_principal(), job_id, query["wait_seconds"])


@blp.route("/jobs/<string:job_id>/cancel")
class JobCancel(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, JobStatusSchema)
    def post(self, job_id):
        """Cancel a job: `cancelling` while its nodes stop its processes (told at once), then
        `cancelled`; a job that runs nothing yet is `cancelled` at once."""
        return jobs.cancel_job(current_runtime(), current_principal(), job_id)


@blp.route("/jobs/<string:job_id>/result")
class JobResult(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, JobResultSchema)
    def get(self, job_id):
        """The outcome of a job and of each rank."""
        return jobs.job_result(current_principal(), job_id)


@blp.route("/jobs/<string:job_id>/logs")
class JobLogs(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(LogQuerySchema(), location="query")
    @blp.response(200, LogPageSchema)
    def get(self, query, job_id):
        """Lines of the job's output in order of arrival (the whole output, from fleetd's tail and
        its output store); pass the last `seq` (or `next_cursor`) as `after` to follow."""
        items, next_cursor = jobs.job_logs(current_runtime(), current_principal(), job_id, **query)
        return {"items": items, "next_cursor": next_cursor}


@blp.route("/jobs/<string:job_id>/output")
class JobOutput(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(OutputQuerySchema(), location="query")
    @blp.response(200, content_type="text/plain")
    def get(self, query, job_id):
        """The job's whole output as text, from the output store (and fleetd's tail for what a node
        has not uploaded yet); gzip with `gzip=true` or Accept-Encoding: gzip."""
        return text_stream(
            jobs.job_output(current_runtime(), current_principal(), job_id, **gzip_asked(query)),
            query,
        )


@blp.route("/jobs/<string:job_id>/output/info")
class JobOutputInfo(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.response(200, OutputInfoSchema)
    def get(self, job_id):
        """How much output the job has, how much is stored, and which lines nodes still hold."""
        return jobs.job_output_info(current_principal(), job_id)


@blp.route("/jobs/<string:job_id>/events")
class JobEvents(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.arguments(EventQuerySchema(), location="query")
    @blp.response(200, EventPageSchema)
    def get(self, query, job_id):
        """A job's events and its tasks' events, oldest first."""
        items, next_cursor = jobs.job_events(
            current_principal(), job_id, query["limit"], query["cursor"], query["after"]
        )
        return {"items": items, "next_cursor": next_cursor}


_UPLOAD_DOC = {
    "parameters": [
        {
            "in": "header",
            "name": "X-Artifact-Name",
            "required": True,
            "description": "the file's name",
            "schema": {"type": "string", "minLength": 1, "maxLength": 255},
        },
        {
            "in": "header",
            "name": "X-Artifact-Kind",
            "required": False,
            "description": "a free-form kind",
            "schema": {"type": "string", "maxLength": 64},
        },
    ],
    "requestBody": {
        "required": False,
        "description": "the file's bytes (none: an empty file)",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
}


@blp.route("/artifacts")
class Artifacts(MethodView):
    @require(ADMIN, SUBMITTER)
    @blp.doc(**_UPLOAD_DOC)
    @blp.response(201, ArtifactSchema)
    def put(self):
        """Upload an artifact (raw body; headers X-Artifact-Name and X-Artifact-Kind)."""
        rt = current_runtime()
        name = request.headers.get("X-Artifact-Name", "")
        kind = request.headers.get("X-Artifact-Kind", "")
        if not name or len(name) > 255 or len(kind) > 64 or "\x00" in name + kind:
            raise InvalidRequest(
                "X-Artifact-Name (1-255 characters) is required; X-Artifact-Kind at most 64"
            )
        request.max_content_length = rt.settings.artifact_max_bytes
        if (
            request.content_length is not None
            and request.content_length > rt.settings.artifact_max_bytes
        ):
            raise PayloadTooLarge(
                f"artifact larger than the limit of {rt.settings.artifact_max_bytes} bytes"
            )
        return artifacts.store_artifact(
            rt.settings, rt.clock.now(), request.stream, name, kind, current_principal()
        )


@blp.route("/artifacts/<string:sha256>")
class ArtifactBySha(MethodView):
    @require(ADMIN, SUBMITTER, NODE)
    @blp.response(200, content_type="application/octet-stream")
    def get(self, sha256):
        """Download an artifact; a node may fetch only artifacts of its current tasks."""
        name, path = artifacts.open_artifact(
            current_runtime().settings, current_principal(), sha256
        )
        return send_file(
            path,
            mimetype="application/octet-stream",
            download_name=name,
            etag=sha256,
            conditional=True,
            max_age=0,
        )
