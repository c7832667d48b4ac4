"""Schemas of fleets and join tokens."""

import re
import zoneinfo

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from fleetd import windows
from fleetd.models import (
    DEFAULT_OUTPUT_CAP_BYTES,
    DEFAULT_OUTPUT_RETENTION_DAYS,
    DEFAULT_TASK_MEMORY_BYTES,
    DEFAULT_TASK_PATH,
    DEFAULT_TASK_PIDS_MAX,
    MAX_TASK_MEMORY_BYTES,
    MIN_TASK_MEMORY_BYTES,
)
from fleetd.scheduler.network_file import TopologyFileError, parse_topology
from fleetd.schemas.common import Bool, FullRegexp, Int, Labels, Text, Time, page_schema
from fleetd.schemas.jobs import OutputCapBytes
from fleetd.schemas.validation import ValidationSetting, ValidationSettingSchema
from fleetd.services.placement.mig import (
    DEFAULT_SETTLE_SECONDS,
    MAX_LAYOUT_MODELS,
    MAX_SETTLE_SECONDS,
    MIG_MODES,
    MIN_SETTLE_SECONDS,
    mig_setting,
    mig_setting_error,
)
from fleetwire.assignment import MAX_TASK_PATH, MAX_TASK_PIDS, MIN_TASK_PIDS, TASK_PATH_RE
from fleetwire.mig import PROFILE_NAME

TIME_ZONES = sorted(zoneinfo.available_timezones() | {"UTC"})


def _enum_name(zone):
    """A constant's name for a zone in generated clients: 'Etc/GMT+0' -> 'ETC_GMT_PLUS_0' (a
    generator's own names upper-case the value, and 'GMT0', 'GMT+0' and 'GMT-0' all become GMT0)."""
    return (
        re.sub(r"[^A-Za-z0-9]+", "_", zone.replace("+", "_PLUS_").replace("-", "_MINUS_"))
        .strip("_")
        .upper()
    )


TIME_ZONE_NAMES = [_enum_name(zone) for zone in TIME_ZONES]

FLEET_NAME = FullRegexp(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
    error="lowercase letters, digits and '-', at most 63, like a DNS label",
)


class WindowSchema(Schema):
    start = fields.String(required=True, validate=FullRegexp(windows.HHMM, error="HH:MM (24 h)"))
    end = fields.String(required=True, validate=FullRegexp(windows.HHMM, error="HH:MM (24 h)"))
    days = fields.List(
        fields.String(validate=validate.OneOf(windows.DAYS)),
        validate=validate.Length(min=1, max=7),
        metadata={"description": "days on which the window starts (default: every day)"},
    )


class AvailabilitySchema(Schema):
    timezone = fields.String(
        allow_none=True,
        validate=validate.OneOf(TIME_ZONES, error="an IANA time zone"),
        metadata={
            "description": "an IANA time zone (default UTC)",
            "x-enum-varnames": TIME_ZONE_NAMES,
        },
    )
    windows = fields.List(
        fields.Nested(WindowSchema), required=True, validate=validate.Length(min=1, max=64)
    )


Availability = lambda **kw: fields.Nested(  # noqa: E731 - one definition for create and update
    AvailabilitySchema,
    allow_none=True,
    metadata={"description": "null: always open; else when the fleet's GPUs may take work"},
    **kw,
)


class HealthPolicySchema(Schema):
    cordon_on_gpu_fault = Bool(
        metadata={
            "description": "cordon a node whose GPU turns unhealthy or disappears (default true)"
        }
    )
    drain_after_seconds = Int(
        minimum=0,
        maximum=7 * 86400,
        allow_none=True,
        metadata={
            "description": "then drain it: its tasks may run this long (default 600); "
            "null: stay cordoned"
        },
    )
    uncordon_when_healthy = Bool(
        metadata={
            "description": "return the node to ready when the fault clears, if the "
            "policy took it out (default true)"
        }
    )


HealthPolicy = lambda **kw: fields.Nested(  # noqa: E731 - one definition for create and update
    HealthPolicySchema,
    allow_none=True,
    metadata={"description": "the node health policy; fields left out (or null) keep the defaults"},
    **kw,
)


AllowRootTasks = lambda **kw: Bool(  # noqa: E731 - one definition for create and update
    metadata={
        "description": (
            "work an admin token submitted may run as root on the fleet's nodes (default false)"
        )
    },
    **kw,
)
RequireIsolation = lambda **kw: Bool(  # noqa: E731
    metadata={
        "description": (
            "the fleet's nodes take work only when their agent can run tasks as other users "
            "(capabilities.isolation uid; default false)"
        )
    },
    **kw,
)
AllowedImages = lambda **kw: fields.List(  # noqa: E731
    Text(min_length=1, max_length=255),
    validate=validate.Length(max=64),
    metadata={
        "description": "glob patterns (fnmatch) an instance's image must match to run here "
        '(default ["*"]: any image)'
    },
    **kw,
)

OutputRetentionDays = lambda **kw: Int(  # noqa: E731
    minimum=1,
    maximum=3650,
    metadata={
        "description": (
            "days a job's output is kept after the job ended (default "
            f"{DEFAULT_OUTPUT_RETENTION_DAYS}); the retention collection removes it then"
        )
    },
    **kw,
)
TaskPidsMax = lambda **kw: Int(  # noqa: E731
    minimum=MIN_TASK_PIDS,
    maximum=MAX_TASK_PIDS,
    metadata={
        "description": (
            "the most processes and threads a task may hold on the fleet's nodes, and what one "
            f"gets whose spec sets no resources.pids (default {DEFAULT_TASK_PIDS_MAX})"
        )
    },
    **kw,
)
TaskMemoryDefault = lambda **kw: Int(  # noqa: E731
    minimum=MIN_TASK_MEMORY_BYTES,
    maximum=MAX_TASK_MEMORY_BYTES,
    metadata={
        "description": (
            "the host memory bound of a task whose spec sets no resources.memory_bytes (default "
            f"{DEFAULT_TASK_MEMORY_BYTES}: 32 GiB); nothing is reserved for it at placement"
        )
    },
    **kw,
)
TaskPath = lambda **kw: Text(  # noqa: E731
    min_length=1,
    max_length=MAX_TASK_PATH,
    validate=[
        FullRegexp(TASK_PATH_RE, error="absolute directories separated by ':', no empty entry")
    ],
    metadata={
        "description": (
            f"the PATH a task starts with, never the agent's own (default {DEFAULT_TASK_PATH}); a "
            "spec's env may set its own"
        )
    },
    **kw,
)


MAX_NETWORK_TOPOLOGY = 4 * 1024 * 1024  # characters: a host per line at 100,000 hosts fits


def _readable_topology(text):
    """A topology file the parser reads, else the line that is wrong (400)."""
    if text is None:
        return
    try:
        parse_topology(text)
    except TopologyFileError as exc:
        raise ValidationError(f"topology file {exc}") from None


NetworkTopology = lambda **kw: fields.String(  # noqa: E731 - one definition for create and update
    allow_none=True,
    validate=[validate.Length(max=MAX_NETWORK_TOPOLOGY), _readable_topology],
    metadata={
        "description": (
            "where the fleet's nodes sit in the network: a topology file in Slurm's tree form "
            "(SwitchName=... Switches=... / Nodes=...) or block form (BlockName=... Nodes=...), "
            "hostnames with bracket ranges (gpu[001-016]); a node's topology.fleetd/block, leaf "
            "or spine labels win over it; null: labels alone (docs/api.md, Network blocks)"
        )
    },
    **kw,
)


TASK_IDENTITIES = ("dynamic", "nss", "claims")


def TaskIdentity(**kw):
    return fields.String(
        validate=validate.OneOf(TASK_IDENTITIES),
        metadata={
            "description": (
                "whom tasks run as: dynamic (a uid fleetd allocates per user), nss (the user's "
                "own account as each node resolves its login, with its groups; a node where it "
                "does not resolve gets none of the user's work), claims (the uid, gid and groups "
                "of the identity provider's claims)"
            )
        },
        **kw,
    )


class FleetMigSchema(Schema):
    """A fleet's MIG setting (`mig`); what a document cannot say (a layout's profiles are the
    model's, fit on one GPU together, and go with mode fixed) is checked after
    (services/placement/mig.py)."""

    mode = fields.String(
        required=True,
        validate=validate.OneOf(MIG_MODES, error="mig.mode must be off, fixed or dynamic"),
        metadata={
            "description": (
                "off: its GPUs in MIG mode take no work; fixed: MIG work runs on the MIG devices "
                "they have; dynamic: as fixed, and fleetd repartitions a GPU whose slices are all "
                "idle to the profiles the queue needs (MIG mode itself is never switched)"
            )
        },
    )
    settle_seconds = Int(
        minimum=MIN_SETTLE_SECONDS,
        maximum=MAX_SETTLE_SECONDS,
        metadata={
            "description": (
                "dynamic only: a GPU is not repartitioned again within this many seconds of its "
                f"last change (default {DEFAULT_SETTLE_SECONDS})"
            )
        },
    )
    layout = fields.Dict(
        keys=fields.String(),
        values=fields.List(
            fields.String(validate=FullRegexp(PROFILE_NAME.pattern, error="a MIG profile name")),
            validate=validate.Length(min=1, max=7, error="a GPU holds 1 to 7 MIG devices"),
        ),
        metadata={
            "description": (
                f"per GPU model as nodes report it (1 to {MAX_LAYOUT_MODELS} models), the "
                "profiles each of its GPUs must have: the validation gate fails a node whose MIG "
                "GPUs of a listed model have other devices"
            )
        },
    )

    @validates_schema
    def _whole(self, data, **_kwargs):
        error = mig_setting_error(data)
        if error is not None:
            raise ValidationError(error)


def FleetMig(**kw):
    """A fleet's MIG setting (`mig`), for create and update alike; null: fixed without a layout."""
    return fields.Nested(FleetMigSchema, allow_none=True, **kw)


class FleetCreateSchema(Schema):
    name = fields.String(required=True, validate=FLEET_NAME)
    description = Text(max_length=2000, load_default="")
    labels = Labels(load_default=dict)
    availability = Availability(load_default=None)
    health_policy = HealthPolicy(load_default=None)
    allow_root_tasks = AllowRootTasks(load_default=False)
    require_isolation = RequireIsolation(load_default=False)
    allowed_images = AllowedImages(load_default=lambda: ["*"])
    validation = ValidationSetting(load_default=None)
    task_pids_max = TaskPidsMax(load_default=DEFAULT_TASK_PIDS_MAX)
    task_memory_default_bytes = TaskMemoryDefault(load_default=DEFAULT_TASK_MEMORY_BYTES)
    task_path = TaskPath(load_default=DEFAULT_TASK_PATH)
    task_identity = TaskIdentity(load_default="dynamic")
    output_cap_bytes = OutputCapBytes(load_default=DEFAULT_OUTPUT_CAP_BYTES)
    output_retention_days = OutputRetentionDays(load_default=DEFAULT_OUTPUT_RETENTION_DAYS)
    network_topology = NetworkTopology(load_default=None)
    mig = FleetMig(load_default=None)


class FleetUpdateSchema(Schema):
    description = Text(max_length=2000)
    labels = Labels()
    availability = Availability()
    health_policy = HealthPolicy()
    allow_root_tasks = AllowRootTasks()
    require_isolation = RequireIsolation()
    allowed_images = AllowedImages()
    validation = ValidationSetting()
    task_pids_max = TaskPidsMax()
    task_memory_default_bytes = TaskMemoryDefault()
    task_path = TaskPath()
    task_identity = TaskIdentity()
    output_cap_bytes = OutputCapBytes()
    output_retention_days = OutputRetentionDays()
    network_topology = NetworkTopology()
    mig = FleetMig()


class FleetSchema(Schema):
    name = fields.String()
    description = fields.String()
    labels = fields.Dict()
    node_count = fields.Integer()
    gpu_count = fields.Integer()
    created_at = Time()
    availability = fields.Nested(AvailabilitySchema, allow_none=True)
    health_policy = fields.Function(
        lambda f: f.effective_health_policy,
        metadata={"description": "the node health policy in force (defaults filled in)"},
    )
    allow_root_tasks = fields.Boolean()
    require_isolation = fields.Boolean()
    allowed_images = fields.List(fields.String())
    validation = fields.Nested(
        ValidationSettingSchema,
        allow_none=True,
        metadata={"description": "the validation gate: null, none; {} the built-in checks"},
    )
    task_pids_max = fields.Integer()
    task_memory_default_bytes = fields.Integer()
    task_path = fields.String()
    task_identity = fields.String()
    output_cap_bytes = fields.Integer()
    output_retention_days = fields.Integer()
    network_topology = fields.String(allow_none=True)
    mig = fields.Function(
        mig_setting, metadata={"description": "the MIG setting in force: {mode, layout?}"}
    )


FleetPageSchema = page_schema(FleetSchema, "FleetPage")


class JoinTokenCreateSchema(Schema):
    ttl_seconds = Int(minimum=60, maximum=365 * 86400, load_default=86400)
    max_uses = Int(minimum=1, maximum=1_000_000, load_default=None, allow_none=True)
    description = Text(max_length=500, load_default="")


class JoinTokenSchema(Schema):
    id = fields.String()
    fleet = fields.String(attribute="fleet_id")
    description = fields.String()
    created_at = Time()
    expires_at = Time()
    max_uses = fields.Integer(allow_none=True)
    uses = fields.Integer()
    revoked = fields.Boolean()
    created_by = fields.String(
        metadata={
            "description": (
                "who made it, as events name actors, with how it authenticated: token:ansible, "
                "user:alice (session), user:alice (token:laptop); the registrations it admits "
                "name it"
            )
        }
    )


class JoinTokenCreatedSchema(JoinTokenSchema):
    token = fields.String(metadata={"description": "The secret; shown only in this response."})
    join_command = fields.String()


JoinTokenPageSchema = page_schema(JoinTokenSchema, "JoinTokenPage")
