"""Schemas of instances (InstanceSpec, Instance)."""

import re

from marshmallow import Schema, ValidationError, fields, post_load, validate, validates_schema

from fleetd.models import InstanceState
from fleetd.names import PROJECT_KEY
from fleetd.scheduler import MIN_SLICE_MEMORY_BYTES
from fleetd.schemas.agent import PORT_STATES
from fleetd.schemas.common import FullRegexp, Int, PageQuerySchema, Text, Time, page_schema
from fleetd.schemas.jobs import (
    ENV_NAME,
    MIN_GPU_FRACTION,
    GpuCount,
    MigProfile,
    NodeSelectorSchema,
    Pids,
    TopologyMode,
    _at_most_256,
    _slice_memory,
    reserved_name_error,
)
from fleetd.specs import DEFAULT_MOUNT, InstanceSpec
from fleetwire.assignment import (
    MAX_RUNTIME_ARGS,
    MAX_SHM_BYTES,
    RUNTIME_ARG_PATTERN,
    RUNTIME_ARGS,
    runtime_arg_error,
    shm_size_bytes,
)

IMAGE = FullRegexp(
    r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$",
    error="an image reference: letters, digits and ._/:@+- (e.g. localhost/app:1)",
)
MAX_VOLUME_BYTES = 1 << 50  # 1 PiB


# An absolute path of segments that are not '..' and hold no ':' or ',' (podman's -v separators).
MOUNT_PATH = FullRegexp(
    r"^(/(?!\.\.(?:/|$))[^/:,\x00-\x1f]*)+$",
    error="an absolute path inside the container, without '..', ':' or ','",
)


class InstanceResourcesSchema(Schema):
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
        metadata={
            "minimum": MIN_SLICE_MEMORY_BYTES,
            "description": (
                "GPU memory of a slice of one GPU, as for jobs: the scheduler reserves it and the "
                "node stops the run past it (gpu_memory_limit_exceeded)"
            ),
        },
    )
    gpu_types = fields.List(
        Text(min_length=1, max_length=128), validate=validate.Length(max=32), load_default=list
    )
    cpus = fields.Float(validate=validate.Range(min=0, max=100_000), load_default=0)
    memory_bytes = Int(load_default=0)
    pids = Pids()
    topology = TopologyMode()
    mig = MigProfile()


class PortSchema(Schema):
    port = Int(required=True, minimum=1, maximum=65535)
    protocol = fields.String(validate=validate.OneOf(["http", "tcp"]), load_default="http")


class IdleStopSchema(Schema):
    gpu_util_below_percent = fields.Float(
        required=True,
        validate=validate.Range(min=0, max=100, min_inclusive=False),
        metadata={"exclusiveMinimum": True},
    )
    for_seconds = Int(required=True, minimum=10, maximum=30 * 86400)


# The shape of an id (fleetd.models.new_id): a name of that shape could name two instances at once.
ID_SHAPE = re.compile(r"[0-9a-f]{20}")


def _a_handle(name):
    """Instance names are handles (`fleetd instance show NAME`, /ui/instances/NAME): none may read
    as something else."""
    reserved = reserved_name_error(name, "instances")
    if reserved is not None:
        raise ValidationError(reserved)
    if ID_SHAPE.fullmatch(name):
        raise ValidationError(
            "20 lowercase hex digits is the shape of an id; choose a name that is not one"
        )


def _runtime_arg(arg):
    error = runtime_arg_error(arg)
    if error is not None:
        raise ValidationError(error)


def _distinct(ports):
    seen = [p["port"] for p in ports]
    if len(set(seen)) != len(seen):
        raise ValidationError(
            f"each port at most once (repeated: {sorted({p for p in seen if seen.count(p) > 1})})"
        )


class InstanceSpecSchema(Schema):
    name = Text(
        required=True,
        min_length=1,
        max_length=200,
        validate=[_a_handle],
        metadata={
            "description": (
                "unique among the owner's instances that are not deleted; not `new`, not shaped "
                "like an id; visible characters of one script in NFKC form (no bidi controls, no "
                "invisible ones)"
            )
        },
    )
    command = fields.List(
        Text(max_length=65536), validate=validate.Length(max=4096), load_default=list
    )
    image = fields.String(validate=IMAGE, load_default=None, allow_none=True)
    env = fields.Dict(
        keys=fields.String(validate=ENV_NAME),
        values=Text(max_length=65536),
        validate=_at_most_256,
        load_default=dict,
        metadata={"maxProperties": 256},
    )
    resources = fields.Nested(
        InstanceResourcesSchema, load_default=lambda: InstanceResourcesSchema().load({})
    )
    volume_bytes = Int(maximum=MAX_VOLUME_BYTES, load_default=0)
    volume_mount_path = Text(max_length=1024, load_default=DEFAULT_MOUNT, validate=[MOUNT_PATH])
    runtime_args = fields.List(
        fields.String(validate=_runtime_arg, metadata={"pattern": RUNTIME_ARG_PATTERN}),
        validate=validate.Length(max=MAX_RUNTIME_ARGS),
        load_default=list,
        metadata={
            "description": (
                "extra container runtime arguments, image only, each --flag=value from an "
                "allow-list: "
            )
            + ", ".join(sorted(RUNTIME_ARGS))
            + f"; --shm-size at most resources.memory_bytes where "
            f"set, and at most {MAX_SHM_BYTES // 1024**3}g"
        },
    )
    scratch_bytes = Int(
        maximum=MAX_VOLUME_BYTES,
        load_default=0,
        metadata={
            "description": (
                "the most its scratch space (wiped at every start) may hold: its working "
                "directory, and a container's own writable layer; measured by its node, which "
                "stops the run (failed, with the reason) once it holds more. 0: no limit"
            )
        },
    )
    ports = fields.List(
        fields.Nested(PortSchema), validate=[validate.Length(max=32), _distinct], load_default=list
    )
    priority_class = fields.String(
        validate=validate.OneOf(["on-demand", "spot"]), load_default="on-demand"
    )
    project = fields.String(
        validate=FullRegexp(PROJECT_KEY),
        load_default=None,
        allow_none=True,
        metadata={"description": "the key of its project (default: the creator's default project)"},
    )
    bid = fields.Float(validate=validate.Range(min=0, max=1e9), load_default=None, allow_none=True)
    node_selector = fields.Nested(
        NodeSelectorSchema, load_default=lambda: NodeSelectorSchema().load({})
    )
    restart = fields.String(
        validate=validate.OneOf(["always", "on-failure", "never"]), load_default="on-failure"
    )
    idle_stop = fields.Nested(IdleStopSchema, load_default=None, allow_none=True)

    @validates_schema
    def _consistent(self, data, **kwargs):
        if not data.get("command") and not data.get("image"):
            raise ValidationError("a command is required without an image", "command")
        if data.get("bid") is not None and data.get("priority_class") != "spot":
            raise ValidationError("a bid applies to spot instances only", "bid")
        if data.get("idle_stop") and not (data.get("resources") or {}).get("gpus"):
            raise ValidationError(
                "idle stop watches GPU utilisation: the instance needs GPUs", "idle_stop"
            )
        if any(name.startswith("FLEET_") for name in data.get("env") or {}):
            raise ValidationError("FLEET_* variables are set by fleet-agent", "env")
        if data.get("runtime_args") and not data.get("image"):
            raise ValidationError(
                "runtime arguments apply to an image (a container) only", "runtime_args"
            )
        memory = (data.get("resources") or {}).get("memory_bytes") or 0
        for arg in data.get("runtime_args") or ():
            flag, _, value = arg.partition("=")
            if flag == "--shm-size" and memory and shm_size_bytes(value) > memory:
                raise ValidationError(
                    f"--shm-size={value} is more than resources.memory_bytes ({memory}): /dev/shm "
                    f"is memory, charged to the instance's limit",
                    "runtime_args",
                )

    @post_load
    def _typed(self, data, **kwargs):
        return InstanceSpec.from_dict(data)


class ResumeSchema(Schema):
    gpus = GpuCount(
        load_default=None,
        allow_none=True,
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
    bid = fields.Float(validate=validate.Range(min=0, max=1e9), load_default=None, allow_none=True)


class RuntimePortSchema(Schema):
    private_port = fields.Integer()
    public_port = fields.Integer()
    ip = fields.String()
    is_ip_public = fields.Boolean()
    type = fields.String()
    url = fields.String(
        allow_none=True, metadata={"description": "as GET .../connection answers it"}
    )
    state = fields.String(
        metadata={
            "enum": list(PORT_STATES),
            "description": (
                "whose listener the host port has, as its node last reported: ok (the instance's), "
                "not_listening, taken_by_other_process (another process: connections could reach "
                "it), unknown (not reported yet)"
            ),
        }
    )


class RuntimeGpuSchema(Schema):
    uuid = fields.String()
    gpu_util_percent = fields.Float(allow_none=True)
    memory_util_percent = fields.Float(allow_none=True)


class RuntimeContainerSchema(Schema):
    cpu_percent = fields.Float(allow_none=True)
    memory_percent = fields.Float(allow_none=True)


class RuntimeSchema(Schema):
    uptime_seconds = fields.Float()
    ports = fields.List(fields.Nested(RuntimePortSchema))
    gpus = fields.List(fields.Nested(RuntimeGpuSchema))
    container = fields.Nested(RuntimeContainerSchema, allow_none=True)
    restarts = fields.Integer(
        metadata={"description": "restarts of its process by its node's restart policy"}
    )
    volume_used_bytes = fields.Integer(allow_none=True)


class WorkloadRefSchema(Schema):
    kind = fields.String(metadata={"enum": ["job", "instance"]})
    id = fields.String()
    name = fields.String()


class LastExitSchema(Schema):
    exit_code = fields.Integer(
        allow_none=True, metadata={"description": "as a shell reports it (128+N: signal N)"}
    )
    signal = fields.String(
        allow_none=True, metadata={"description": "the signal that ended it (SIGKILL), or null"}
    )
    reason = fields.String(metadata={"description": "how it ended, in words"})
    at = fields.String(metadata={"description": "when (ISO 8601, UTC)"})
    backoff_seconds = fields.Float(
        allow_none=True,
        metadata={
            "description": (
                "the wait its node's restart policy chose before starting it again; null: not "
                "restarted"
            )
        },
    )


class InstanceSchema(Schema):
    id = fields.String()
    name = fields.String()
    owner = fields.String()
    team = fields.String(allow_none=True)
    project = fields.String(allow_none=True, metadata={"description": "its project's key"})
    user = fields.String(
        allow_none=True, metadata={"description": "its user's login (null: a service account's)"}
    )
    state = fields.String(metadata={"enum": [s.value for s in InstanceState]})
    status_reason = fields.String(
        metadata={"description": "why it is in its state (the last change's reason)"}
    )
    desired_state = fields.String(metadata={"enum": ["running", "stopped"]})
    pending_reason = fields.String()
    node_id = fields.String(allow_none=True)
    node_hostname = fields.String(allow_none=True)
    interrupted_by = fields.Nested(
        WorkloadRefSchema,
        allow_none=True,
        metadata={
            "description": (
                "while interrupted by a preemption: the on-demand workload whose placement "
                "preempted it; null otherwise (see interruption)"
            )
        },
    )
    interruption = fields.String(
        allow_none=True,
        metadata={
            "enum": ["preempted", "node_lost", "drain", None],
            "description": (
                "while interrupted, why: on-demand work preempted it (resume it), its node was "
                "lost (it runs on by itself when the node is back) or its node's drain deadline "
                "passed (resume it)"
            ),
        },
    )
    last_exit = fields.Nested(
        LastExitSchema,
        allow_none=True,
        metadata={
            "description": (
                "how its process last ended, as its node reported it (null before it ever ended)"
            )
        },
    )
    next_start_at = Time(
        allow_none=True,
        metadata={
            "description": (
                "while restarting: when its node starts the process again (the back-off's end)"
            )
        },
    )
    # A title of its own: an untitled inline object here is named InstanceSpec by client generators,
    # which is the name of the create body's model.
    spec = fields.Dict(
        metadata={
            "title": "as stored",
            "description": "its InstanceSpec as stored, with the team of the token that created it",
        }
    )
    created_at = Time()
    started_at = Time()
    stopped_at = Time()
    price_per_hour = fields.Float(allow_none=True)
    cost_so_far = fields.Float()
    storage_cost_so_far = fields.Float(
        metadata={
            "description": (
                "its volume's storage cost so far (stopped or not), at the storage price per "
                "GB-month"
            )
        }
    )
    runs = fields.Integer()
    runtime = fields.Nested(RuntimeSchema, allow_none=True)


InstancePageSchema = page_schema(InstanceSchema, "InstancePage")


class InstanceQuerySchema(PageQuerySchema):
    state = fields.String(
        validate=validate.OneOf([s.value for s in InstanceState]), load_default=None
    )
    owner = Text(max_length=200, load_default=None)
    name = Text(
        max_length=200,
        load_default=None,
        metadata={"description": "only instances of exactly this name"},
    )


class InstanceWaitSchema(Schema):
    wait_seconds = fields.Float(validate=validate.Range(min=0, max=30), load_default=0)


class ConnectionQuerySchema(Schema):
    port = Int(minimum=1, maximum=65535, load_default=None, strict=False)
    wait_seconds = fields.Float(validate=validate.Range(min=0, max=30), load_default=0)


class ConnectionSchema(Schema):
    url = fields.String()
    host = fields.String()
    port = fields.Integer()
    protocol = fields.String()


class HostPortQuerySchema(Schema):
    """Seed 000's assign-host-port query: `podName` names an instance."""

    pod_name = Text(
        data_key="podName",
        required=True,
        min_length=1,
        max_length=200,
        metadata={"description": "the instance: its id, or its name among your instances"},
    )
    port = Int(
        minimum=1,
        maximum=65535,
        load_default=None,
        strict=False,
        metadata={
            "description": "the declared port (may be left out when the instance declares one)"
        },
    )
    wait_seconds = fields.Float(
        validate=validate.Range(min=0, max=30),
        load_default=0,
        metadata={"description": "wait this long for the instance to run"},
    )
