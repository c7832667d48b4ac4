"""Schemas of the agent protocol."""

from marshmallow import Schema, ValidationError, fields, post_load, validate

from fleetd.names import LOGIN
from fleetd.schemas.common import Bool, FullRegexp, Int, Labels, Text
from fleetd.schemas.mig_wire import MigEvents, MigLayoutSchema
from fleetd.schemas.nodes import DrainSchema
from fleetwire.heartbeat import MAX_ACCOUNTS, Heartbeat
from fleetwire.mig import (
    MAX_MIG_DEVICES,
    MEMORY_SLOTS,
    MIG_UUID,
    PROFILE_NAME,
    mig_devices_from_wire,
)
from fleetwire.registration import Registration
from fleetwire.topology import (
    LINK_CLASSES,
    MAX_NICS,
    MAX_NVLINKS,
    NIC_CLASSES,
    NIC_KINDS,
    NIC_NAME,
    PCI_BUS_ID,
    SELF_LINK,
)
from fleetwire.topology import (
    MAX_GPUS as MAX_TOPOLOGY_GPUS,
)

MACHINE_ID = FullRegexp(
    r"^[A-Za-z0-9._:-]{1,128}$", error="letters, digits and ._:- only, at most 128"
)


class MigDeviceSchema(Schema):
    """A MIG device as a GPU report lists it (fleetwire.mig.MigDevice checks it again, with the
    rules across its fields and the list: start with size, slots not shared, uuids unique)."""

    uuid = fields.String(required=True, validate=FullRegexp(MIG_UUID.pattern, error="MIG-<uuid>"))
    memory_total_bytes = Int(allow_none=True, load_default=None)
    profile = fields.String(
        allow_none=True, load_default=None, validate=FullRegexp(PROFILE_NAME.pattern)
    )
    start = Int(allow_none=True, load_default=None, maximum=MEMORY_SLOTS - 1)
    size = Int(allow_none=True, load_default=None, minimum=1, maximum=MEMORY_SLOTS)


class GpuReportSchema(Schema):
    uuid = Text(required=True, min_length=1, max_length=128)
    index = Int(required=True, maximum=1023)
    vendor = Text(max_length=32, load_default="nvidia")
    model = Text(required=True, max_length=128)
    memory_total_bytes = Int(required=True)
    numa_node = Int(maximum=1023, load_default=None, allow_none=True)
    max_tflops = fields.Float(
        load_default=None, allow_none=True, validate=validate.Range(min=0, max=1e7)
    )
    healthy = Bool(load_default=True)
    health_reason = Text(max_length=500, load_default="")
    mig_mode = Text(max_length=16, load_default=None, allow_none=True)
    serial = Text(
        max_length=64,
        load_default=None,
        allow_none=True,
        metadata={
            "description": "the board serial number: the GPU's history follows it across hosts"
        },
    )
    board_part_number = Text(max_length=64, load_default=None, allow_none=True)
    vbios = Text(max_length=64, load_default=None, allow_none=True)
    xids = fields.List(
        Int(maximum=2**31),
        validate=validate.Length(max=64),
        load_default=list,
        metadata={"description": "critical XIDs the agent saw on this GPU since it started"},
    )
    ecc_uncorrected = Int(
        load_default=None,
        allow_none=True,
        metadata={
            "description": "uncorrectable ECC errors since the driver loaded (null: not supported)"
        },
    )
    mig_devices = fields.List(
        fields.Nested(MigDeviceSchema),
        load_default=None,
        allow_none=True,
        validate=[validate.Length(max=MAX_MIG_DEVICES), lambda value: _mig_devices(value)],
        metadata={
            "description": (
                "with MIG enabled, its MIG devices: [{uuid, memory_total_bytes, profile, start, "
                "size}] (fleetwire.mig.MigDevice)"
            )
        },
    )

    @post_load
    def _no_mig_is_null(self, data, **kwargs):
        """No MIG device reads as null, as a GPU row stores it."""
        data["mig_devices"] = data.get("mig_devices") or None
        return data


def _mig_devices(value):
    try:
        mig_devices_from_wire(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc


def _unique_uuids(gpus):
    uuids = [g["uuid"] for g in gpus]
    if len(uuids) != len(set(uuids)):
        raise validate.ValidationError("GPU uuids must be unique")


GpuList = lambda **kw: fields.List(  # noqa: E731 - one definition for register and heartbeat
    fields.Nested(GpuReportSchema), validate=[validate.Length(max=64), _unique_uuids], **kw
)


CONTAINER_RUNTIME = fields.String(
    validate=validate.OneOf(["podman", "docker"]),
    load_default=None,
    allow_none=True,
    metadata={"description": "the container runtime that can run images here"},
)


class ReportedResourcesSchema(Schema):
    cpu_count = Int(required=True, maximum=1_000_000)
    memory_bytes = Int(required=True)
    container_runtime = CONTAINER_RUNTIME


CONTAINERS_ERROR = '"ready" or "unavailable: <reason>" (one line)'


def _one_line(value):
    if (
        "\n" in value or "\r" in value
    ):  # Python's `$` would let a trailing newline through the pattern
        raise ValidationError(CONTAINERS_ERROR)


MAX_HOST_UIDS = 4096


class CapabilitiesSchema(Schema):
    container_runtime = CONTAINER_RUNTIME
    isolation = fields.String(
        validate=validate.OneOf(["uid", "none"]),
        metadata={
            "description": (
                "uid: the agent runs each task as its owner's uid; none: it cannot switch users "
                "(not root); left out by older agents (read as none)"
            )
        },
    )
    isolation_reason = Text(max_length=500, metadata={"description": "why isolation is none"})
    containers = Text(
        max_length=500,
        validate=[FullRegexp(r"^(ready|unavailable: .+)$", error=CONTAINERS_ERROR), _one_line],
        metadata={
            "description": 'whether the container runtime works: "ready" or "unavailable: <reason>"'
        },
    )
    host_uids = fields.List(
        Int(maximum=2**32 - 1),
        validate=validate.Length(max=MAX_HOST_UIDS),
        metadata={
            "description": (
                "uids of the host's own users (>= 1000): fleetd never allocates them to task owners"
            )
        },
    )

    accounts = fields.Dict(
        keys=fields.String(validate=FullRegexp(LOGIN, error="a login")),
        values=fields.List(
            Int(minimum=0, maximum=2**31 - 1), allow_none=True, validate=validate.Length(equal=2)
        ),
        validate=validate.Length(max=MAX_ACCOUNTS),
        metadata={
            "description": (
                "owners' accounts fleetd asked the node to look up (lookup_accounts): login -> "
                "[uid, gid] as the node's user database resolves it, or null where it does not"
            )
        },
    )


class Percent(fields.Float):
    def __init__(self, **kwargs):
        super().__init__(
            validate=validate.Range(min=0, max=100_000),
            load_default=None,
            allow_none=True,
            **kwargs,
        )


class InstanceGpuSampleSchema(Schema):
    uuid = Text(required=True, max_length=128)
    gpu_util_percent = Percent()
    memory_util_percent = Percent()


class InstanceContainerSampleSchema(Schema):
    cpu_percent = Percent()
    memory_percent = Percent()


PORT_STATES = ("ok", "not_listening", "taken_by_other_process", "unknown")
MAX_INSTANCE_PORTS = 32  # as an instance declares at most


class InstancePortSampleSchema(Schema):
    port = Int(
        required=True, minimum=1, maximum=65535, metadata={"description": "the declared port"}
    )
    host_port = Int(
        required=True, minimum=1, maximum=65535, metadata={"description": "the node's port for it"}
    )
    state = fields.String(
        required=True,
        validate=validate.OneOf(PORT_STATES),
        metadata={
            "description": "whose listener the host port has: ok (the instance's), not_listening, "
            "taken_by_other_process, unknown (not looked at yet)"
        },
    )


class InstanceSampleSchema(Schema):
    task_id = Text(required=True, min_length=1, max_length=64)
    epoch = Int(required=True)
    uptime_seconds = fields.Float(
        validate=validate.Range(min=0, max=1e10), load_default=None, allow_none=True
    )
    restarts = Int(load_default=0, maximum=10**9)
    gpus = fields.List(
        fields.Nested(InstanceGpuSampleSchema), validate=validate.Length(max=64), load_default=list
    )
    container = fields.Nested(InstanceContainerSampleSchema, load_default=None, allow_none=True)
    volume_used_bytes = Int(load_default=None, allow_none=True)
    ports = fields.List(
        fields.Nested(InstancePortSampleSchema),
        validate=validate.Length(max=MAX_INSTANCE_PORTS),
        load_default=list,
        metadata={"description": "the state of each host port of the run"},
    )


class NicSchema(Schema):
    name = fields.String(required=True, validate=FullRegexp(NIC_NAME.pattern))
    kind = fields.String(required=True, validate=validate.OneOf(NIC_KINDS))
    pci_bus_id = fields.String(required=True, validate=FullRegexp(PCI_BUS_ID.pattern))
    links = fields.List(
        fields.String(validate=validate.OneOf(NIC_CLASSES)),
        required=True,
        validate=validate.Length(min=1, max=MAX_TOPOLOGY_GPUS),
        metadata={"description": "its class to each GPU, in the order of the topology's gpus"},
    )


def _square(item, **kw):
    return fields.List(
        fields.List(item, validate=validate.Length(min=1, max=MAX_TOPOLOGY_GPUS)),
        required=True,
        validate=validate.Length(min=1, max=MAX_TOPOLOGY_GPUS),
        **kw,
    )


class TopologySchema(Schema):
    """How a host's GPUs and NICs connect (docs/api.md, Topology). fleetwire.topology checks what
    a document cannot state: the matrices square and symmetric over `gpus`, self on the diagonal
    only, NVLinks counted exactly where a pair's class has them, the GPUs those reported."""

    gpus = fields.List(
        fields.String(validate=validate.Length(min=1, max=128)),
        required=True,
        validate=validate.Length(min=1, max=MAX_TOPOLOGY_GPUS),
    )
    links = _square(
        fields.String(validate=validate.OneOf((SELF_LINK, *LINK_CLASSES))),
        metadata={"description": "links[i][j]: the best path between gpus[i] and gpus[j]"},
    )
    nvlink_count = _square(
        Int(maximum=MAX_NVLINKS),
        metadata={"description": "the NVLinks between each pair (to the NVSwitches for nvswitch)"},
    )
    nics = fields.List(
        fields.Nested(NicSchema), load_default=list, validate=validate.Length(max=MAX_NICS)
    )


def topology_field(when=""):
    """A registration's or a heartbeat's `topology`."""
    return fields.Nested(
        TopologySchema,
        load_default=None,
        allow_none=True,
        metadata={
            "description": (
                "how the GPUs and NICs connect, checked by fleetwire.topology (docs/api.md, "
                f"Topology){when}"
            )
        },
    )


class RegisterSchema(Schema):
    hostname = Text(required=True, min_length=1, max_length=255)
    machine_id = fields.String(required=True, validate=MACHINE_ID)
    agent_version = Text(required=True, max_length=64)
    address = Text(required=True, max_length=255)
    labels = Labels(load_default=dict)
    resources = fields.Nested(ReportedResourcesSchema, required=True)
    gpus = GpuList(required=True)
    capabilities = fields.Nested(
        CapabilitiesSchema,
        load_default=None,
        allow_none=True,
        metadata={"description": "what the host can run (as in heartbeats)"},
    )
    topology = topology_field()

    @post_load
    def _typed(self, data, **kwargs):
        """The checked body as the wire's one definition of a registration
        (fleetwire.registration)."""
        try:
            return Registration.from_wire(data)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class RegisteredSchema(Schema):
    node_id = fields.String()
    fleet = fields.String()
    session_token = fields.String(
        metadata={"description": "The node's secret; shown only in this response."}
    )
    heartbeat_interval_seconds = fields.Integer()


class TaskReportSchema(Schema):
    id = Text(required=True, min_length=1, max_length=64)
    epoch = Int(required=True)
    state = Text(required=True, max_length=32)


class HeartbeatSchema(Schema):
    gpus = GpuList(load_default=None, allow_none=True)
    topology = topology_field(
        "; with gpus only, when they are sent: the node's topology is replaced by it"
    )
    metrics = fields.Dict(load_default=None, allow_none=True)
    tasks = fields.List(
        fields.Nested(TaskReportSchema), validate=validate.Length(max=1024), load_default=list
    )
    capabilities = fields.Nested(
        CapabilitiesSchema,
        load_default=None,
        allow_none=True,
        metadata={
            "description": (
                "what the host can run; sent on the first heartbeat after the agent starts and on "
                "change"
            )
        },
    )
    instances = fields.List(
        fields.Nested(InstanceSampleSchema),
        validate=validate.Length(max=1024),
        load_default=list,
        metadata={"description": "runtime figures of the instance runs"},
    )
    volumes = fields.List(
        Text(min_length=1, max_length=64),
        validate=validate.Length(max=1024),
        load_default=None,
        allow_none=True,
        metadata={"description": "the instance volumes present on the node"},
    )
    agent_version = Text(
        min_length=1,
        max_length=64,
        load_default=None,
        metadata={
            "description": (
                "the agent's version; sent on the first heartbeat after the agent starts and on "
                "change"
            )
        },
    )
    bundle_sha256 = fields.String(
        load_default=None,
        validate=FullRegexp(r"^([0-9a-f]{64})?$", error="a SHA-256 in lowercase hex, or empty"),
        metadata={
            "description": (
                "SHA-256 of the offline bundle the agent was installed from ('' when none); sent "
                "with agent_version"
            )
        },
    )
    draining = Bool(
        load_default=None,
        allow_none=True,
        metadata={
            "description": (
                "true: the agent takes no new work (fleetd cordons a ready node with the reason "
                '"agent '
                "draining\"); false: it does again (that cordon ends; an admin's stays); left out: "
                "no change"
            )
        },
    )
    mig_events = MigEvents(
        load_default=list,
        metadata={
            "description": (
                "dynamic MIG: what came of the target layouts fleetd sent (mig_layouts), sent "
                "until a heartbeat carrying them is answered"
            )
        },
    )
    labels = Labels(
        load_default=None,
        allow_none=True,
        metadata={
            "description": (
                "the labels of the agent's config file; sent with agent_version. fleetd keeps them "
                "as the node's agent_labels; labels set through the API win per key"
            )
        },
    )

    @post_load
    def _typed(self, data, **kwargs):
        """The checked body as the wire's one definition of a heartbeat (fleetwire.heartbeat)."""
        try:
            return Heartbeat.from_wire(data)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class HeartbeatReplySchema(Schema):
    status = fields.String()
    drain = fields.Nested(DrainSchema, allow_none=True)
    revoked = fields.Boolean()
    cancel = fields.List(fields.String())
    heartbeat_interval_seconds = fields.Integer()
    delete_volumes = fields.List(
        fields.String(),
        metadata={
            "description": (
                "instance volumes the node must delete (their instance is deleted or elsewhere)"
            )
        },
    )
    validation = fields.Dict(
        allow_none=True,
        metadata={
            "description": (
                "while the node validates: {id, suite}, the checks its agent runs and posts to "
                "/agent/validations/{id} (docs/validation.md); null otherwise"
            )
        },
    )
    mig_layouts = fields.List(
        fields.Nested(MigLayoutSchema),
        metadata={
            "description": (
                "dynamic MIG: target layouts for the node's GPUs whose slices are all idle; the "
                "agent applies each and reports it in mig_events"
            )
        },
    )
    lookup_accounts = fields.List(
        fields.String(),
        metadata={
            "description": (
                "logins whose host accounts the node looks up and reports in its capabilities "
                "(`accounts`): owners with work queued for its fleet, which runs tasks as their "
                "own accounts (task_identity nss)"
            )
        },
    )
    lease_seconds = fields.Float(
        metadata={
            "description": (
                "how long a task's lease lasts without a heartbeat that fleetd answers "
                "(task_lease_seconds, widened with the heartbeat interval): the node stops its job "
                "tasks before it runs out"
            )
        }
    )
