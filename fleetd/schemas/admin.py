"""Schemas of administration."""

from marshmallow import Schema, fields

from fleetd.schemas.common import Bool, Int, Time, page_schema


class BackgroundTaskSchema(Schema):
    name = fields.String()
    description = fields.String()
    interval_seconds = fields.Float()
    last_started_at = Time()
    last_finished_at = Time()
    last_status = fields.String(allow_none=True)
    last_result = fields.Dict(allow_none=True)
    last_error = fields.String(allow_none=True)
    next_run_at = Time()


BackgroundTaskPageSchema = page_schema(BackgroundTaskSchema, "BackgroundTaskPage")


class GcSchema(Schema):
    older_than_seconds = Int(
        maximum=100 * 365 * 86400, load_default=7 * 86400
    )  # beyond that: before year 1
    delete_jobs = Bool(load_default=False)
    dry_run = Bool(load_default=True)


class GcResultSchema(Schema):
    jobs = fields.Integer()
    tasks = fields.Integer()
    log_lines = fields.Integer()
    events = fields.Integer()
    artifacts = fields.Integer()
    instances = fields.Integer(
        metadata={"description": "deleted instances forgotten (with delete_jobs)"}
    )
    cluster_samples = fields.Integer()
    gpu_samples = fields.Integer()
    notifications = fields.Integer(
        metadata={"description": "notifications older than notification_retention_seconds"}
    )
    shares = fields.Integer(metadata={"description": "share links revoked or expired before it"})
    dry_run = fields.Boolean()
