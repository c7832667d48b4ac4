"""Work: jobs, their tasks and output lines, instances, artifacts."""

import enum

import peewee

from fleetd.models.base import BaseModel, JSONText
from fleetd.models.fleet import Node
from fleetd.specs import InstanceSpec, JobSpec


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
        return self in (
            InstanceState.PENDING,
            InstanceState.STARTING,
            InstanceState.RUNNING,
            InstanceState.RESTARTING,
            InstanceState.STOPPING,
        )

    def can_resume(self):
        return self in (InstanceState.STOPPED, InstanceState.INTERRUPTED, InstanceState.FAILED)


class Job(BaseModel):
    """A submitted JobSpec and where it stands."""

    id = peewee.CharField(primary_key=True, max_length=32)
    name = peewee.CharField(max_length=200)
    owner = peewee.CharField(max_length=200, index=True)  # the submitting token's name
    owner_token_id = peewee.CharField(
        max_length=32
    )  # the owner's id: its user's (or a service account's)
    team = peewee.CharField(max_length=200, null=True)
    project = peewee.CharField(
        max_length=32, null=True, index=True
    )  # its project's key (runs: the instance's)
    user = peewee.CharField(
        max_length=64, null=True, column_name="user_login"
    )  # null: a service account's
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
    instance_id = peewee.CharField(
        max_length=32, null=True, index=True
    )  # set on a run of an instance
    # services.placement.terms.group_key of its JobTerms (None: unknown, the pass always reads the
    # job)
    group_key = peewee.CharField(max_length=20, null=True)

    # Not a column: the job's Task rows by rank, where a service loaded them (services.jobs).
    task_list: "list[Task]"

    class Meta:
        indexes = (
            # The queue by group with one job of each, and which of a group's jobs were told its
            # reason, read from the index (migrations 0040, 0048).
            (("state", "group_key", "pending_reason", "id"), False),
            # Listings page in id order after their filters (migration 0040).
            (("state", "instance_id", "id"), False),
            (("instance_id", "id"), False),
        )

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
    owner_token_id = peewee.CharField(
        max_length=32
    )  # the owner's id: its user's (or a service account's)
    team = peewee.CharField(max_length=200, null=True)
    project = peewee.CharField(max_length=32, null=True, index=True)
    user = peewee.CharField(max_length=64, null=True, column_name="user_login")
    state = peewee.CharField(max_length=16, index=True)
    status_reason = peewee.TextField(default="")
    desired_state = peewee.CharField(max_length=16, default="running")
    interrupted_by = peewee.CharField(
        max_length=16, null=True
    )  # the cause: node_lost, preempted, drain
    preempted_by = JSONText(null=True)  # {kind, id, name} of the workload that preempted it
    spec = JSONText()
    run_id = peewee.CharField(max_length=32, null=True)  # the current (or last) run's job id
    runs = peewee.IntegerField(default=0)
    node_id = peewee.CharField(max_length=32, null=True, index=True)  # where its volume is
    ports = JSONText(default=list)  # [{port, host_port, protocol}] as its node assigned them
    created_at = peewee.DateTimeField()
    started_at = peewee.DateTimeField(null=True)  # the current run's start
    process_started_at = peewee.DateTimeField(
        null=True
    )  # the current process's (latest restart's) start
    last_exit = JSONText(
        null=True
    )  # {exit_code, signal, reason, at, backoff_seconds} of its last process
    next_start_at = peewee.DateTimeField(
        null=True
    )  # while restarting: when its node starts it again
    stopped_at = peewee.DateTimeField(null=True)
    price_per_hour = peewee.FloatField(null=True)  # of the current (or last) run
    running_since = peewee.DateTimeField(null=True)  # while it runs: since when it accrues cost
    cost_accrued = peewee.FloatField(default=0.0)  # cost of the running time before running_since

    @property
    def instance_spec(self):
        """The stored spec, typed (fleetd.specs.InstanceSpec)."""
        return InstanceSpec.from_dict(self.spec)


# An owner's active jobs are counted at every submit (its limit): from this index, never its other
# jobs (migration 0018).
Job.add_index(
    Job.owner_token_id, Job.state, where=peewee.SQL("instance_id IS NULL"), name="job_owner_state"
)


# Names are handles: unique among one owner's instances until they are deleted (migration 0015).
Instance.add_index(
    Instance.owner_token_id,
    Instance.name,
    unique=True,
    where=peewee.SQL("state != 'deleted'"),
    name="instance_owner_name_live",
)


class Task(BaseModel):
    """One rank of a job; `epoch` fences every call of the agent that holds its lease."""

    id = peewee.CharField(primary_key=True, max_length=32)
    job = peewee.ForeignKeyField(Job, backref="tasks", on_delete="CASCADE", column_name="job")
    rank = peewee.IntegerField()
    state = peewee.CharField(max_length=16)  # indexed with id and epoch (Meta)
    node = peewee.ForeignKeyField(
        Node, null=True, backref="tasks", on_delete="SET NULL", column_name="node"
    )
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
    renewed_at = peewee.DateTimeField(
        null=True
    )  # its lease's last renewal that a replica wrote down
    rendezvous_addr = peewee.CharField(max_length=255, null=True)
    rendezvous_port = peewee.IntegerField(null=True)
    run_as = JSONText(null=True)  # {source, user, uid, gid} as delivered in its assignment
    # Its GPUs' weakest link (scheduler.RankPlacement.link_class; migration 0044): None where its
    # node's links are unknown or it holds no GPU.
    link_class = peewee.CharField(max_length=16, null=True)

    class Meta:
        # (state, id, epoch): which tasks are active, from the index alone (placement.task_holds).
        indexes = ((("job", "rank"), True), (("state", "id", "epoch"), False))


class LogLine(BaseModel):
    """The text of a line of a task's output that fleetd keeps (the first lines and the newest of
    each output; the whole is in the output store). `id` is the line's `seq`: given by its
    OutputSegment (services/workloads/output.py); `line` its number in its output. Rows written
    before migration 0041 have no `line`, and their `id` (below OUTPUT_SEQ_BASE) was their seq."""

    id = peewee.BigAutoField()
    job = peewee.ForeignKeyField(Job, backref="log_lines", on_delete="CASCADE", column_name="job")
    rank = peewee.IntegerField()
    attempt = peewee.IntegerField()
    at = peewee.DateTimeField()
    stream = peewee.CharField(max_length=16)
    text = peewee.TextField()
    line = peewee.BigIntegerField(null=True)

    class Meta:
        indexes = ((("job", "id"), False),)


class TaskOutput(BaseModel):
    """A task's output in one run on one node (its task and epoch): how many lines and bytes it
    has, how many of its first lines the output store holds (`stored_lines`, in OutputChunks), and
    whether its cap cut it. `ended`: its finish was reported, so `lines` is the whole."""

    id = peewee.AutoField()
    job = peewee.ForeignKeyField(Job, backref="outputs", on_delete="CASCADE", column_name="job")
    rank = peewee.IntegerField()
    attempt = peewee.IntegerField()
    task_id = peewee.CharField(max_length=32)
    epoch = peewee.IntegerField()
    node_id = peewee.CharField(max_length=32)
    lines = peewee.BigIntegerField(default=0)
    bytes = peewee.BigIntegerField(default=0)
    stored_lines = peewee.BigIntegerField(default=0)
    stored_bytes = peewee.BigIntegerField(default=0)
    truncated = peewee.BooleanField(default=False)
    cap_bytes = peewee.BigIntegerField()
    ended = peewee.BooleanField(default=False)
    first_at = peewee.DateTimeField(null=True)
    last_at = peewee.DateTimeField(null=True)
    job_id: str  # the column's value, as peewee's accessor gives it

    class Meta:
        indexes = ((("task_id", "epoch"), True), (("job", "rank", "attempt"), False))


class OutputSegment(BaseModel):
    """Lines of an output in the order fleetd learnt of them: lines `first_line` to `first_line +
    count - 1` have the seqs OUTPUT_SEQ_BASE + (id << 20) onwards, so a job's (or an instance's)
    lines are numbered in order of arrival across its ranks without a row per line."""

    id = peewee.AutoField()
    job = peewee.ForeignKeyField(Job, on_delete="CASCADE", column_name="job")
    output = peewee.ForeignKeyField(TaskOutput, on_delete="CASCADE", column_name="output")
    first_line = peewee.BigIntegerField()
    count = peewee.IntegerField()
    first_at = peewee.DateTimeField()
    last_at = peewee.DateTimeField()

    class Meta:
        indexes = ((("job", "id"), False), (("output", "first_line"), False))


class OutputChunk(BaseModel):
    """A stored chunk of an output (fleetwire.output): `lines` lines from `first_line`, `bytes`
    of frames, `stored_bytes` compressed in the output store under `key`."""

    id = peewee.AutoField()
    output = peewee.ForeignKeyField(
        TaskOutput, backref="chunks", on_delete="CASCADE", column_name="output"
    )
    first_line = peewee.BigIntegerField()
    lines = peewee.IntegerField()
    bytes = peewee.BigIntegerField()
    stored_bytes = peewee.BigIntegerField()
    first_at = peewee.DateTimeField()
    last_at = peewee.DateTimeField()
    key = peewee.CharField(max_length=200)

    class Meta:
        indexes = ((("output", "first_line"), True),)


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
        indexes = (
            (("token_id",), False),
        )  # an owner's stored bytes are summed at every upload (migration 0018)
