"""Schemas of the validation gate (a fleet's setting, a node's validation, the agent's results) and
of GPU records by serial."""

from marshmallow import Schema, ValidationError, fields, post_load, validate

from fleetd.schemas.common import Bool, Int, PageQuerySchema, Text, Time, page_schema
from fleetd.schemas.nodes import EventSchema
from fleetd.services.nodes.gpus import GPU_STATES
from fleetd.services.nodes.validation import BUILTIN_CHECKS, RESULT_STATUSES, STATES
from fleetwire.tasks import ValidationReport


class ValidationSettingSchema(Schema):
    """What a fleet's new or repaired nodes must pass; {} runs every built-in check with the
    defaults."""

    checks = fields.List(
        fields.String(validate=validate.OneOf(BUILTIN_CHECKS)),
        validate=validate.Length(max=32),
        metadata={"description": "the built-in checks to run (default: all of them)"},
    )
    dcgm_level = Int(
        maximum=4,
        metadata={"description": "`dcgmi diag -r N` where DCGM is installed (default 1; 0: never)"},
    )
    command = fields.List(
        Text(min_length=1, max_length=4096),
        validate=validate.Length(min=1, max=256),
        allow_none=True,
        metadata={
            "description": "a command (argv) the node runs as well, e.g. a burn-in or an NCCL "
            "test: passes when it exits 0; its output is kept"
        },
    )
    timeout_seconds = Int(
        minimum=1, maximum=86400, metadata={"description": "the command's time limit (default 600)"}
    )
    command_as_root = Bool(
        metadata={
            "description": "run the command as root (default false: as an unprivileged "
            "user, like tasks)"
        }
    )
    expected_gpus = Int(
        maximum=1024,
        allow_none=True,
        metadata={
            "description": "GPUs every node must have (default: as many as the node reported)"
        },
    )
    driver_version = Text(
        min_length=1,
        max_length=64,
        allow_none=True,
        metadata={
            "description": (
                "pin: the driver version nodes must run (default: the one most of the fleet's "
                "validated nodes run)"
            )
        },
    )
    cuda_version = Text(
        min_length=1,
        max_length=16,
        allow_none=True,
        metadata={
            "description": (
                "pin: the CUDA driver version, e.g. 12.4 (default: the fleet's most common)"
            )
        },
    )
    mig_mode = fields.String(
        validate=validate.OneOf(["enabled", "disabled"]),
        allow_none=True,
        metadata={
            "description": "MIG mode every GPU must be in (default: any, but no change pending)"
        },
    )
    max_temperature_c = Int(
        minimum=20,
        maximum=120,
        allow_none=True,
        metadata={
            "description": (
                "the hottest an idle GPU may be (default 85; never at its slowdown threshold)"
            )
        },
    )
    pcie_width = Int(
        minimum=1,
        maximum=32,
        allow_none=True,
        metadata={
            "description": (
                "the PCIe link width every GPU's link must reach at its maximum (default 16)"
            )
        },
    )


ValidationSetting = lambda **kw: fields.Nested(  # noqa: E731 - one definition for create and update
    ValidationSettingSchema,
    allow_none=True,
    metadata={
        "description": (
            "the validation gate: null, no gate (nodes are ready at their first heartbeat); {} the "
            "built-in checks; see docs/validation.md"
        )
    },
    **kw,
)


class CheckResultSchema(Schema):
    """One check's result, for the node or one GPU, as the agent reports it."""

    name = Text(required=True, min_length=1, max_length=64)
    gpu = Int(
        maximum=1023,
        load_default=None,
        allow_none=True,
        metadata={"description": "the GPU's index; null: the node as a whole"},
    )
    uuid = Text(max_length=128, load_default=None, allow_none=True)
    serial = Text(max_length=64, load_default=None, allow_none=True)
    status = fields.String(
        required=True,
        validate=validate.OneOf(RESULT_STATUSES),
        metadata={
            "description": (
                "passed, failed, not_supported (the driver answers NotSupported: reported, not "
                "failed) or skipped (not applicable here)"
            )
        },
    )
    detail = Text(max_length=2000, load_default="")
    output = Text(
        max_length=65536,
        load_default=None,
        allow_none=True,
        metadata={"description": "the end of a command's output (dcgmi, the fleet's command)"},
    )


class SystemSchema(Schema):
    driver_version = Text(max_length=64, load_default=None, allow_none=True)
    cuda_version = Text(max_length=16, load_default=None, allow_none=True)


class ValidationReportSchema(Schema):
    """The agent's results of one validation."""

    checks = fields.List(
        fields.Nested(CheckResultSchema), required=True, validate=validate.Length(min=1, max=4096)
    )
    system = fields.Nested(SystemSchema, load_default=dict)

    @post_load
    def _typed(self, data, **_kwargs):
        """The checked body as the wire's ValidationReport (fleetwire.tasks)."""
        try:
            return ValidationReport.from_wire(data)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc


class CheckSchema(Schema):
    name = fields.String()
    gpu = fields.Integer(allow_none=True)
    uuid = fields.String()
    serial = fields.String()
    status = fields.String()
    passed = fields.Boolean()
    detail = fields.String()
    output = fields.String()


class ValidationSchema(Schema):
    id = fields.String()
    node_id = fields.String()
    state = fields.String(metadata={"enum": list(STATES)})
    reason = fields.String(
        metadata={"description": "why it ran: a new node, a repair, an operator's request"}
    )
    started_at = Time()
    finished_at = Time(allow_none=True)
    deadline = Time(metadata={"description": "no result by then: failed"})
    returns_to = fields.String(
        attribute="then_status",
        metadata={"description": "the status the node goes to once it passes"},
    )
    checks = fields.Function(lambda v: CheckSchema(many=True).dump(v.checks or []))
    system = fields.Dict(
        allow_none=True, metadata={"description": "driver and CUDA versions the agent read"}
    )
    suite = fields.Dict(metadata={"description": "what the agent was asked to run"})
    actor = fields.String()


class GpuRmaSchema(Schema):
    reason = Text(required=True, min_length=1, max_length=500)
    deadline_seconds = Int(
        minimum=0,
        maximum=30 * 86400,
        load_default=3600,
        metadata={"description": "the drain deadline of its node"},
    )


class HistoryQuerySchema(Schema):
    limit = Int(
        minimum=1,
        maximum=1000,
        load_default=200,
        strict=False,
        metadata={"description": "the most recent events of its history (oldest first)"},
    )


class GpuRecordSchema(Schema):
    serial = fields.String()
    uuid = fields.String()
    model = fields.String()
    board_part_number = fields.String(allow_none=True)
    vbios = fields.String(allow_none=True)
    node_id = fields.String(
        allow_none=True, metadata={"description": "the node it is in now; null: none"}
    )
    hostname = fields.String(allow_none=True)
    index = fields.Integer(allow_none=True)
    healthy = fields.Boolean(allow_none=True)
    health_reason = fields.String(allow_none=True)
    first_seen_at = Time()
    last_seen_at = Time()
    ecc_uncorrected = fields.Integer(allow_none=True)
    xids = fields.List(fields.Integer())
    rma = fields.Dict(
        allow_none=True,
        metadata={"description": "{reason, at, actor, node_id} once marked for RMA"},
    )
    flagged = fields.String(
        metadata={
            "description": "why it is flagged (a board marked for RMA that came back); '' when not"
        }
    )
    mig_blocked = fields.String(
        allow_none=True,
        metadata={
            "description": (
                "why a dynamic MIG repartition failed on it: it takes no work until cleared "
                "(DELETE /gpus/{serial}/mig-block); '' when not blocked, null when in no node"
            )
        },
    )
    history = fields.List(fields.Nested(EventSchema))


class GpuListItemSchema(GpuRecordSchema):
    class Meta:
        exclude = ("history", "healthy", "health_reason")


GpuPageSchema = page_schema(GpuListItemSchema, "GpuPage")


class GpuQuerySchema(PageQuerySchema):
    state = fields.String(
        validate=validate.OneOf(GPU_STATES),
        load_default="all",
        metadata={
            "description": (
                "rma: marked for RMA; flagged: marked and seen again; ok: neither; mig_blocked: a "
                "dynamic MIG repartition failed on it"
            )
        },
    )
    model = Text(max_length=128, load_default=None)
