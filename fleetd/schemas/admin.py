"""Schemas of administration."""

from marshmallow import Schema, fields

from fleetd.schemas.common import Time, page_schema


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
