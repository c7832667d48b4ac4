"""Peewee models and status enums. Times are naive UTC; ids are opaque strings."""

import enum
import json
import os
import time

import peewee

from fleetd import sql
from fleetd.db import database
from fleetd.specs import InstanceSpec, JobSpec


def new_id():
    """A 20-hex-character id that sorts by creation time (ms) and is unguessable enough."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(4).hex()}"


class JSONText(peewee.TextField):
    """JSON stored as text, so SQLite and PostgreSQL behave the same."""

    def db_value(self, value):
        return None if value is None else json.dumps(value, sort_keys=True)

    def python_value(self, value):
        return None if value is None else json.loads(value)


class Role(str, enum.Enum):
    """Roles of API tokens (docs/api.md, Roles)."""

    ADMIN = "admin"
    SUBMITTER = "submitter"
    METRICS = "metrics"


class NodeStatus(str, enum.Enum):
    """Node states (docs/architecture.md, Node states and Job states)."""

    PENDING = "pending"
    VALIDATING = "validating"  # its agent runs the fleet's validation suite; it takes no work until it passes
    FAILED_VALIDATION = "failed_validation"  # the suite failed (the reason names the check and GPU)
    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DRAINED = "drained"
    LOST = "lost"
    REVOKED = "revoked"

    def allows(self, action):
        """Whether an operator's `action` (cordon, uncordon, drain, undrain) applies to a node in this status."""
        return self.value in NODE_ACTIONS[action][0].split()

    def is_schedulable(self):
        return self is NodeStatus.READY


# An operator's actions on a node: (the statuses it applies to, the status it leads to). Each such
# move is one of the node state machine's transitions (fleetd.services.workloads.lifecycle.NODE_TRANSITIONS).
NODE_ACTIONS = {
    "cordon": ("ready", "cordoned"),
    "uncordon": ("cordoned", "ready"),
    "drain": ("ready cordoned failed_validation", "draining"),
    "undrain": ("draining drained", "ready"),
}


def transition_table(states, table):
    """{state: frozenset of the states it may go to} from {"state": "to to ..."}, which names every state."""
    out = {states(state): frozenset(states(to) for to in targets.split()) for state, targets in table.items()}
    missing = set(states) - set(out)
    if missing:
        raise ValueError(f"transition table lacks {sorted(s.value for s in missing)}")
    return out


class JobState(str, enum.Enum):
    """Job states (docs/architecture.md, Node states and Job states)."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"  # cancelled; its processes have not all stopped yet
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def is_terminal(self):
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class TaskState(str, enum.Enum):
    """Task states: one task per node (rank) of a job."""

    PENDING = "pending"
    ASSIGNED = "assigned"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    PREEMPTED = "preempted"

    def is_active(self):
        return self in (TaskState.ASSIGNED, TaskState.RUNNING)

    def is_terminal(self):
        return self not in (TaskState.PENDING, TaskState.ASSIGNED, TaskState.RUNNING)


class InstanceState(str, enum.Enum):
    """Instance states (docs/architecture.md, Instances)."""

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"  # its process ended; its node starts it again after a back-off
    STOPPING = "stopping"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    DELETING = "deleting"  # its processes are stopping, or its node has yet to remove its volume
    DELETED = "deleted"

    def holds_run(self):
        """True while a run (an internal job) of the instance is queued, placed or running."""
        return self in (InstanceState.PENDING, InstanceState.STARTING, InstanceState.RUNNING,
                        InstanceState.RESTARTING, InstanceState.STOPPING)

    def can_resume(self):
        return self in (InstanceState.STOPPED, InstanceState.INTERRUPTED, InstanceState.FAILED)


class BaseModel(peewee.Model):
    """Saves and reads by primary key run statements compiled once (fleetd.sql), not recompiled
    by peewee on each call; anything else is plain peewee.

    A save writes the fields set since the row was read (all of them for a new row), as
    peewee's only_save_dirty does: an UPDATE that names a column rewrites its index entries even
    when the value is the same, and would also put back what another transaction changed in a
    column this one never touched. A field is set by assigning it; mutating a JSON value in
    place does not count (no code does).
    """

    class Meta:
        database = database
        legacy_table_names = False

    def save(self, force_insert=False, only=None):
        meta = self._meta
        pk_value = self._pk  # type: ignore[attr-defined]  # peewee's own stubs lack Model._pk and _dirty
        if only is None and pk_value is not None and not meta.composite_key and meta.primary_key is not False:
            data = self.__data__
            dirty = self._dirty  # type: ignore[attr-defined]  # the set of fields assigned since the load
            if force_insert:
                sql.insert_row(type(self), data.copy())
                dirty.clear()
                return 1
            field_dict = {name: data[name] for name in dirty if name in data}
            field_dict.pop(meta.primary_key.name, None)
            if not field_dict:
                return 0
            rows = sql.save_by_pk(self, field_dict)
            dirty -= set(field_dict)
            return rows
        return super().save(force_insert=force_insert, only=only)

    @classmethod
    def get_by_id(cls, pk):
        row = cls.get_or_none_by_id(pk)
        if row is None:
            # ModelBase makes each model's DoesNotExist; peewee's stubs do not declare it.
            raise cls.DoesNotExist(f"{cls.__name__} {pk!r} does not exist")  # type: ignore[attr-defined]
        return row

    @classmethod
    def get_or_none_by_id(cls, pk):
        """The row with this primary key, or None."""
        return sql.by_pk(cls).first(pk=pk)


# The limits an admin can set on an API token (`ApiToken.limits`; services.identity.limits checks them).
LIMIT_NAMES = ("max_active_jobs", "max_instances", "max_spec_bytes", "max_stored_spec_bytes", "max_artifact_bytes",
               "requests_per_second")


class ApiToken(BaseModel):
    """An API token (fla_<id>.<secret>); only the SHA-256 of the whole token is kept."""

    id = peewee.CharField(primary_key=True, max_length=32)
    name = peewee.CharField(max_length=200)
    role = peewee.CharField(max_length=20)
    team = peewee.CharField(max_length=200, null=True)
    token_hash = peewee.CharField(max_length=64)
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField(null=True, index=True)
    revoked_at = peewee.DateTimeField(null=True)
    last_used_at = peewee.DateTimeField(null=True)
    unix_user = peewee.CharField(max_length=32, null=True)  # tasks of this token run as this host user
    limits = JSONText(null=True)  # {limit name: value} an admin set; a name not there is the setting's (migration 0018)


class OwnerSpecBytes(BaseModel):
    """The bytes of the specs an owner's jobs, instances and runs of instances store (their `spec`
    column, as stored), kept as the rows come and go (services.identity.limits; migration 0029): so that
    `max_stored_spec_bytes` is checked without summing the owner's rows at every submit."""

    token_id = peewee.CharField(primary_key=True, max_length=32)
    bytes = peewee.BigIntegerField(default=0)

    class Meta:
        table_name = "owner_spec_bytes"


# A fleet's task defaults (docs/api.md, Fleets): a fork bomb stops at 4096 processes and threads; a task
# that sets no memory_bytes is bounded at 32 GiB, under any GPU host's memory, so that its runaway
# meets its own OOM kill and not the host's; a PATH of the system's directories only.
DEFAULT_TASK_PIDS_MAX = 4096
DEFAULT_TASK_MEMORY_BYTES = 32 * 1024 ** 3
MIN_TASK_MEMORY_BYTES = 64 * 1024 ** 2  # a default under this starves the task's own shell and interpreter
MAX_TASK_MEMORY_BYTES = 1 << 50  # 1 PiB: as good as no bound, but still one that cgroups take
DEFAULT_TASK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Fleet(BaseModel):
    """A named group of nodes that share join tokens and defaults."""

    name = peewee.CharField(primary_key=True, max_length=63)
    description = peewee.TextField(default="")
    labels = JSONText(default=dict)
    created_at = peewee.DateTimeField()
    availability = JSONText(null=True)  # see fleetd.windows; None: always open
    health_policy = JSONText(null=True)  # see fleetd.services.nodes.health_policy; None: the defaults (on)
    allow_root_tasks = peewee.BooleanField(default=False)  # admins' work may run as root on its nodes
    require_isolation = peewee.BooleanField(default=False)  # nodes take work only with isolation "uid"
    allowed_images = JSONText(default=lambda: ["*"])  # glob patterns an instance's image must match
    # What a new or repaired node must pass before it takes work (fleetd.services.nodes.validation): None, no
    # gate; {} the built-in checks (migration 0023)
    validation = JSONText(null=True)
    # What each task on the fleet's nodes gets unless its spec says otherwise (migration 0028): the most
    # processes and threads it may hold (a spec's `pids` may ask for fewer), its host memory bound when
    # it sets no `memory_bytes`, and the PATH it starts with (never the agent's own)
    task_pids_max = peewee.IntegerField(default=DEFAULT_TASK_PIDS_MAX)
    task_memory_default_bytes = peewee.BigIntegerField(default=DEFAULT_TASK_MEMORY_BYTES)
    task_path = peewee.TextField(default=DEFAULT_TASK_PATH)

    @property
    def effective_health_policy(self):
        return effective_health_policy(self.health_policy)


# A fleet's node health policy where it says nothing (fleetd.services.nodes.health_policy acts on it).
DEFAULT_HEALTH_POLICY = {"cordon_on_gpu_fault": True, "drain_after_seconds": 600, "uncordon_when_healthy": True}


def effective_health_policy(stored):
    """A fleet's stored health policy with the defaults filled in (None: all defaults, which is on)."""
    return dict(DEFAULT_HEALTH_POLICY, **(stored or {}))


class JoinToken(BaseModel):
    """A join token (flj_<id>.<secret>) that admits hosts into one fleet."""

    id = peewee.CharField(primary_key=True, max_length=32)
    fleet = peewee.ForeignKeyField(Fleet, backref="join_tokens", on_delete="CASCADE", column_name="fleet")
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
    fleet = peewee.ForeignKeyField(Fleet, backref="nodes", on_delete="RESTRICT", column_name="fleet")
    fleet_id: str  # the column's value, as peewee's accessor gives it (its stubs declare only the fields)
    machine_id = peewee.CharField(max_length=128, unique=True)
    hostname = peewee.CharField(max_length=255)
    address = peewee.CharField(max_length=255, default="")
    labels = JSONText(default=dict)  # what placement reads: agent_labels, label_overrides on top (services.nodes.labels)
    agent_labels = JSONText(null=True)  # from the agent's config file, as it last reported them
    label_overrides = JSONText(null=True)  # set through the API (PATCH /nodes/{id}); they win per key
    agent_version = peewee.CharField(max_length=64, default="")
    bundle_sha256 = peewee.CharField(max_length=64, default="")  # the offline bundle the agent came from
    gpu_status = peewee.CharField(max_length=16, null=True)  # ok, cpu_only or driver_error (nodes.GPU_STATUSES)
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
    container_runtime = peewee.CharField(max_length=16, null=True)  # podman or docker, as the agent reports
    # What else the agent reported it can do: {isolation, isolation_reason?, containers, host_uids}
    # (fleetd.services.capabilities); None: nothing reported (an older agent)
    capabilities = JSONText(null=True)
    session_id = peewee.CharField(max_length=32, null=True, unique=True)
    session_hash = peewee.CharField(max_length=64, null=True)
    join_token_id = peewee.CharField(max_length=32, null=True)
    # Set while the health policy holds the node out of service for a GPU fault: {reason, since, missing, cleared?}
    health_hold = JSONText(null=True)
    # While an agent upgrade is under way or failed, the state it returns to (fleetd.services.nodes.upgrades)
    upgrade = JSONText(null=True)
    drain_repair = peewee.BooleanField(default=False)  # drained for repair: undrain validates it first (0023)

    @property
    def isolation(self):
        """"uid" when its agent runs tasks as other users, else "none" (also when it never said)."""
        return (self.capabilities or {}).get("isolation") or "none"

    @property
    def containers(self):
        """"ready" or "unavailable: <reason>" as its agent said; an agent that never said is ready
        when it reported a container runtime."""
        said = (self.capabilities or {}).get("containers")
        if said:
            return said
        return "ready" if self.container_runtime else "unavailable: no container runtime (podman or docker)"

    @property
    def drain(self):
        """The node's drain as the API shows it ({reason, deadline, started_at}), or None."""
        if self.drain_started_at is None:
            return None
        return {"reason": self.drain_reason, "deadline": self.drain_deadline, "started_at": self.drain_started_at,
                "repair": bool(self.drain_repair)}


class Gpu(BaseModel):
    """One GPU of a node, as its agent last reported it."""

    id = peewee.AutoField()  # what peewee adds without a primary key; declared, so that its stubs know it
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
    serial = peewee.CharField(max_length=64, null=True, index=True)  # the board's serial number (0024)
    board_part_number = peewee.CharField(max_length=64, null=True)
    vbios = peewee.CharField(max_length=64, null=True)

    class Meta:
        indexes = ((("node", "uuid"), True),)


class Validation(BaseModel):
    """One run of a node's validation suite (fleetd.services.nodes.validation): what it checks, and per
    check and GPU whether it passed (migration 0023)."""

    id = peewee.CharField(primary_key=True, max_length=32)
    node_id = peewee.CharField(max_length=32)
    state = peewee.CharField(max_length=16)  # running, passed, failed
    reason = peewee.TextField(default="")  # why it runs: a new node, a repair, an operator's request
    suite = JSONText()  # what the agent is asked to run (the fleet's setting, resolved)
    then_status = peewee.CharField(max_length=16, default="ready")  # where the node goes once it passes
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
    node_id = peewee.CharField(max_length=32, null=True, index=True)  # None: not in any node's inventory now
    index = peewee.IntegerField(null=True)  # type: ignore[assignment]  # as Gpu.index
    first_seen_at = peewee.DateTimeField()
    last_seen_at = peewee.DateTimeField()
    xids = JSONText(default=list)  # critical XIDs its node's agent reported since that agent started
    ecc_uncorrected = peewee.BigIntegerField(null=True)  # volatile uncorrectable ECC errors, as last reported
    rma = JSONText(null=True)  # {reason, at, actor, node_id} once marked for RMA
    flagged = peewee.TextField(default="")  # why it is flagged (an RMA-marked board that came back), else ""
    # Not columns: what services.gpus.get_gpu adds for the API's answer.
    hostname: str | None
    healthy: bool | None
    health_reason: str | None
    history: list


class Event(BaseModel):
    """An audit record of a state change, with its reason."""

    id = peewee.AutoField()
    at = peewee.DateTimeField()
    kind = peewee.CharField(max_length=64)
    subject_type = peewee.CharField(max_length=16)
    subject_id = peewee.CharField(max_length=64)
    from_status = peewee.CharField(max_length=16, null=True)
    to_status = peewee.CharField(max_length=16, null=True)
    reason = peewee.TextField(default="")
    actor = peewee.CharField(max_length=200, default="fleetd")  # token:<name>, node:<id> or fleetd
    actor_token_id = peewee.CharField(max_length=32, null=True)  # the API token's id when a token caused it (0017)

    class Meta:
        indexes = ((("subject_type", "subject_id", "id"), False),)


class Job(BaseModel):
    """A submitted JobSpec and where it stands."""

    id = peewee.CharField(primary_key=True, max_length=32)
    name = peewee.CharField(max_length=200)
    owner = peewee.CharField(max_length=200, index=True)  # the submitting token's name
    owner_token_id = peewee.CharField(max_length=32)
    team = peewee.CharField(max_length=200, null=True)
    state = peewee.CharField(max_length=16, index=True)
    pending_reason = peewee.TextField(default="")
    attempt = peewee.IntegerField(default=1)
    max_attempts = peewee.IntegerField(default=1)
    num_nodes = peewee.IntegerField(default=1)
    priority_class = peewee.CharField(max_length=16, default="on-demand")
    spec = JSONText()
    outcome = peewee.CharField(max_length=16, null=True)
    outcome_reason = peewee.TextField(default="")
    submitted_at = peewee.DateTimeField()
    started_at = peewee.DateTimeField(null=True)
    ended_at = peewee.DateTimeField(null=True)
    instance_id = peewee.CharField(max_length=32, null=True, index=True)  # set on a run of an instance
    # services.placement.terms.group_key of its JobTerms (None: unknown, the pass always reads the job)
    group_key = peewee.CharField(max_length=20, null=True)

    # Not a column: the job's Task rows by rank, where a service loaded them (services.jobs).
    task_list: "list[Task]"

    class Meta:
        indexes = ((("state", "group_key"), False),)

    @property
    def job_spec(self):
        """The stored spec, typed (fleetd.specs.JobSpec)."""
        return JobSpec.from_dict(self.spec)


class Instance(BaseModel):
    """A long-running reserved workload. Each run (create, every resume) is one internal one-rank
    Job (`run_id`) placed by the scheduler like any job; the volume stays on `node`."""

    id = peewee.CharField(primary_key=True, max_length=32)
    name = peewee.CharField(max_length=200)
    owner = peewee.CharField(max_length=200, index=True)
    owner_token_id = peewee.CharField(max_length=32)
    team = peewee.CharField(max_length=200, null=True)
    state = peewee.CharField(max_length=16, index=True)
    status_reason = peewee.TextField(default="")
    desired_state = peewee.CharField(max_length=16, default="running")
    interrupted_by = peewee.CharField(max_length=16, null=True)  # the cause: node_lost, preempted, drain
    preempted_by = JSONText(null=True)  # {kind, id, name} of the workload that preempted it
    spec = JSONText()
    run_id = peewee.CharField(max_length=32, null=True)  # the current (or last) run's job id
    runs = peewee.IntegerField(default=0)
    node_id = peewee.CharField(max_length=32, null=True, index=True)  # where its volume is
    ports = JSONText(default=list)  # [{port, host_port, protocol}] as its node assigned them
    created_at = peewee.DateTimeField()
    started_at = peewee.DateTimeField(null=True)  # the current run's start
    process_started_at = peewee.DateTimeField(null=True)  # the current process's (latest restart's) start
    last_exit = JSONText(null=True)  # {exit_code, signal, reason, at, backoff_seconds} of its last process
    next_start_at = peewee.DateTimeField(null=True)  # while restarting: when its node starts it again
    stopped_at = peewee.DateTimeField(null=True)
    price_per_hour = peewee.FloatField(null=True)  # of the current (or last) run
    running_since = peewee.DateTimeField(null=True)  # while it runs: since when it accrues cost
    cost_accrued = peewee.FloatField(default=0.0)  # cost of the running time before running_since

    @property
    def instance_spec(self):
        """The stored spec, typed (fleetd.specs.InstanceSpec)."""
        return InstanceSpec.from_dict(self.spec)


# An owner's active jobs are counted at every submit (its limit): from this index, never its other jobs
# (migration 0018).
Job.add_index(Job.owner_token_id, Job.state, where=peewee.SQL("instance_id IS NULL"), name="job_owner_state")


# Names are handles: unique among one owner's instances until they are deleted (migration 0015).
Instance.add_index(Instance.owner_token_id, Instance.name, unique=True, where=peewee.SQL("state != 'deleted'"),
                   name="instance_owner_name_live")


class Task(BaseModel):
    """One rank of a job; `epoch` fences every call of the agent that holds its lease."""

    id = peewee.CharField(primary_key=True, max_length=32)
    job = peewee.ForeignKeyField(Job, backref="tasks", on_delete="CASCADE", column_name="job")
    rank = peewee.IntegerField()
    state = peewee.CharField(max_length=16, index=True)
    node = peewee.ForeignKeyField(Node, null=True, backref="tasks", on_delete="SET NULL", column_name="node")
    # The columns' values, as peewee's accessors give them (its stubs declare only the fields).
    job_id: str
    node_id: str | None
    epoch = peewee.IntegerField(default=0)
    gpus = JSONText(default=list)  # [{uuid, memory_limit_bytes?, compute_percent?}]
    delivered_at = peewee.DateTimeField(null=True)
    assigned_at = peewee.DateTimeField(null=True)
    started_at = peewee.DateTimeField(null=True)
    ended_at = peewee.DateTimeField(null=True)
    pid = peewee.IntegerField(null=True)
    exit_code = peewee.IntegerField(null=True)
    reason = peewee.TextField(default="")
    renewed_at = peewee.DateTimeField(null=True)  # its lease's last renewal that a replica wrote down
    rendezvous_addr = peewee.CharField(max_length=255, null=True)
    rendezvous_port = peewee.IntegerField(null=True)
    run_as = JSONText(null=True)  # {source, user, uid, gid} as delivered in its assignment

    class Meta:
        indexes = ((("job", "rank"), True),)


class LogLine(BaseModel):
    """A line of a task's output; `id` is the job-wide sequence number."""

    id = peewee.AutoField()
    job = peewee.ForeignKeyField(Job, backref="log_lines", on_delete="CASCADE", column_name="job")
    rank = peewee.IntegerField()
    attempt = peewee.IntegerField()
    at = peewee.DateTimeField()
    stream = peewee.CharField(max_length=16)
    text = peewee.TextField()

    class Meta:
        indexes = ((("job", "id"), False),)


class Artifact(BaseModel):
    """A content-addressed file in fleetd's artifact store: the bytes only, stored once however many
    owners uploaded them. Names and kinds are each owner's (ArtifactUpload; migration 0017)."""

    sha256 = peewee.CharField(primary_key=True, max_length=64)
    size = peewee.BigIntegerField()
    created_at = peewee.DateTimeField()


class ArtifactUpload(BaseModel):
    """An owner's record of an artifact: the API token that uploaded these bytes may read them back
    (and use them in jobs), under the name and kind it gave them; no one else sees those."""

    sha256 = peewee.CharField(max_length=64)
    token_id = peewee.CharField(max_length=32)
    uploaded_at = peewee.DateTimeField()
    name = peewee.CharField(max_length=255, default="")
    kind = peewee.CharField(max_length=64, default="")

    class Meta:
        primary_key = peewee.CompositeKey("sha256", "token_id")
        indexes = ((("token_id",), False),)  # an owner's stored bytes are summed at every upload (migration 0018)


class UiSession(BaseModel):
    """A signed-in admin UI session; signing out deletes it, which ends the cookie at once."""

    id = peewee.CharField(primary_key=True, max_length=64)
    token_id = peewee.CharField(max_length=32, index=True)
    created_at = peewee.DateTimeField()
    expires_at = peewee.DateTimeField(index=True)


class GpuType(BaseModel):
    """Prices of a GPU model, set by an admin (the model name is what agents report)."""

    model = peewee.CharField(primary_key=True, max_length=128)
    price_per_hour = peewee.FloatField(null=True)
    spot_min_bid = peewee.FloatField(null=True)


class Quota(BaseModel):
    """The most GPUs a team's running jobs may hold, per priority class ("any" for all classes)."""

    team = peewee.CharField(max_length=200)
    priority_class = peewee.CharField(max_length=16)
    max_gpus = peewee.FloatField()

    class Meta:
        primary_key = peewee.CompositeKey("team", "priority_class")


class UsageRecord(BaseModel):
    """The usage ledger: one row per run of a workload (a job's task in one attempt, keyed
    "<task id>.<epoch>"; an instance's run), its GPU-seconds and cost as far as `accounted_until`
    (the `usage` background task moves it on; fleetd.services.accounting.usage)."""

    id = peewee.CharField(primary_key=True, max_length=48)
    kind = peewee.CharField(max_length=16)  # job or instance
    workload_id = peewee.CharField(max_length=32, index=True)  # the job's id, or the instance's
    workload_name = peewee.CharField(max_length=200)
    task_id = peewee.CharField(max_length=32)
    job_id = peewee.CharField(max_length=32)  # the job, or the instance's run
    rank = peewee.IntegerField(default=0)
    attempt = peewee.IntegerField(default=1)  # the job's attempt, or the instance's run number
    owner = peewee.CharField(max_length=200)
    owner_token_id = peewee.CharField(max_length=32)
    team = peewee.CharField(max_length=200, default="")
    fleet = peewee.CharField(max_length=63, default="")
    node_id = peewee.CharField(max_length=32, default="")
    gpu_model = peewee.CharField(max_length=128, default="")
    priority_class = peewee.CharField(max_length=16, default="on-demand")
    gpus = peewee.FloatField(default=0.0)  # GPUs held, fractions included
    gpu_uuids = JSONText(default=list)
    bid = peewee.FloatField(null=True)  # a spot run's bid per GPU-hour: its price
    started_at = peewee.DateTimeField(index=True)
    ended_at = peewee.DateTimeField(null=True, index=True)
    accounted_until = peewee.DateTimeField()
    gpu_seconds = peewee.FloatField(default=0.0)  # allocated
    used_gpu_seconds = peewee.FloatField(default=0.0)  # utilisation-weighted, over the sampled part
    sampled_gpu_seconds = peewee.FloatField(default=0.0)  # allocated GPU-seconds that had samples
    cost = peewee.FloatField(default=0.0)
    price_per_hour = peewee.FloatField(null=True)  # per GPU-hour, in force at accounted_until

    class Meta:
        # a team's or an owner's runs over a time range (reports by workload) without reading the others'
        indexes = ((("team", "started_at"), False), (("owner_token_id", "started_at"), False))


class UsageDay(BaseModel):
    """The ledger's sums per UTC day, kind and (team, owner, fleet, GPU model): what reports read.
    Storage cost is kind "storage"; `runs` counts the runs that started that day."""

    id = peewee.AutoField()
    day = peewee.DateField()
    kind = peewee.CharField(max_length=16)
    team = peewee.CharField(max_length=200, default="")
    owner_token_id = peewee.CharField(max_length=32)
    owner = peewee.CharField(max_length=200)
    fleet = peewee.CharField(max_length=63, default="")
    gpu_model = peewee.CharField(max_length=128, default="")
    gpu_seconds = peewee.FloatField(default=0.0)
    used_gpu_seconds = peewee.FloatField(default=0.0)
    sampled_gpu_seconds = peewee.FloatField(default=0.0)
    cost = peewee.FloatField(default=0.0)
    runs = peewee.IntegerField(default=0)

    class Meta:
        indexes = ((("day", "kind", "team", "owner_token_id", "owner", "fleet", "gpu_model"), True),)


class _UsageWorkloadSums(BaseModel):
    """The ledger's sums of one workload (kind job or instance, its id) per period: what reports
    by workload read. Storage cost counts on the instance; `runs` counts the runs that started."""

    kind = peewee.CharField(max_length=16)
    workload_id = peewee.CharField(max_length=32)
    team = peewee.CharField(max_length=200, default="")
    owner_token_id = peewee.CharField(max_length=32)
    owner = peewee.CharField(max_length=200)
    gpu_seconds = peewee.FloatField(default=0.0)
    used_gpu_seconds = peewee.FloatField(default=0.0)
    sampled_gpu_seconds = peewee.FloatField(default=0.0)
    cost = peewee.FloatField(default=0.0)
    runs = peewee.IntegerField(default=0)


class UsageWorkloadDay(_UsageWorkloadSums):
    """A workload's sums per UTC day and fleet (a report by workload over any days)."""

    id = peewee.AutoField()
    day = peewee.DateField()
    fleet = peewee.CharField(max_length=63, default="")

    class Meta:
        indexes = ((("day", "kind", "workload_id", "fleet"), True), (("fleet", "day"), False),
                   (("team", "day"), False), (("owner_token_id", "day"), False), (("owner", "day"), False))


class UsageWorkloadMonth(_UsageWorkloadSums):
    """A workload's sums per UTC month (`month`: its first day), all fleets together: a month's
    report by workload reads its costliest rows straight from the (month, ..., cost) indexes."""

    id = peewee.AutoField()
    month = peewee.DateField()

    class Meta:
        indexes = ((("month", "kind", "workload_id"), True), (("month", "cost"), False),
                   (("month", "team", "cost"), False), (("month", "owner_token_id", "cost"), False),
                   (("month", "owner", "cost"), False))


class UsageMark(BaseModel):
    """A run that ended and is not in the ledger yet: written as its task ends (a requeue then
    clears the task's times, node and GPUs), read and removed by the `usage` background task."""

    id = peewee.AutoField()
    task_id = peewee.CharField(max_length=32)
    epoch = peewee.IntegerField()
    node_id = peewee.CharField(max_length=32, default="")
    gpus = JSONText(default=list)
    attempt = peewee.IntegerField(default=1)  # its job's attempt
    started_at = peewee.DateTimeField()
    ended_at = peewee.DateTimeField()

    class Meta:
        indexes = ((("task_id",), False),)  # a job's cost reads its runs' marks (migration 0030)


class StorageRecord(BaseModel):
    """An instance volume's storage cost (per GB-month at the storage price in force), as far as
    `accounted_until`; `id` is the instance's."""

    id = peewee.CharField(primary_key=True, max_length=32)
    owner = peewee.CharField(max_length=200)
    owner_token_id = peewee.CharField(max_length=32)
    team = peewee.CharField(max_length=200, default="")
    fleet = peewee.CharField(max_length=63, default="")
    volume_bytes = peewee.BigIntegerField(default=0)
    started_at = peewee.DateTimeField()
    ended_at = peewee.DateTimeField(null=True)
    accounted_until = peewee.DateTimeField()
    cost = peewee.FloatField(default=0.0)


class PriceChange(BaseModel):
    """A price as it was set, from `at` on: kind "gpu" (a GPU model's per GPU-hour) or "storage"
    (per GB-month, model ""); None: unpriced. The ledger integrates these piecewise."""

    id = peewee.AutoField()
    at = peewee.DateTimeField()
    kind = peewee.CharField(max_length=16)
    model = peewee.CharField(max_length=128, default="")
    price = peewee.FloatField(null=True)

    class Meta:
        indexes = ((("kind", "model", "at"), False),)


class Budget(BaseModel):
    """A team's budget per calendar month (UTC), in currency and/or GPU-hours (fleetd.services.accounting.budgets)."""

    team = peewee.CharField(primary_key=True, max_length=200)
    limit_cost = peewee.FloatField(null=True)
    limit_gpu_hours = peewee.FloatField(null=True)
    on_exceed = peewee.CharField(max_length=16, default="notify")  # notify, block or stop_spot
    exceeded_month = peewee.CharField(max_length=7, null=True)  # "YYYY-MM" it was last found exceeded
    updated_at = peewee.DateTimeField()
    updated_by = peewee.CharField(max_length=200, default="")


class BudgetNotice(BaseModel):
    """A threshold (50, 80, 100) of a team's budget that one month crossed: its webhook went out once."""

    team = peewee.CharField(max_length=200)
    month = peewee.CharField(max_length=7)
    threshold = peewee.IntegerField()
    at = peewee.DateTimeField()

    class Meta:
        primary_key = peewee.CompositeKey("team", "month", "threshold")


class ClusterSample(BaseModel):
    """One point of the cluster's history (jobs and GPUs over time)."""

    id = peewee.AutoField()
    at = peewee.DateTimeField(index=True)
    jobs_running = peewee.IntegerField()
    jobs_waiting = peewee.IntegerField()
    gpus_total = peewee.IntegerField()
    gpus_used = peewee.IntegerField()
    gpus_blocked = peewee.IntegerField()
    gpu_util_percent = peewee.FloatField(null=True)  # mean over GPUs that reported it


class GpuSample(BaseModel):
    """One GPU's readings at one time, relayed from its agent's heartbeat."""

    id = peewee.AutoField()
    at = peewee.DateTimeField(index=True)
    node_id = peewee.CharField(max_length=32)
    uuid = peewee.CharField(max_length=128)
    utilization_percent = peewee.FloatField(null=True)
    memory_used_bytes = peewee.BigIntegerField(null=True)
    temperature_c = peewee.FloatField(null=True)
    power_w = peewee.FloatField(null=True)


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


class LeaderLease(BaseModel):
    """One row: the replica that leads (schedules, decides liveness, runs background tasks), until
    when, and the fencing epoch that every write made for leadership is checked against."""

    id = peewee.IntegerField(primary_key=True)
    holder = peewee.CharField(max_length=64, default="")
    epoch = peewee.BigIntegerField(default=0)
    expires_at = peewee.DateTimeField()


# The event kinds a webhook can receive (fleetd.services.notify.webhooks decides which Event notifies which).
WEBHOOK_KINDS: tuple[str, ...] = (
                 "node.lost", "node.returned", "node.health", "node.drained", "job.failed", "instance.interrupted",
                 "leader.changed", "node.enrolled", "node.upgraded", "node.revoked", "node.deleted", "rollout.node",
                 "rollout.state")


WEBHOOK_KINDS += ("node.validation",)  # a node's validation passed or failed (services.nodes.validation)
WEBHOOK_KINDS += ("budget.threshold",)  # a team's month crossed 50, 80 or 100 % of its budget


class Webhook(BaseModel):
    """A receiver of event notifications. The secret signs each delivery, so it is stored as
    given (a hash could not sign); no answer or log ever shows it."""

    id = peewee.CharField(primary_key=True, max_length=32)
    url = peewee.TextField()
    secret = peewee.CharField(max_length=256)
    events = JSONText(default=list)  # the kinds it receives (WEBHOOK_KINDS)
    created_at = peewee.DateTimeField()
    created_by = peewee.CharField(max_length=200, default="")


class WebhookDelivery(BaseModel):
    """The outbox: one notification for one webhook, written in the transaction of the event that
    caused it, sent (and retried) by the `webhooks` background task."""

    id = peewee.CharField(primary_key=True, max_length=32)
    webhook = peewee.ForeignKeyField(Webhook, backref="deliveries", on_delete="CASCADE", column_name="webhook")
    kind = peewee.CharField(max_length=64)
    at = peewee.DateTimeField()  # when the event happened
    body = peewee.TextField()  # the JSON document sent, exactly the bytes that are signed
    state = peewee.CharField(max_length=16)  # pending, delivered, failed (gave up)
    attempts = peewee.IntegerField(default=0)
    next_attempt_at = peewee.DateTimeField(null=True)
    status_code = peewee.IntegerField(null=True)  # of the last attempt
    error = peewee.TextField(default="")  # of the last attempt
    finished_at = peewee.DateTimeField(null=True)

    class Meta:
        indexes = ((("state", "next_attempt_at"), False), (("webhook", "id"), False))


class Rollout(BaseModel):
    """An agent rollout over a fleet (`fleetd rollout start`): the CLI that drives it over SSH records
    each node's progress here, and any CLI reads it, pauses, resumes or aborts it (services.fleet_ops.rollouts)."""

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
    rollout = peewee.ForeignKeyField(Rollout, backref="nodes", on_delete="CASCADE", column_name="rollout")
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


class OwnerUid(BaseModel):
    """The host uid whose tasks an owner (an API token, by id) runs as when it has no unix_user:
    allocated once from the configured range, the same on every node, never changed or reused."""

    token_id = peewee.CharField(primary_key=True, max_length=32)
    uid = peewee.IntegerField(unique=True)
    allocated_at = peewee.DateTimeField()


class Setting(BaseModel):
    """Small key/value facts about this installation (for example: first admin token issued)."""

    key = peewee.CharField(primary_key=True, max_length=64)
    value = peewee.TextField()


MODELS = [ApiToken, Fleet, JoinToken, Node, Gpu, Event, Setting, Job, Task, Instance, LogLine, Artifact, ArtifactUpload, UiSession, GpuType, Quota,
          ClusterSample, GpuSample, InventoryVersion, InventoryChange, LeaderLease, Webhook, WebhookDelivery, OwnerUid,
          Rollout, RolloutNode, RetiredNode]
MODELS += [Validation, GpuRecord]  # the validation gate and GPU history (migrations 0023, 0024)
# Usage and budgets (migrations 0021, 0022).
MODELS += [UsageRecord, UsageDay, UsageWorkloadDay, UsageWorkloadMonth, UsageMark, StorageRecord, PriceChange, Budget, BudgetNotice]
MODELS += [OwnerSpecBytes]  # per-owner stored spec bytes (migration 0029)
