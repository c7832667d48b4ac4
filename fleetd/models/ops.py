"""Running the installation: events, webhooks and their deliveries, samples for metrics history,
the leader's lease, settings."""

import peewee

from fleetd.models.base import BaseModel, JSONText


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
    actor_token_id = peewee.CharField(
        max_length=32, null=True
    )  # the API token's id when a token caused it (0017)
    # How the actor authenticated: token:<name> (an API token), session (a user's signed-in
    # session) or jwt; null for nodes, join tokens and fleetd (0042).
    actor_via = peewee.CharField(max_length=255, null=True)

    class Meta:
        indexes = ((("subject_type", "subject_id", "id"), False),)


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


class LeaderLease(BaseModel):
    """One row: the replica that leads (schedules, decides liveness, runs background tasks), until
    when, and the fencing epoch that every write made for leadership is checked against."""

    id = peewee.IntegerField(primary_key=True)
    holder = peewee.CharField(max_length=64, default="")
    epoch = peewee.BigIntegerField(default=0)
    expires_at = peewee.DateTimeField()


# The event kinds a webhook can receive (fleetd.services.notify.webhooks decides which Event
# notifies which).
WEBHOOK_KINDS: tuple[str, ...] = (
    "node.lost",
    "node.returned",
    "node.health",
    "node.drained",
    "job.failed",
    "instance.interrupted",
    "leader.changed",
    "node.enrolled",
    "node.upgraded",
    "node.revoked",
    "node.deleted",
    "rollout.node",
    "rollout.state",
)


WEBHOOK_KINDS += (
    "node.validation",
)  # a node's validation passed or failed (services.nodes.validation)
WEBHOOK_KINDS += ("budget.threshold",)  # a team's month crossed 50, 80 or 100 % of its budget
# A board marked for RMA, seen again after it, or its mark cleared; a node's labels set through
# the API; a provisioning run recorded on a node.
WEBHOOK_KINDS += ("gpu.rma", "gpu.flagged", "gpu.rma_cleared", "node.labels", "node.bootstrap")
# Dynamic MIG: a GPU repartitioned, or a repartition that failed and blocked the GPU.
WEBHOOK_KINDS += ("gpu.mig_changed", "gpu.mig_failed")


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
    webhook = peewee.ForeignKeyField(
        Webhook, backref="deliveries", on_delete="CASCADE", column_name="webhook"
    )
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


class Setting(BaseModel):
    """Small key/value facts about this installation (for example: first admin token issued)."""

    key = peewee.CharField(primary_key=True, max_length=64)
    value = peewee.TextField()
