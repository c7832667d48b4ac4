"""Schemas of share links: making one, and what a link shows."""

from marshmallow import Schema, fields

from fleetd.schemas.common import Int, Time
from fleetd.services.workloads.shares import EXPIRES_MAX_SECONDS, TAIL_BYTES, TAIL_LINES


class ShareCreateSchema(Schema):
    expires_in_seconds = Int(
        minimum=60,
        maximum=EXPIRES_MAX_SECONDS,
        load_default=None,
        metadata={"description": "the link stops working this long from now (default: never)"},
    )


class ShareCreatedSchema(Schema):
    token = fields.String(metadata={"description": "shown this once; fleetd keeps only its hash"})
    url = fields.String(metadata={"description": "the link: GET it without a token"})
    expires_at = Time(allow_none=True)


class SharedTaskSchema(Schema):
    rank = fields.Integer()
    state = fields.String()
    exit_code = fields.Integer(allow_none=True)


class SharedLogLineSchema(Schema):
    seq = fields.Integer()
    at = Time()
    rank = fields.Integer()
    stream = fields.String()
    text = fields.String()


class SharedJobSchema(Schema):
    id = fields.String()
    name = fields.String()
    state = fields.String()
    outcome = fields.String(allow_none=True)
    outcome_reason = fields.String()
    exit_code = fields.Integer(allow_none=True, metadata={"description": "rank 0's, once it ended"})
    attempt = fields.Integer()
    submitted_at = Time()
    started_at = Time(allow_none=True)
    ended_at = Time(allow_none=True)
    tasks = fields.List(fields.Nested(SharedTaskSchema))
    logs = fields.List(
        fields.Nested(SharedLogLineSchema),
        metadata={
            "description": f"the output's last lines, oldest first: at most {TAIL_LINES} lines "
            f"and {TAIL_BYTES} bytes of text"
        },
    )
    logs_truncated = fields.Boolean(
        metadata={"description": "true when earlier output (or a long line's start) is left out"}
    )
    expires_at = Time(allow_none=True, metadata={"description": "when the link stops working"})
