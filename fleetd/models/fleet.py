"""The fleet: fleets, join tokens, nodes and their GPUs, validation and GPU history, the inventory's
versions, rollouts and retired nodes."""

import enum

import peewee

from fleetd.models.base import BaseModel, JSONText
from fleetwire.output import DEFAULT_OUTPUT_CAP_BYTES  # per task, re-exported for fleets


class NodeStatus(str, enum.Enum):
    """Node states (docs/architecture.md, Node states and Job states)."""

    PENDING = "pending"
    # its agent runs the fleet's validation suite; it takes no work until it passes
    VALIDATING = "validating"
    FAILED_VALIDATION = "failed_validation"  # the suite failed (the reason names the check and GPU)
    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DRAINED = "drained"
    LOST = "lost"
    REVOKED = "revoked"

    def allows(self, action):
        """Whether an operator's `action` (cordon, uncordon, drain, undrain) applies to a node in
        this status."""
        return self.value in NODE_ACTIONS[action][0].split()

    def is_schedulable(self):
        return self is NodeStatus.READY


# An operator's actions on a node: (the statuses it applies to, the status it leads to). Each such
# move is one of the node state machine's transitions
# (fleetd.services.workloads.lifecycle.NODE_TRANSITIONS).
NODE_ACTIONS = {
    "cordon": ("ready", "cordoned"),
    "uncordon": ("cordoned", "ready"),
    "drain": ("ready cordoned failed_validation", "draining"),
    "undrain": ("draining drained", "ready"),
}


# A fleet's task defaults (docs/api.md, Fleets): a fork bomb stops at 4096 processes and threads; a
# task that sets no memory_bytes is bounded at 32 GiB, under any GPU host's memory, so that its
# runaway meets its own OOM kill and not the host's; a PATH of the system's directories only.
DEFAULT_TASK_PIDS_MAX = 4096
DEFAULT_OUTPUT_RETENTION_DAYS = 30
DEFAULT_TASK_MEMORY_BYTES = 32 * 1024**3
MIN_TASK_MEMORY_BYTES = (
    64 * 1024**2
)  # a default under this starves the task's own shell and interpreter
MAX_TASK_MEMORY_BYTES = 1 << 50  # 1 PiB: as good as no bound, but still one that cgroups take
DEFAULT_TASK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Fleet(BaseModel):
    """A named group of nodes that share join tokens and defaults."""

    name = peewee.CharField(primary_key=True, max_length=63)
    description = peewee.TextField(default="")
    labels = JSONText(default=dict)
    created_at = peewee.DateTimeField()
    availability = JSONText(null=True)  # see fleetd.windows; None: always open
    health_policy = JSONText(
        null=True
    )  # see fleetd.services.nodes.health_policy; None: the defaults (on)
    allow_root_tasks = peewee.BooleanField(
        default=False
    )  # admins' work may run as root on its nodes
    require_isolation = peewee.BooleanField(
        default=False
    )  # nodes take work only with isolation "uid"
    allowed_images = JSONText(default=lambda: ["*"])  # glob patterns an instance's image must match
    # What a new or repaired node must pass before it takes work (fleetd.services.nodes.validation):
    # None, no gate; {} the built-in checks (migration 0023)
    validation = JSONText(null=True)
    # What each task on the fleet's nodes gets unless its spec says otherwise (migration 0028): the
    # most processes and threads it may hold (a spec's `pids` may ask for fewer), its host memory
    # bound when it sets no `memory_bytes`, and the PATH it starts with (never the agent's own)
    task_pids_max = peewee.IntegerField(default=DEFAULT_TASK_PIDS_MAX)
    task_memory_default_bytes = peewee.BigIntegerField(default=DEFAULT_TASK_MEMORY_BYTES)
    task_path = peewee.TextField(default=DEFAULT_TASK_PATH)
    # Whom its tasks run as (migration 0034): "dynamic", a uid fleetd allocates per owner; "nss",
    # the owner's own account as each node's user database (NSS) resolves its login; "claims", the
    # uid, gid and groups the identity provider's claims give the owner.
    task_identity = peewee.CharField(max_length=8, default="dynamic")
    # Output (migration 0041): the most output a task keeps unless its job says otherwise, and how
    # long a job's output outlives its end
    output_cap_bytes = peewee.BigIntegerField(default=DEFAULT_OUTPUT_CAP_BYTES)
    output_retention_days = peewee.IntegerField(default=DEFAULT_OUTPUT_RETENTION_DAYS)
    # Where its nodes sit in the network (migration 0045): a topology file in Slurm's tree or block
    # form (fleetd.scheduler.network_file), as given; None: labels alone place its nodes
    network_topology = peewee.TextField(null=True)
    # MIG (migration 0046): {mode: off | fixed | dynamic, layout?: {gpu model: [profile...]}};
    # None: fixed without a layout, each GPU's slices as found (services/placement/mig.py)
    mig = JSONText(null=True)

    @property
    def effective_health_policy(self):
        return effective_health_policy(self.health_policy)


# A fleet's node health policy where it says nothing (fleetd.services.nodes.health_policy acts on
# it).
DEFAULT_HEALTH_POLICY = {
    "cordon_on_gpu_fault": True,
    "drain_after_seconds": 600,
    "uncordon_when_healthy": True,
}


def effective_health_policy(stored):
    """A fleet's stored health policy with the defaults filled in (None: all defaults, which is
    on)."""
    return dict(DEFAULT_HEALTH_POLICY, **(stored or {}))


class JoinToken(BaseModel):
    """A join token (flj_<id>.<secret>) that admits hosts into one fleet."""

    id = peewee.CharField(primary_key=True, max_length=32)
    fleet = peewee.ForeignKeyField(
        Fleet, backref="join_tokens", on_delete="CASCADE", column_name="fleet"
    )
    token_hash = peewee.CharField(max_length=64)
    description = peewee.TextField(default="")
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField(index=True)
    max_uses = peewee.IntegerField(null=True)
    uses = peewee.IntegerField(default=0)
    revoked = peewee.BooleanField(default=False)
    created_by = peewee.CharField(max_length=200, default="")


class Node(BaseModel):
    """An enrolled host. Its session token is fln_<session_id>.<secret>."""

    id = peewee.CharField(primary_key=True, max_length=32)
    fleet = peewee.ForeignKeyField(
        Fleet, backref="nodes", on_delete="RESTRICT", column_name="fleet"
    )
    fleet_id: (
        str  # the column's value, as peewee's accessor gives it (its stubs declare only the fields)
    )
    machine_id = peewee.CharField(max_length=128, unique=True)
    hostname = peewee.CharField(max_length=255)
    address = peewee.CharField(max_length=255, default="")
    labels = JSONText(
        default=dict
    )  # what placement reads: agent_labels, label_overrides on top (services.nodes.labels)
    agent_labels = JSONText(null=True)  # from the agent's config file, as it last reported them
    label_overrides = JSONText(
        null=True
    )  # set through the API (PATCH /nodes/{id}); they win per key
    agent_version = peewee.CharField(max_length=64, default="")
    bundle_sha256 = peewee.CharField(
        max_length=64, default=""
    )  # the offline bundle the agent came from
    gpu_status = peewee.CharField(
        max_length=16, null=True
    )  # ok, cpu_only or driver_error (services.nodes.inventory.GPU_STATUSES)
    gpu_status_reason = peewee.TextField(default="")
    status = peewee.CharField(max_length=16, index=True)
    status_reason = peewee.TextField(default="")
    status_before_lost = peewee.CharField(max_length=16, null=True)
    registered_at = peewee.DateTimeField()
    last_heartbeat_at = peewee.DateTimeField(null=True)
    drain_reason = peewee.TextField(null=True)
    drain_deadline = peewee.DateTimeField(null=True)
    drain_started_at = peewee.DateTimeField(null=True)
    cpu_count = peewee.IntegerField(default=0)
    memory_bytes = peewee.BigIntegerField(default=0)
    container_runtime = peewee.CharField(
        max_length=16, null=True
    )  # podman or docker, as the agent reports
    # What else the agent reported it can do: {isolation, isolation_reason?, containers, host_uids}
    # (fleetd.services.capabilities); None: nothing reported (an older agent)
    capabilities = JSONText(null=True)
    session_id = peewee.CharField(max_length=32, null=True, unique=True)
    session_hash = peewee.CharField(max_length=64, null=True)
    join_token_id = peewee.CharField(max_length=32, null=True)
    # Set while the health policy holds the node out of service for a GPU fault: {reason, since,
    # missing, cleared?}
    health_hold = JSONText(null=True)
    # While an agent upgrade is under way or failed, the state it returns to
    # (fleetd.services.nodes.upgrades)
    upgrade = JSONText(null=True)
    drain_repair = peewee.BooleanField(
        default=False
    )  # drained for repair: undrain validates it first (0023)
    # The operator's cordon, {reason, at, actor}, from `cordon` until the node is in service again:
    # it outlives the reasons fleetd gives the node meanwhile (an upgrade, a validation) (0038)
    cordon = JSONText(null=True)
    # Its GPUs' topology as its agent reported it at registration, {gpus, links, nvlink_count,
    # nics} (fleetwire.topology); None: none reported (an older agent, or one that could not) (0043)
    topology = JSONText(null=True)

    @property
    def isolation(self):
        """ "uid" when its agent runs tasks as other users, else "none" (also when it never
        said)."""
        return (self.capabilities or {}).get("isolation") or "none"

    @property
    def containers(self):
        """ "ready" or "unavailable: <reason>" as its agent said; an agent that never said is ready
        when it reported a container runtime."""
        said = (self.capabilities or {}).get("containers")
        if said:
            return said
        return (
            "ready"
            if self.container_runtime
            else "unavailable: no container runtime (podman or docker)"
        )

    @property
    def drain(self):
        """The node's drain as the API shows it ({reason, deadline, started_at}), or None."""
        if self.drain_started_at is None:
            return None
        return {
            "reason": self.drain_reason,
            "deadline": self.drain_deadline,
            "started_at": self.drain_started_at,
            "repair": bool(self.drain_repair),
        }


class Gpu(BaseModel):
    """One GPU of a node, as its agent last reported it."""

    id = (
        peewee.AutoField()
    )  # what peewee adds without a primary key; declared, so that its stubs know it
    node = peewee.ForeignKeyField(Node, backref="gpus", on_delete="CASCADE", column_name="node")
    uuid = peewee.CharField(max_length=128)
    index = peewee.IntegerField()  # type: ignore[assignment]  # the GPU's index; shadows Model.index (unused)
    vendor = peewee.CharField(max_length=32, default="nvidia")
    model = peewee.CharField(max_length=128)
    memory_total_bytes = peewee.BigIntegerField()
    numa_node = peewee.IntegerField(null=True)
    max_tflops = peewee.FloatField(null=True)
    healthy = peewee.BooleanField(default=True)
    health_reason = peewee.TextField(default="")
    mig_mode = peewee.CharField(max_length=16, null=True)
    serial = peewee.CharField(
        max_length=64, null=True, index=True
    )  # the board's serial number (0024)
    board_part_number = peewee.CharField(max_length=64, null=True)
    vbios = peewee.CharField(max_length=64, null=True)
    # With MIG enabled, its MIG devices as reported: [{uuid, memory_total_bytes, profile, start,
    # size}] (fleetwire.mig.MigDevice); None without (migration 0046)
    mig_devices = JSONText(null=True)
    # Dynamic MIG (migration 0047): the layout asked of its agent and not seen yet ({plan,
    # instances}), when fleetd last planned a change, and why its last repartition failed ('' when
    # it did not; a blocked GPU takes no work until an operator clears it). Kept across the row's
    # replacement by a new inventory (services.nodes.inventory).
    mig_target = JSONText(null=True)
    mig_changed_at = peewee.DateTimeField(null=True)
    mig_blocked = peewee.TextField(default="")

    class Meta:
        indexes = ((("node", "uuid"), True),)


class Validation(BaseModel):
    """One run of a node's validation suite (fleetd.services.nodes.validation): what it checks, and
    per check and GPU whether it passed (migration 0023)."""

    id = peewee.CharField(primary_key=True, max_length=32)
    node_id = peewee.CharField(max_length=32)
    state = peewee.CharField(max_length=16)  # running, passed, failed
    reason = peewee.TextField(
        default=""
    )  # why it runs: a new node, a repair, an operator's request
    suite = JSONText()  # what the agent is asked to run (the fleet's setting, resolved)
    then_status = peewee.CharField(
        max_length=16, default="ready"
    )  # where the node goes once it passes
    started_at = peewee.DateTimeField()
    deadline = peewee.DateTimeField()  # no result by then: failed
    finished_at = peewee.DateTimeField(null=True)
    checks = JSONText(null=True)  # [{name, gpu?, status, passed, detail, output?}]
    system = JSONText(null=True)  # {driver_version, cuda_version} as the agent read them
    actor = peewee.CharField(max_length=200, default="fleetd")

    class Meta:
        indexes = ((("node_id", "id"), False),)


class GpuRecord(BaseModel):
    """A GPU board by serial number, wherever it sits: its identity, where it was last seen, its RMA
    mark; its history is Events of subject gpu/<serial> (migration 0024)."""

    serial = peewee.CharField(primary_key=True, max_length=64)
    uuid = peewee.CharField(max_length=128)
    model = peewee.CharField(max_length=128, default="")
    board_part_number = peewee.CharField(max_length=64, null=True)
    vbios = peewee.CharField(max_length=64, null=True)
    node_id = peewee.CharField(
        max_length=32, null=True, index=True
    )  # None: not in any node's inventory now
    index = peewee.IntegerField(null=True)  # type: ignore[assignment]  # as Gpu.index
    first_seen_at = peewee.DateTimeField()
    last_seen_at = peewee.DateTimeField()
    xids = JSONText(
        default=list
    )  # critical XIDs its node's agent reported since that agent started
    ecc_uncorrected = peewee.BigIntegerField(
        null=True
    )  # volatile uncorrectable ECC errors, as last reported
    rma = JSONText(null=True)  # {reason, at, actor, node_id} once marked for RMA
    flagged = peewee.TextField(
        default=""
    )  # why it is flagged (an RMA-marked board that came back), else ""
    # Not columns: what services.gpus.get_gpu adds for the API's answer.
    hostname: str | None
    healthy: bool | None
    health_reason: str | None
    mig_blocked: str | None
    history: list


class InventoryVersion(BaseModel):
    """One row: bumped by database triggers (migration 0006) whenever what placement reads of
    nodes, GPUs or fleets changes, by any writer (another replica too)."""

    id = peewee.IntegerField(primary_key=True)
    version = peewee.BigIntegerField(default=0)


class InventoryChange(BaseModel):
    """A node whose row or GPUs changed, with the inventory version of its last change (kept by
    the same triggers, migration 0013): a reload reads only the nodes changed since its version."""

    node_id = peewee.CharField(primary_key=True, max_length=32)
    version = peewee.BigIntegerField(index=True)


class Rollout(BaseModel):
    """An agent rollout over a fleet (`fleetd rollout start`): the CLI that drives it over SSH
    records each node's progress here, and any CLI reads it, pauses, resumes or aborts it
    (services.fleet_ops.rollouts)."""

    id = peewee.CharField(primary_key=True, max_length=32)
    fleet = peewee.CharField(max_length=64, index=True)
    bundle_version = peewee.CharField(max_length=64)
    bundle_sha256 = peewee.CharField(max_length=64)
    state = peewee.CharField(max_length=16, index=True)  # running, paused, done, aborted
    state_reason = peewee.TextField(default="")
    options = JSONText(default=dict)  # batch, canary, max_failures, window, drain_deadline_seconds
    created_at = peewee.DateTimeField()
    created_by = peewee.CharField(max_length=200, default="")
    updated_at = peewee.DateTimeField()


class RolloutNode(BaseModel):
    """One node of a rollout, in the order the driver takes them: its batch (0 holds the canaries)
    and how far it got."""

    id = peewee.AutoField()
    rollout = peewee.ForeignKeyField(
        Rollout, backref="nodes", on_delete="CASCADE", column_name="rollout"
    )
    rollout_id: str  # the column's value, as peewee's accessor gives it
    node_id = peewee.CharField(max_length=32)
    hostname = peewee.CharField(max_length=255, default="")
    address = peewee.CharField(max_length=255, default="")
    position = peewee.IntegerField()
    batch = peewee.IntegerField()
    canary = peewee.BooleanField(default=False)
    state = peewee.CharField(max_length=16)  # pending, upgrading, done, failed, skipped
    detail = peewee.TextField(default="")
    updated_at = peewee.DateTimeField(null=True)

    class Meta:
        indexes = ((("rollout", "node_id"), True), (("rollout", "position"), False))


class RetiredNode(BaseModel):
    """The node a host had before its node was deleted, by the host's machine id: the same host
    enrolling again gets that id back (services.nodes.hosts)."""

    machine_id = peewee.CharField(primary_key=True, max_length=128)
    node_id = peewee.CharField(max_length=32)
    fleet = peewee.CharField(max_length=64)
    retired_at = peewee.DateTimeField()
