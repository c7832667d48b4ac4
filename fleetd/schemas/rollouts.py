"""Schemas of rollouts: what the driving CLI creates and reports, what any CLI reads."""

import re

from marshmallow import Schema, ValidationError, fields, validate, validates

from fleetd.schemas.common import FullRegexp, Int, PageQuerySchema, Text, Time, page_schema
from fleetd.schemas.fleets import AvailabilitySchema
from fleetd.services.fleet_ops.rollouts import NODE_MOVES, NODE_STATES

PERCENT_PATTERN = r"^0*([1-9][0-9]?|100)%$"  # ASCII digits only: 1% to 100%


class RolloutCreateSchema(Schema):
    fleet = Text(required=True, min_length=1, max_length=64)
    bundle_version = Text(required=True, min_length=1, max_length=64)
    bundle_sha256 = Text(
        required=True, validate=[FullRegexp(r"^[0-9a-f]{64}$", error="64 hex digits")]
    )
    batch = fields.Raw(
        load_default=1,
        metadata={
            "description": (
                'nodes per batch: a number, or a percentage of the nodes such as "10%" (default 1)'
            ),
            "oneOf": [
                {"type": "integer", "minimum": 1, "maximum": 100000},
                {"type": "string", "pattern": PERCENT_PATTERN},
            ],
        },
    )
    canary = Int(
        minimum=0,
        maximum=1000,
        load_default=1,
        metadata={
            "description": "nodes upgraded first, alone; any failure among them pauses the rollout"
        },
    )
    max_failures = Int(
        minimum=0,
        maximum=100000,
        load_default=0,
        metadata={"description": "failures after the canaries before the rollout pauses by itself"},
    )
    window = fields.Nested(
        AvailabilitySchema,
        allow_none=True,
        load_default=None,
        metadata={"description": "when nodes may begin their upgrade (null: any time)"},
    )
    drain_deadline_seconds = Int(minimum=0, maximum=7 * 86400, load_default=3600)

    @validates("batch")
    def _batch(self, value, **_):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValidationError('a number of nodes, or a percentage such as "10%"')
        if isinstance(value, int):
            if not 1 <= value <= 100000:
                raise ValidationError("1 to 100000 nodes")
            return
        if not re.fullmatch(PERCENT_PATTERN, value):
            raise ValidationError("a percentage from 1% to 100%")


class RolloutNodeReportSchema(Schema):
    state = fields.String(
        required=True, validate=validate.OneOf(sorted({s for m in NODE_MOVES.values() for s in m}))
    )
    detail = Text(max_length=2000, load_default="")


class RolloutNodeSchema(Schema):
    node_id = fields.String()
    hostname = fields.String()
    address = fields.String()
    batch = fields.Integer()
    canary = fields.Boolean()
    state = fields.String(metadata={"description": ", ".join(NODE_STATES)})
    detail = fields.String()
    updated_at = Time()


class RolloutSchema(Schema):
    id = fields.String()
    fleet = fields.String()
    bundle_version = fields.String()
    bundle_sha256 = fields.String()
    state = fields.String(
        metadata={
            "description": "running, paused; ended: done, failed (nothing left to try) or aborted"
        }
    )
    state_reason = fields.String()
    batch = fields.Raw(attribute="options.batch")
    canary = fields.Integer(attribute="options.canary")
    max_failures = fields.Integer(attribute="options.max_failures")
    window = fields.Raw(attribute="options.window", allow_none=True)
    drain_deadline_seconds = fields.Integer(attribute="options.drain_deadline_seconds")
    created_at = Time()
    created_by = fields.String()
    updated_at = Time()
    nodes = fields.List(fields.Nested(RolloutNodeSchema), attribute="node_list")


RolloutPageSchema = page_schema(RolloutSchema, "RolloutPage")


class RolloutQuerySchema(PageQuerySchema):
    fleet = Text(max_length=64, load_default=None)
