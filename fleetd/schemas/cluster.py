"""Schemas of the cluster views, GPU types, quotas and schedule simulation."""

from marshmallow import Schema, ValidationError, fields, validate

from fleetd.schemas.common import Int, Text, page_schema
from fleetd.schemas.instances import InstanceSpecSchema
from fleetd.schemas.jobs import JobSpecSchema
from fleetd.services.placement.status import ACTIVE_LIMIT, ACTIVE_LIMIT_MAX


class BlockedNoteSchema(Schema):
    code = fields.String()
    series = fields.String()
    count = fields.Integer()
    reason = fields.String()
    next_open_at = fields.String()


class SeriesNoteSchema(Schema):
    code = fields.String()
    series = fields.String()
    next_open_at = fields.String()


class SeriesSchema(Schema):
    id = fields.String(
        metadata={
            "description": "the model's series id; `any` for queued work that takes any model, "
            "one of several, or one that no node has (its counts are 0)"
        }
    )
    label = fields.String()
    total = fields.Integer()
    used = fields.Integer()
    free = fields.Integer()
    blocked = fields.Integer()
    queued = fields.Float()
    note = fields.Nested(
        SeriesNoteSchema,
        allow_none=True,
        metadata={
            "description": (
                "why most of its blocked GPUs are blocked (the code of blocked_notes), or null"
            )
        },
    )


class GpuCapacitySchema(Schema):
    total = fields.Integer()
    used = fields.Integer()
    free = fields.Integer()
    blocked = fields.Integer()
    queued = fields.Float(
        metadata={
            "description": "GPUs asked for by queued jobs; outside the sum; the series' "
            "queued add up to it"
        }
    )
    blocked_reason = fields.String(
        metadata={"description": "why GPUs are blocked, in one sentence ('' when none is)"}
    )
    blocked_notes = fields.List(fields.Nested(BlockedNoteSchema))
    series = fields.List(fields.Nested(SeriesSchema))


class ProfileSchema(Schema):
    name = fields.String()
    label = fields.String(
        metadata={"description": "the shape as people read it (seed 003's label)"}
    )
    series = fields.String()
    num_nodes = fields.Integer()
    gpus_per_node = fields.Integer()


class OthersSchema(Schema):
    count = fields.Integer()
    gpus = fields.Float(
        metadata={"description": "GPUs they hold (fractions of a GPU count as such)"}
    )


class ClusterStatusQuerySchema(Schema):
    active_limit = Int(
        minimum=0,
        maximum=ACTIVE_LIMIT_MAX,
        load_default=ACTIVE_LIMIT,
        strict=False,  # query strings are text
        metadata={
            "description": (
                "running jobs, and running instances, listed at most (each; id order); "
                "active_jobs_total and active_instances_total count them all"
            )
        },
    )


class ClusterStatusSchema(Schema):
    gpu = fields.Nested(GpuCapacitySchema)
    storage = fields.Dict()
    active_count = fields.Integer(
        metadata={"description": "running jobs and instances, of every owner (listed or not)"}
    )
    active_jobs = fields.List(
        fields.Dict(),
        metadata={
            "description": (
                "running jobs: every one for an admin, else the caller's own: {id, name, owner, "
                "team, state, submitted_at, started_at, ended_at, duration_seconds, gpus, nodes, "
                "retry_count, can_retry, retry_blocker, retry_on, project_key, project, "
                "project_display_name, username, user_display_name}"
            )
        },
    )
    active_jobs_total = fields.Integer(
        metadata={"description": "running jobs there were to list (active_jobs holds active_limit)"}
    )
    other_active_jobs = fields.Nested(
        OthersSchema,
        metadata={
            "description": (
                "running jobs not listed in active_jobs: how many, and the GPUs they hold"
            )
        },
    )
    active_instances = fields.List(
        fields.Dict(),
        metadata={
            "description": (
                "instances whose run holds GPUs or a node: {id, name, owner, team, state, "
                "started_at, gpus, nodes} (the instance's id and state; an admin sees all, others "
                "their own)"
            )
        },
    )
    active_instances_total = fields.Integer(
        metadata={"description": "running instances there were to list"}
    )
    other_active_instances = fields.Nested(
        OthersSchema,
        metadata={
            "description": (
                "active instances not listed in active_instances: how many, and the GPUs they hold"
            )
        },
    )
    profiles = fields.List(fields.Nested(ProfileSchema))
    nodes = fields.Dict(
        keys=fields.String(), values=fields.Integer(), metadata={"description": "nodes by status"}
    )


class AllocationQuerySchema(Schema):
    node_id = Text(
        max_length=32,
        load_default=None,
        metadata={"description": "only this node's GPUs and tasks"},
    )


class ClusterAllocationSchema(Schema):
    gpus = fields.List(fields.Dict())
    nodes = fields.Dict()
    allocations = fields.List(fields.Dict())
    gpu_to_tasks = fields.Dict(keys=fields.String(), values=fields.List(fields.String()))


INSTANCE_ONLY = (
    "image",
    "volume_bytes",
    "volume_mount_path",
    "ports",
    "restart",
    "idle_stop",
    "scratch_bytes",
    "runtime_args",
)
# The body of simulate-schedule as the OpenAPI document states it: either spec (both are
# components).
SIMULATE_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "anyOf": [
                    {"$ref": "#/components/schemas/JobSpec"},
                    {"$ref": "#/components/schemas/InstanceSpec"},
                ]
            }
        }
    },
}


class SimulateSpecSchema(Schema):
    """A JobSpec, or an InstanceSpec: `kind` ("job" or "instance") says which, else a body with a
    field only instances have (ports, volume_bytes, image...) is an InstanceSpec. Either loads to
    the JobSpec of what the scheduler would place (an instance: its run)."""

    def load(self, data, **kwargs):
        """The JobSpec to simulate, from either kind of body (ValidationError as that kind's schema
        says)."""
        if not isinstance(data, dict):
            return JobSpecSchema().load(data, **kwargs)
        body = {k: v for k, v in data.items() if k != "kind"}
        kind = data.get("kind") or ("instance" if any(k in data for k in INSTANCE_ONLY) else "job")
        if kind == "instance":
            return InstanceSpecSchema().load(body, **kwargs).run(None)
        if kind != "job":
            raise ValidationError({"kind": ["job or instance"]})
        return JobSpecSchema().load(body, **kwargs)


class FilterDetailSchema(Schema):
    node_id = fields.String()
    stage = fields.String()
    reason = fields.String()


class SimulationSchema(Schema):
    schedulable = fields.Boolean()
    placement = fields.List(fields.Dict(), allow_none=True)
    filter_detail = fields.List(fields.Nested(FilterDetailSchema))
    error = fields.String(allow_none=True)
    reason = fields.String(allow_none=True)


class LowestPriceSchema(Schema):
    gpu_count = fields.Integer()
    available = fields.Boolean(
        metadata={"description": "whether some node has this many GPUs of the model"}
    )
    minimum_bid_price = fields.Float(
        allow_none=True,
        metadata={
            "description": "the spot minimum bid per GPU-hour (null: none set, or not available)"
        },
    )
    uninterruptable_price = fields.Float(
        allow_none=True,
        metadata={
            "description": "the on-demand price per GPU-hour (null: none set, or not available)"
        },
    )


class GpuTypeSchema(Schema):
    model = fields.String(
        metadata={"description": "the model as its nodes report it: the GPU type's id"}
    )
    display_name = fields.String(
        metadata={"description": "its short name (NVIDIA GeForce RTX 3090: RTX 3090)"}
    )
    manufacturer = fields.String(allow_none=True)
    memory_bytes = fields.Integer(allow_none=True)
    total = fields.Integer()
    available = fields.Integer()
    max_per_node = fields.Integer(
        metadata={"description": "the most GPUs of this model on one node"}
    )
    price_per_hour = fields.Float(allow_none=True)
    spot_min_bid = fields.Float(allow_none=True)
    lowest_price = fields.Nested(
        LowestPriceSchema,
        metadata={
            "description": (
                "GET /gpu-types/{model}?gpu_count=N only: the lowest prices of N GPUs on one node"
            )
        },
    )


class GpuTypeQuerySchema(Schema):
    gpu_count = Int(
        minimum=1,
        maximum=1024,
        load_default=None,
        strict=False,
        metadata={"description": "add lowest_price for this many GPUs of the model on one node"},
    )


GpuTypePageSchema = page_schema(GpuTypeSchema, "GpuTypePage")


class GpuTypeUpdateSchema(Schema):
    price_per_hour = fields.Float(
        validate=validate.Range(min=0, max=1e6), load_default=None, allow_none=True
    )
    spot_min_bid = fields.Float(
        validate=validate.Range(min=0, max=1e6), load_default=None, allow_none=True
    )


class QuotaSchema(Schema):
    team = fields.String()
    priority_class = fields.String()
    max_gpus = fields.Float()


QuotaPageSchema = page_schema(QuotaSchema, "QuotaPage")


class QuotaUpdateSchema(Schema):
    priority_class = fields.String(
        validate=validate.OneOf(["any", "on-demand", "spot"]), load_default="any"
    )
    max_gpus = fields.Float(required=True, validate=validate.Range(min=0, max=1e6))


class QuotaDeleteQuerySchema(Schema):
    priority_class = fields.String(
        validate=validate.OneOf(["any", "on-demand", "spot"]), load_default=None
    )
