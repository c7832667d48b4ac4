"""Schemas of the cluster views, GPU types, quotas and schedule simulation."""

from marshmallow import Schema, fields, validate

from fleetd.schemas.common import Text, page_schema


class BlockedNoteSchema(Schema):
    code = fields.String()
    series = fields.String()
    count = fields.Integer()
    reason = fields.String()
    next_open_at = fields.String()


class SeriesSchema(Schema):
    id = fields.String()
    label = fields.String()
    total = fields.Integer()
    used = fields.Integer()
    free = fields.Integer()
    blocked = fields.Integer()
    queued = fields.Float()


class GpuCapacitySchema(Schema):
    total = fields.Integer()
    used = fields.Integer()
    free = fields.Integer()
    blocked = fields.Integer()
    queued = fields.Float(metadata={"description": "GPUs asked for by queued jobs; outside the sum"})
    blocked_notes = fields.List(fields.Nested(BlockedNoteSchema))
    series = fields.List(fields.Nested(SeriesSchema))


class ProfileSchema(Schema):
    name = fields.String()
    series = fields.String()
    num_nodes = fields.Integer()
    gpus_per_node = fields.Integer()


class OthersSchema(Schema):
    count = fields.Integer()
    gpus = fields.Float(metadata={"description": "GPUs they hold (fractions of a GPU count as such)"})


class ClusterStatusSchema(Schema):
    gpu = fields.Nested(GpuCapacitySchema)
    storage = fields.Dict()
    active_jobs = fields.List(fields.Dict(), metadata={
        "description": "running jobs: every one for an admin, else the caller's own"})
    other_active_jobs = fields.Nested(OthersSchema, metadata={
        "description": "running jobs not listed in active_jobs: how many, and the GPUs they hold"})
    active_instances = fields.List(fields.Dict(), metadata={
        "description": "instances whose run holds GPUs or a node: {id, name, owner, team, state, started_at, "
                       "gpus, nodes} (the instance's id and state; an admin sees all, others their own)"})
    other_active_instances = fields.Nested(OthersSchema, metadata={
        "description": "active instances not listed in active_instances: how many, and the GPUs they hold"})
    profiles = fields.List(fields.Nested(ProfileSchema))
    nodes = fields.Dict(keys=fields.String(), values=fields.Integer(), metadata={"description": "nodes by status"})


class AllocationQuerySchema(Schema):
    node_id = Text(max_length=32, load_default=None, metadata={"description": "only this node's GPUs and tasks"})


class ClusterAllocationSchema(Schema):
    gpus = fields.List(fields.Dict())
    nodes = fields.Dict()
    allocations = fields.List(fields.Dict())
    gpu_to_tasks = fields.Dict(keys=fields.String(), values=fields.List(fields.String()))


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


class GpuTypeSchema(Schema):
    model = fields.String()
    memory_bytes = fields.Integer(allow_none=True)
    total = fields.Integer()
    available = fields.Integer()
    max_per_node = fields.Integer(metadata={"description": "the most GPUs of this model on one node"})
    price_per_hour = fields.Float(allow_none=True)
    spot_min_bid = fields.Float(allow_none=True)


GpuTypePageSchema = page_schema(GpuTypeSchema, "GpuTypePage")


class GpuTypeUpdateSchema(Schema):
    price_per_hour = fields.Float(validate=validate.Range(min=0, max=1e6), load_default=None, allow_none=True)
    spot_min_bid = fields.Float(validate=validate.Range(min=0, max=1e6), load_default=None, allow_none=True)


class QuotaSchema(Schema):
    team = fields.String()
    priority_class = fields.String()
    max_gpus = fields.Float()


QuotaPageSchema = page_schema(QuotaSchema, "QuotaPage")


class QuotaUpdateSchema(Schema):
    priority_class = fields.String(validate=validate.OneOf(["any", "on-demand", "spot"]), load_default="any")
    max_gpus = fields.Float(required=True, validate=validate.Range(min=0, max=1e6))


class QuotaDeleteQuerySchema(Schema):
    priority_class = fields.String(validate=validate.OneOf(["any", "on-demand", "spot"]), load_default=None)


