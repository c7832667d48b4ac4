"""Schemas of dynamic MIG on the agent protocol (issue 50): a heartbeat answer's target layouts
and a heartbeat's results (fleetwire.mig.MigLayout and MigEvent check them again, with the rules
across fields)."""

from marshmallow import Schema, fields, validate

from fleetd.schemas.common import Bool, FullRegexp, Int, Text
from fleetwire.mig import (
    MAX_MIG_DEVICES,
    MAX_MIG_EVENTS,
    MEMORY_SLOTS,
    PLAN_ID,
    PROFILE_NAME,
)

_PLAN = FullRegexp(PLAN_ID.pattern, error="a plan id")


class MigInstanceSchema(Schema):
    profile = fields.String(validate=FullRegexp(PROFILE_NAME.pattern, error="a MIG profile name"))
    start = Int(maximum=MEMORY_SLOTS - 1)
    size = Int(minimum=1, maximum=MEMORY_SLOTS)


class MigLayoutSchema(Schema):
    """A GPU's target layout: the agent destroys the GPU's idle MIG devices and makes these."""

    gpu_uuid = fields.String()
    plan = fields.String(metadata={"description": "names this target; results carry it back"})
    instances = fields.List(
        fields.Nested(MigInstanceSchema), validate=validate.Length(min=1, max=MAX_MIG_DEVICES)
    )


class MigEventSchema(Schema):
    """What came of a target layout on one GPU."""

    gpu_uuid = Text(required=True, min_length=1, max_length=128)
    plan = fields.String(required=True, validate=_PLAN)
    ok = Bool(required=True, metadata={"description": "the GPU now has the layout"})
    detail = Text(max_length=1000, load_default="", metadata={"description": "what went wrong"})
    busy = Bool(
        load_default=False,
        metadata={
            "description": (
                "not applied because a task on the node held a slice: the GPU is as it was"
            )
        },
    )


def MigEvents(**kw):
    return fields.List(
        fields.Nested(MigEventSchema), validate=validate.Length(max=MAX_MIG_EVENTS), **kw
    )
