"""Schemas of jobs (JobSpec, JobStatus) and the worker side of the agent protocol."""

import datetime as dt
import math
import re
import typing

from marshmallow import Schema, ValidationError, fields, post_load, validate, validates_schema

from fleetd.models import JobState
from fleetd.names import PROJECT_KEY, name_problem
from fleetd.scheduler import MIN_SLICE_MEMORY_BYTES, TOPOLOGY_MODES
from fleetd.schemas.common import (
    Bool,
    FullRegexp,
    Int,
    Labels,
    PageQuerySchema,
    Text,
    Time,
    page_schema,
)
from fleetd.services.workloads.output_read import MAX_QUERY_CHARS
from fleetd.specs import RETRY_ON, JobSpec
from fleetwire import MAX_ASSIGNMENTS, MAX_FINISHES
from fleetwire.assignment import MAX_TASK_PIDS, MIN_TASK_PIDS
from fleetwire.finish import TaskFinish
from fleetwire.mig import PROFILE_NAMES
from fleetwire.output import (
    CHUNK_RAW_BYTES,
    MAX_AT_MS,
    MAX_LINE_BYTES,
    MAX_OUTPUT_CAP_BYTES,
    MIN_OUTPUT_CAP_BYTES,
    NOTICES,
    OutputBatch,
)
from fleetwire.tasks import Acquire, LogBatch, RendezvousPublish, TaskRestarting, TaskStarted

ENV_NAME = FullRegexp(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$", error="an environment variable name")
SHA256 = FullRegexp(r"^[0-9a-f]{64}$", error="64 lowercase hex characters")


OutputCapBytes = lambda **kw: Int(  # noqa: E731
    minimum=MIN_OUTPUT_CAP_BYTES,
    maximum=MAX_OUTPUT_CAP_BYTES,
    strict=False,
    metadata={
        "description": (
            "the most output (bytes) each task keeps; past it the rest is discarded with a marked "
            "line (default: its fleet's output_cap_bytes)"
        )
    },
    **kw,
)


def _at_most_256(env):
    if len(env) > 256:
        raise ValidationError("at most 256 variables")


def _relative_path(value):
    parts = value.split("/")
    if value.startswith("/") or ".." in parts or "\x00" in value:
        raise ValidationError("a relative path inside the task's working directory, without '..'")


# Names the admin UI's paths take for themselves: /ui/jobs/new and /ui/instances/new are its create
# forms, so a job or an instance of that name could not be opened by name there.
RESERVED_NAMES = ("new",)


def reserved_name_error(name, kind):
    """Why `name` may not name a workload of `kind` ("jobs", "instances"), or None when it may: not
    reserved, and nothing that passes it off as another name (fleetd.names)."""
    if name in RESERVED_NAMES:
        return f"{name!r} is reserved (the admin UI's /ui/{kind}/{name}); choose another name"
    return name_problem(name)


def _not_reserved(name):
    error = reserved_name_error(name, "jobs")
    if error is not None:
        raise ValidationError(error)


MIN_GPU_FRACTION = 0.01


class GpuCount(fields.Number):
    """An integer >= 0, or a fraction 0.01 <= x < 1 of one GPU."""

    num_type = float

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValidationError("a number: whole GPUs, or a fraction 0.01 <= x < 1 of one GPU")
        if (
            not math.isfinite(value)
            or value < 0
            or value > 1024
            or (value >= 1 and value != int(value))
        ):
            raise ValidationError(
                "an integer from 0 to 1024, or a fraction 0.01 <= x < 1 of one GPU"
            )
        if 0 < value < MIN_GPU_FRACTION:
            raise ValidationError(
                f"a fraction of a GPU must be at least {MIN_GPU_FRACTION} (got {value:g}); "
                f"its memory share must also be at least {MIN_SLICE_MEMORY_BYTES // 1024**2} MiB"
            )
        return int(value) if value >= 1 or value == 0 else float(value)


def _slice_memory(value):
    if value is not None and value < MIN_SLICE_MEMORY_BYTES:
        raise ValidationError(
            f"a slice's GPU memory must be at least {MIN_SLICE_MEMORY_BYTES} bytes "
            f"({MIN_SLICE_MEMORY_BYTES // 1024**2} MiB), got {value}"
        )


def TopologyMode():
    """Whether a rank's whole GPUs must be an aligned set (`resources.topology`), for jobs and
    instances alike."""
    return fields.String(
        validate=validate.OneOf(TOPOLOGY_MODES),
        load_default=None,
        metadata={
            "description": (
                "whole GPUs of a rank on an aligned set (the best links its node has for that "
                "many GPUs): required waits for one, preferred (the default) takes the best set "
                "free where no node has one"
            )
        },
    )


def MigProfile():
    """A MIG profile to run on (`resources.mig`), for jobs and instances alike."""
    return fields.String(
        validate=validate.OneOf(sorted(PROFILE_NAMES)),
        load_default=None,
        metadata={
            "description": (
                "a MIG profile such as 1g.10gb: each rank gets `gpus` MIG devices of it (1 by "
                "default), whole, with hardware isolation; not with a fraction of a GPU, "
                "gpu_memory_bytes or gpu_compute_percent"
            )
        },
    )


def Pids():
    """A task's pid limit (`resources.pids`), for jobs and instances alike."""
    return Int(
        minimum=MIN_TASK_PIDS,
        maximum=MAX_TASK_PIDS,
        allow_none=True,
        metadata={
            "description": (
                "the most processes and threads each rank may hold (absent: the fleet's "
                "task_pids_max, which is also the most it gets)"
            )
        },
    )


class ResourcesSchema(Schema):
    gpus = GpuCount(
        load_default=0,
        metadata={
            "oneOf": [
                {"type": "integer", "minimum": 0, "maximum": 1024},
                {
                    "type": "number",
                    "minimum": MIN_GPU_FRACTION,
                    "maximum": 1,
                    "exclusiveMaximum": True,
                },
            ]
        },
    )
    gpu_memory_bytes = fields.Integer(
        strict=True,
        validate=[validate.Range(max=2**63 - 1), _slice_memory],
        load_default=None,
        allow_none=True,
        metadata={"minimum": MIN_SLICE_MEMORY_BYTES},
    )
    gpu_compute_percent = fields.Float(
        validate=validate.Range(min=0, max=100, min_inclusive=False),
        load_default=None,
        allow_none=True,
        metadata={"exclusiveMinimum": True},
    )
    gpu_types = fields.List(
        Text(min_length=1, max_length=128), validate=validate.Length(max=32), load_default=list
    )
    cpus = fields.Float(validate=validate.Range(min=0, max=100_000), load_default=0)
    memory_bytes = Int(
        load_default=0,
        metadata={
            "description": (
                "host memory each rank holds (reserved, and its bound); 0 or absent: the fleet's "
                "task_memory_default_bytes bounds it, nothing is reserved"
            )
        },
    )
    pids = Pids()
    topology = TopologyMode()
    mig = MigProfile()


class NodeSelectorSchema(Schema):
    fleet = Text(max_length=63, load_default=None, allow_none=True)
    labels = Labels(load_default=dict)


class RetrySchema(Schema):
    max_attempts = Int(minimum=1, maximum=100, required=True)
    on = fields.List(fields.String(validate=validate.OneOf(RETRY_ON)), load_default=list)


class ArtifactRefSchema(Schema):
    sha256 = fields.String(required=True, validate=SHA256)
    path = Text(required=True, min_length=1, max_length=1024, validate=[_relative_path])


_RESOURCES = ResourcesSchema()  # instances made once: making a schema costs more than loading one
_NODE_SELECTOR = NodeSelectorSchema()


class NetworkSchema(Schema):
    same_block = fields.String(
        validate=validate.OneOf(TOPOLOGY_MODES),
        load_default=None,
        metadata={
            "description": (
                "for a gang (num_nodes > 1): required, all its nodes in one network block or it "
                "waits; preferred (the default), the fewest blocks, then the fewest leaf switches"
            )
        },
    )


class JobSpecSchema(Schema):
    name = Text(
        required=True,
        min_length=1,
        max_length=200,
        validate=[_not_reserved],
        metadata={
            "description": "not `new` (the admin UI's /ui/jobs/new); visible characters of one "
            "script in NFKC form (no bidi controls, no invisible ones)"
        },
    )
    command = fields.List(
        Text(max_length=65536), required=True, validate=validate.Length(min=1, max=4096)
    )
    env = fields.Dict(
        keys=fields.String(validate=ENV_NAME),
        values=Text(max_length=65536),
        validate=_at_most_256,
        load_default=dict,
        metadata={"maxProperties": 256},
    )
    workdir = Text(max_length=1024, load_default=None, allow_none=True, validate=[_relative_path])
    num_nodes = Int(minimum=1, maximum=1024, load_default=1)
    resources = fields.Nested(ResourcesSchema, load_default=lambda: _RESOURCES.load({}))
    network = fields.Nested(
        NetworkSchema,
        load_default=None,
        metadata={"description": "where a gang's nodes sit in the network (docs/api.md)"},
    )
    isolation = fields.String(
        validate=validate.OneOf(["exclusive", "shared", "mps"]), load_default=None, allow_none=True
    )
    priority_class = fields.String(
        validate=validate.OneOf(["on-demand", "spot"]), load_default="on-demand"
    )
    bid = fields.Float(validate=validate.Range(min=0, max=1e9), load_default=None, allow_none=True)
    team = Text(max_length=200, load_default=None, allow_none=True)
    project = fields.String(
        validate=FullRegexp(PROJECT_KEY),
        load_default=None,
        allow_none=True,
        metadata={
            "description": "the key of its project (default: the submitter's default project)"
        },
    )
    labels = Labels(load_default=dict)
    node_selector = fields.Nested(NodeSelectorSchema, load_default=lambda: _NODE_SELECTOR.load({}))
    max_runtime_seconds = Int(minimum=1, maximum=365 * 86400, load_default=None, allow_none=True)
    output_cap_bytes = OutputCapBytes(load_default=None, allow_none=True)
    retry = fields.Nested(RetrySchema, load_default=None, allow_none=True)
    artifacts = fields.List(
        fields.Nested(ArtifactRefSchema), validate=validate.Length(max=100), load_default=list
    )

    @validates_schema
    def _consistent(self, data, **kwargs):
        res = data.get("resources") or {}
        if data.get("isolation") == "exclusive" and 0 < res.get("gpus", 0) < 1:
            raise ValidationError("a fraction of a GPU cannot be exclusive", "isolation")
        if data.get("bid") is not None and data.get("priority_class") != "spot":
            raise ValidationError("a bid applies to spot jobs only", "bid")

    @post_load
    def _typed(self, data, **kwargs):
        return JobSpec.from_dict(data)


def _placed(task):
    return task.state != "pending"


def _once_placed(attr, description):
    """A task's field, shown once it is placed (null while it waits)."""
    return fields.Function(
        lambda t: getattr(t, attr) if _placed(t) else None,
        metadata={"description": description},
    )


class TaskStatusSchema(Schema):
    id = fields.String()
    rank = fields.Integer()
    node_id = fields.Function(lambda t: t.node_id if _placed(t) else None)
    state = fields.String()
    gpus = fields.Function(lambda t: [g["uuid"] for g in t.gpus] if _placed(t) else [])
    mig_devices = fields.Function(
        lambda t: [g["mig_device"] for g in t.gpus if g.get("mig_device")] if _placed(t) else [],
        metadata={
            "description": "the MIG devices (MIG-...) it holds, for a job with resources.mig"
        },
    )
    run_as = _once_placed(
        "run_as",
        "who its process runs as on its node: {source: unix_user | dynamic | root, user, uid, gid}",
    )
    link_class = _once_placed(
        "link_class",
        "its GPUs' weakest link: nvlink, nvswitch, pcie_switch, host_bridge, numa, system, or "
        "self for one GPU; null where its node's links are unknown",
    )
    exit_code = fields.Integer(allow_none=True)
    reason = fields.String()
    started_at = Time()
    ended_at = Time()


class JobStatusSchema(Schema):
    id = fields.String()
    name = fields.String()
    owner = fields.String()
    team = fields.String(allow_none=True)
    project = fields.String(allow_none=True, metadata={"description": "its project's key"})
    user = fields.String(
        allow_none=True, metadata={"description": "its user's login (null: a service account's)"}
    )
    state = fields.String()
    pending_reason = fields.String()
    attempt = fields.Integer()
    submitted_at = Time()
    started_at = Time()
    ended_at = Time()
    outcome = fields.String(allow_none=True)
    spec = fields.Dict()
    tasks = fields.List(fields.Nested(TaskStatusSchema), attribute="task_list")
    # Set by the service that returns the job (services.accounting.usage.with_costs).
    price_per_hour = fields.Float(
        allow_none=True,
        metadata={
            "description": (
                "what its running tasks cost per hour now; once none runs, what its last attempt's "
                "cost (null when it never ran or is unpriced)"
            )
        },
    )
    cost_so_far = fields.Float(
        metadata={
            "description": (
                "its cost so far from the usage ledger, ended tasks to their end and running ones "
                "to now"
            )
        }
    )


JobPageSchema = page_schema(JobStatusSchema, "JobPage")


class JobQuerySchema(PageQuerySchema):
    state = fields.String(validate=validate.OneOf([s.value for s in JobState]), load_default=None)
    owner = Text(max_length=200, load_default=None)
    name = Text(
        max_length=200,
        load_default=None,
        metadata={"description": "only jobs of exactly this name"},
    )


class SubmitQuerySchema(Schema):
    wait_for_capacity = fields.Boolean(
        load_default=True,
        metadata={
            "description": (
                "false: refuse (409) a job that no enrolled node could ever hold, instead of "
                "queueing it"
            )
        },
    )


class JobWaitSchema(Schema):
    wait_seconds = fields.Float(
        validate=validate.Range(min=0, max=30),
        load_default=None,
        metadata={
            "default": 0,
            "description": "hold the answer until the job is terminal, at most this long",
        },
    )
    wait = fields.Float(
        validate=validate.Range(min=0, max=30),
        load_default=None,
        metadata={
            "description": (
                "the same as wait_seconds (seed 004's name); wait_seconds wins when both are given"
            )
        },
    )

    @post_load
    def _wait_seconds(self, data, **kwargs):
        wait = data.pop("wait", None)
        return {
            **data,
            "wait_seconds": data["wait_seconds"]
            if data.get("wait_seconds") is not None
            else wait or 0,
        }


class JobResultTaskSchema(Schema):
    rank = fields.Integer()
    node_id = fields.String(allow_none=True)
    run_as = fields.Dict(allow_none=True)
    exit_code = fields.Integer(allow_none=True)
    outcome = fields.String(allow_none=True)
    reason = fields.String()


class JobResultSchema(Schema):
    outcome = fields.String(allow_none=True)
    reason = fields.String()
    attempt = fields.Integer()
    tasks = fields.List(fields.Nested(JobResultTaskSchema))


class LogLineSchema(Schema):
    seq = fields.Integer(attribute="id")
    at = Time()
    rank = fields.Integer()
    attempt = fields.Integer()
    line = fields.Integer(
        allow_none=True,
        metadata={"description": "its number in its task's output, from 0 (null: kept before)"},
    )
    stream = fields.String()
    text = fields.String()


LogPageSchema = page_schema(LogLineSchema, "LogPage")


RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})"
)


class Instant(fields.Field):
    """An RFC 3339 time (a leap second read as the second before it), as a naive UTC datetime."""

    def __init__(self, **kwargs):
        metadata = {"type": "string", "format": "date-time", **kwargs.pop("metadata", {})}
        super().__init__(metadata=metadata, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        match = RFC3339.fullmatch(value.strip()) if isinstance(value, str) else None
        if match is None or len(value) > 64:
            raise ValidationError("an RFC 3339 time")
        year, month, day, hour, minute, second, fraction, zone = match.groups()
        try:
            offset = dt.timedelta(0)
            if zone not in ("Z", "z"):
                sign = -1 if zone[0] == "-" else 1
                offset = sign * dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
            when = dt.datetime(
                int(year),
                int(month),
                int(day),
                int(hour),
                int(minute),
                min(int(second), 59),
                int((fraction or ".0")[1:7].ljust(6, "0")),
                tzinfo=dt.timezone(offset),
            )
            return when.astimezone(dt.timezone.utc).replace(tzinfo=None)
        except (ValueError, OverflowError):
            raise ValidationError("an RFC 3339 time") from None


OUTPUT_STREAMS = ("stdout", "stderr", "system")


class LogQuerySchema(Schema):
    limit = Int(minimum=1, maximum=10000, load_default=1000, strict=False)
    after = Int(minimum=0, maximum=2**62, load_default=None, strict=False)
    rank = Int(minimum=0, maximum=1023, load_default=None, strict=False)
    stream = fields.String(validate=validate.OneOf(OUTPUT_STREAMS), load_default=None)
    since = Instant(
        load_default=None, metadata={"description": "lines seen at or after (RFC 3339)"}
    )
    until = Instant(load_default=None, metadata={"description": "lines seen at or before"})
    q = fields.String(
        validate=validate.Length(min=1, max=MAX_QUERY_CHARS),
        load_default=None,
        metadata={
            "description": "lines that contain this (a regex with q_regex), over the whole output"
        },
    )
    q_regex = fields.Boolean(
        truthy={"true"},
        falsy={"false"},
        load_default=False,
        metadata={"description": "q is a regex (RE2 syntax: linear time, no backreferences)"},
    )


class OutputQuerySchema(Schema):
    rank = Int(minimum=0, maximum=1023, load_default=None, strict=False)
    attempt = Int(minimum=1, maximum=10000, load_default=None, strict=False)
    stream = fields.String(validate=validate.OneOf(OUTPUT_STREAMS), load_default=None)
    gzip = fields.Boolean(
        truthy={"true"},
        falsy={"false"},
        load_default=False,
        metadata={"description": "the text gzip-compressed (a .gz file)"},
    )


class PendingRangeSchema(Schema):
    rank = fields.Integer()
    attempt = fields.Integer()
    first_line = fields.Integer()
    lines = fields.Integer()
    node_id = fields.String()


class OutputPartSchema(Schema):
    rank = fields.Integer()
    attempt = fields.Integer()
    node_id = fields.String()
    lines = fields.Integer()
    bytes = fields.Integer()
    stored_lines = fields.Integer()
    stored_bytes = fields.Integer()
    truncated = fields.Boolean()
    ended = fields.Boolean()


class OutputInfoSchema(Schema):
    bytes = fields.Integer()
    lines = fields.Integer()
    stored_bytes = fields.Integer()
    pending_ranges = fields.List(fields.Nested(PendingRangeSchema))
    truncated = fields.Boolean()
    cap_bytes = fields.Integer(allow_none=True)
    outputs = fields.List(fields.Nested(OutputPartSchema))


class EventQuerySchema(PageQuerySchema):
    after = Int(maximum=2**62, load_default=None, strict=False)


# ---------------------------------------------------------------- the worker protocol


class AcquireSchema(Schema):
    wait_seconds = fields.Float(validate=validate.Range(min=0, max=30), load_default=30)
    max_assignments = fields.Integer(
        strict=True,
        validate=validate.Range(min=1, max=MAX_ASSIGNMENTS),
        load_default=None,
        metadata={
            "description": "deliver up to this many assignments at once, in "
            "`assignments` (`assignment` is the first of them)"
        },
    )

    @post_load
    def _typed(self, data, **_kwargs):
        """The checked body as the wire's Acquire (fleetwire.tasks)."""
        try:
            return Acquire.from_wire(data)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class AssignmentGpuSchema(Schema):
    uuid = fields.String()
    memory_limit_bytes = fields.Integer()
    compute_percent = fields.Float()
    mig_device = fields.String(
        metadata={
            "description": "the MIG device (MIG-...) of this GPU the task runs on, whole: its "
            "CUDA_VISIBLE_DEVICES names it, and no software limit applies"
        }
    )


class AssignmentSchema(Schema):
    task_id = fields.String()
    job_id = fields.String()
    epoch = fields.Integer()
    attempt = fields.Integer()
    rank = fields.Integer()
    num_nodes = fields.Integer()
    command = fields.List(fields.String())
    env = fields.Dict()
    workdir = fields.String(allow_none=True)
    gpus = fields.List(fields.Nested(AssignmentGpuSchema))
    isolation = fields.String()
    max_runtime_seconds = fields.Integer(allow_none=True)
    output_cap_bytes = fields.Integer(allow_none=True)
    artifacts = fields.List(fields.Nested(ArtifactRefSchema))
    cpus = fields.Float(
        allow_none=True, metadata={"description": "host CPUs to enforce (cgroup), if any"}
    )
    memory_bytes = fields.Integer(
        allow_none=True,
        metadata={
            "description": (
                "host memory to enforce: the spec's, else the fleet's task_memory_default_bytes"
            )
        },
    )
    memory_default = fields.Boolean(metadata={"description": "memory_bytes is the fleet's default"})
    pids = fields.Integer(
        allow_none=True, metadata={"description": "the most processes and threads the task holds"}
    )
    task_path = fields.String(
        allow_none=True, metadata={"description": "the task's PATH (the fleet's task_path)"}
    )
    priority_class = fields.String()
    bid = fields.Float(allow_none=True)
    instance = fields.Dict(
        allow_none=True,
        metadata={
            "description": (
                "a run of an instance: {id, name, restart, ports, volume_bytes, volume_mount_path, "
                "image, idle_stop}; absent or null for batch work"
            )
        },
    )
    run_as = fields.Dict(
        allow_none=True,
        metadata={
            "description": (
                "who the task runs as: {source: unix_user (user: a host user the agent resolves) | "
                "dynamic (uid and gid fleetd allocated to the owner) | root, user, uid, gid}"
            )
        },
    )


class AcquireReplySchema(Schema):
    assignment = fields.Nested(AssignmentSchema, allow_none=True)
    assignments = fields.List(fields.Nested(AssignmentSchema))  # only when max_assignments was sent
    cancel = fields.List(
        fields.String(),
        metadata={
            "description": (
                "ids of tasks whose processes this node must stop now (cancelled, preempted, past "
                "a drain's deadline); each is told once, and the heartbeat's `cancel` repeats them"
            )
        },
    )
    flush_output = fields.List(
        fields.String(),
        metadata={
            "description": (
                "ids of tasks whose output a reader waits for: seal the open chunk and upload it "
                "now (sent only when there are some)"
            )
        },
    )


class PortMappingSchema(Schema):
    port = Int(required=True, minimum=1, maximum=65535)
    host_port = Int(required=True, minimum=1, maximum=65535)
    protocol = fields.String(validate=validate.OneOf(["http", "tcp"]), load_default="tcp")


def _distinct_ports(ports):
    if ports is not None and len({p["port"] for p in ports}) != len(ports):
        raise ValidationError("each declared port at most once")


PORT_MAPPINGS: dict[str, typing.Any] = dict(
    validate=[validate.Length(max=64), _distinct_ports],
    load_default=None,
    allow_none=True,
    metadata={
        "description": "an instance's run: the host port its node assigned to each declared port"
    },
)


def _started_seconds_ago(description):
    """The field of a start (or a finish carrying it) that says how long ago the process
    started."""
    return fields.Float(
        validate=validate.Range(min=0, max=366 * 86400),
        load_default=None,
        allow_none=True,
        metadata={"description": description},
    )


class TaskStartSchema(Schema):
    epoch = Int(required=True)
    pid = Int(minimum=1, maximum=2**31, load_default=None, allow_none=True)
    ports = fields.List(fields.Nested(PortMappingSchema), **PORT_MAPPINGS)
    restarts = Int(
        minimum=0,
        maximum=10**9,
        load_default=0,
        metadata={
            "description": (
                "an instance's run: how many times its restart policy restarted the process (0: "
                "its first start); each restart's start is reported again"
            )
        },
    )
    started_seconds_ago = _started_seconds_ago(
        "how long before this report the process started (the agent's own clock measures the "
        "interval, so host clocks need not agree); fleetd records started_at as now minus that, "
        "never earlier than the assignment"
    )

    @post_load
    def _typed(self, data, **_kwargs):
        """The checked body as the wire's TaskStarted (fleetwire.tasks)."""
        try:
            return TaskStarted.from_wire(data)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class TaskRestartSchema(Schema):
    epoch = Int(required=True)
    exit_code = Int(minimum=-255, maximum=255, load_default=None, allow_none=True)
    signal = Text(
        max_length=32,
        load_default=None,
        allow_none=True,
        metadata={"description": "the signal that ended the process (SIGKILL), if one did"},
    )
    reason = Text(
        max_length=2000,
        load_default="",
        metadata={"description": "how the process ended, in words"},
    )
    backoff_seconds = fields.Float(
        required=True,
        validate=validate.Range(min=0, max=86400),
        metadata={"description": "how long the node waits before starting the process again"},
    )

    @post_load
    def _typed(self, data, **_kwargs):
        """The checked body as the wire's TaskRestarting (fleetwire.tasks)."""
        try:
            return TaskRestarting.from_wire(data)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class RendezvousPublishSchema(Schema):
    epoch = Int(required=True)
    addr = Text(required=True, min_length=1, max_length=255)
    port = Int(required=True, minimum=1, maximum=65535)

    @post_load
    def _typed(self, data, **_kwargs):
        """The checked body as the wire's RendezvousPublish (fleetwire.tasks)."""
        try:
            return RendezvousPublish.from_wire(data)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class RendezvousQuerySchema(Schema):
    wait_seconds = fields.Float(validate=validate.Range(min=0, max=30), load_default=30)


class RendezvousSchema(Schema):
    addr = fields.String()
    port = fields.Integer()


class LogLineField(fields.Field):
    """[stream, text] or [stream, text, rank]."""

    # OpenAPI 3.0 has no tuples: the document says "2 or 3 items, strings or ranks"; the
    # positions are checked here.
    def __init__(self, **kwargs):
        super().__init__(
            metadata={
                "type": "array",
                "minItems": 2,
                "maxItems": 3,
                "items": {
                    "oneOf": [
                        {"type": "string", "maxLength": 65536},
                        {"type": "integer", "minimum": 0, "maximum": 1023},
                    ]
                },
                "description": "[stream (stdout, stderr or system), text] or [stream, text, rank]",
            },
            **kwargs,
        )

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, list) or len(value) not in (2, 3):
            raise ValidationError("[stream, text] or [stream, text, rank]")
        stream, text = value[0], value[1]
        if stream not in ("stdout", "stderr", "system"):
            raise ValidationError("stream must be stdout, stderr or system")
        if not isinstance(text, str) or len(text) > 65536 or "\x00" in text:
            raise ValidationError("text must be a string of at most 65536 characters without NUL")
        if len(value) == 3 and (
            isinstance(value[2], bool) or not isinstance(value[2], int) or not 0 <= value[2] < 1024
        ):
            raise ValidationError("rank must be an integer from 0 to 1023")
        return list(value)


class ChunkQuerySchema(Schema):
    """The query of a chunk upload (fleetwire ChunkMeta without its first line, which is in the
    path)."""

    epoch = Int(minimum=0, maximum=2**62, required=True, strict=False)
    lines = Int(minimum=1, maximum=CHUNK_RAW_BYTES + MAX_LINE_BYTES, required=True, strict=False)
    bytes = Int(
        minimum=1, maximum=CHUNK_RAW_BYTES + MAX_LINE_BYTES + 64, required=True, strict=False
    )
    first_at = Int(minimum=0, maximum=MAX_AT_MS, required=True, strict=False)
    last_at = Int(minimum=0, maximum=MAX_AT_MS, required=True, strict=False)


class OutputSummarySchema(Schema):
    lines = Int(minimum=0, maximum=2**62, required=True)
    bytes = Int(minimum=0, maximum=2**62, required=True)
    truncated = Bool(load_default=False)


_MS = {"minimum": 0, "maximum": MAX_AT_MS}


class LogBatchSchema(Schema):
    """An OutputBatch (fleetwire.output: the next `count` lines from `first_line`, with the texts
    of some as [line, at_ms, stream, text]), or, from an agent before it, [stream, text(, rank)]
    lines without numbers."""

    epoch = Int(minimum=0, maximum=2**62, required=True)
    first_line = Int(minimum=0, maximum=2**62)
    count = Int(minimum=0, maximum=2**62)
    first_at = Int(**_MS)
    last_at = Int(**_MS)
    bytes = Int(minimum=0, maximum=2**62)
    notice = fields.String(validate=validate.OneOf(NOTICES))
    lines = fields.List(
        fields.Raw(
            metadata={
                "type": "array",
                "minItems": 2,
                "maxItems": 4,
                "items": {
                    "oneOf": [
                        {"type": "string", "maxLength": 65536},
                        {"type": "integer", "minimum": 0, "maximum": MAX_AT_MS},
                    ]
                },
                "description": (
                    "[line, at_ms, stream, text]; from an agent before numbered lines, [stream, "
                    "text] or [stream, text, rank]"
                ),
            }
        ),
        required=True,
        validate=validate.Length(max=5000),
    )

    @post_load
    def _typed(self, data, **_kwargs):
        """The checked body as the wire's OutputBatch or LogBatch."""
        try:
            if "first_line" not in data:
                for line in data["lines"]:
                    LogLineField().deserialize(line)
                return LogBatch.from_wire(data)
            return OutputBatch.from_wire(data)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class TaskFinishSchema(Schema):
    epoch = Int(required=True)
    outcome = fields.String(
        required=True, validate=validate.OneOf(["succeeded", "failed", "cancelled"])
    )
    exit_code = fields.Integer(
        strict=True, validate=validate.Range(min=-255, max=255), load_default=None, allow_none=True
    )
    reason = Text(max_length=2000, load_default="")
    lost = Bool(
        load_default=False,
        metadata={
            "description": (
                "the agent ended the task itself (stop, restart, upgrade): retried as a lost node"
            )
        },
    )
    agent_stopping = Bool(
        load_default=False,
        metadata={
            "description": (
                "with lost: the agent stopped the task because it is shutting down (stop, "
                "upgrade): the job is requeued without using an attempt"
            )
        },
    )
    pid = Int(
        minimum=1,
        maximum=2**31,
        load_default=None,
        allow_none=True,
        metadata={
            "description": (
                "the process ended before its start was reported: this finish reports the start too"
            )
        },
    )
    idle = Bool(
        load_default=False,
        metadata={
            "description": (
                "an instance's run stopped by its idle rule (GPU utilisation under its threshold)"
            )
        },
    )
    ports = fields.List(fields.Nested(PortMappingSchema), **PORT_MAPPINGS)
    started_seconds_ago = _started_seconds_ago(
        "with pid: how long before this report the process started (the agent's own clock "
        "measures the interval, so host clocks need not agree)"
    )
    output = fields.Nested(
        OutputSummarySchema,
        load_default=None,
        allow_none=True,
        metadata={"description": "the task's whole output: lines, bytes, truncated by its cap"},
    )

    @validates_schema
    def _ago_needs_pid(self, data, **_kwargs):
        if data.get("started_seconds_ago") is not None and data.get("pid") is None:
            raise ValidationError(
                "only a finish that carries the start (pid) says when it started",
                "started_seconds_ago",
            )

    @post_load
    def _typed(self, data, **_kwargs):
        """The checked body as the wire's one definition of a finish report (fleetwire.finish)."""
        try:
            return TaskFinish.from_wire(data)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class TaskFinishItemSchema(TaskFinishSchema):
    task_id = Text(required=True, min_length=1, max_length=128)

    @post_load
    def _typed(self, data, **_kwargs):
        """(task id, its TaskFinish)."""
        data = dict(data)
        task_id = data.pop("task_id")
        try:
            return task_id, TaskFinish.from_wire(data)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class TaskFinishBatchSchema(Schema):
    finishes = fields.List(
        fields.Nested(TaskFinishItemSchema),
        required=True,
        validate=validate.Length(min=1, max=MAX_FINISHES),
    )

    @validates_schema
    def _once_each(self, data, **_kwargs):
        ids = [task_id for task_id, _finish in data.get("finishes", [])]
        if len(set(ids)) != len(ids):
            raise ValidationError("each task may be reported once per call", "finishes")


class TaskFinishResultSchema(Schema):
    task_id = fields.String()
    status = fields.Integer(
        metadata={"description": "204 when settled, else the status a single finish would get"}
    )
    error = fields.Dict(
        allow_none=True, metadata={"description": "the error envelope's `error` object, or null"}
    )


class TaskFinishBatchReplySchema(Schema):
    results = fields.List(fields.Nested(TaskFinishResultSchema))


class ArtifactSchema(Schema):
    sha256 = fields.String()
    name = fields.String()
    kind = fields.String()
    size = fields.Integer()
