"""Peewee models and status enums, one module per domain; every name is importable from here.
Times are naive UTC; ids are opaque strings.

- ``base``        new_id, JSONText, BaseModel (saves and reads by primary key compiled once)
- ``identity``    roles, API tokens, UI sessions, owners' uids and stored spec bytes
- ``fleet``       fleets, join tokens, nodes, GPUs, validation, GPU history, inventory, rollouts
- ``workloads``   jobs, tasks, output lines, instances, artifacts
- ``accounting``  GPU types and prices, quotas, the usage ledger, storage, budgets
- ``ops``         events, webhooks, metrics samples, the leader's lease, settings
"""

from fleetd.models.accounting import (
    Budget,
    BudgetNotice,
    GpuType,
    PriceChange,
    Quota,
    StorageRecord,
    UsageDay,
    UsageMark,
    UsageRecord,
    UsageWorkloadDay,
    UsageWorkloadMonth,
)
from fleetd.models.base import BaseModel, JSONText, new_id, transition_table
from fleetd.models.fleet import (
    DEFAULT_HEALTH_POLICY,
    DEFAULT_TASK_MEMORY_BYTES,
    DEFAULT_TASK_PATH,
    DEFAULT_TASK_PIDS_MAX,
    MAX_TASK_MEMORY_BYTES,
    MIN_TASK_MEMORY_BYTES,
    NODE_ACTIONS,
    Fleet,
    Gpu,
    GpuRecord,
    InventoryChange,
    InventoryVersion,
    JoinToken,
    Node,
    NodeStatus,
    RetiredNode,
    Rollout,
    RolloutNode,
    Validation,
    effective_health_policy,
)
from fleetd.models.identity import (
    LIMIT_NAMES,
    ApiToken,
    AuthProvider,
    AuthSession,
    OwnerSpecBytes,
    OwnerUid,
    Project,
    ProjectMember,
    Role,
    UiSession,
    User,
)
from fleetd.models.ops import (
    WEBHOOK_KINDS,
    ClusterSample,
    Event,
    GpuSample,
    LeaderLease,
    Setting,
    Webhook,
    WebhookDelivery,
)
from fleetd.models.workloads import (
    Artifact,
    ArtifactUpload,
    Instance,
    InstanceState,
    Job,
    JobState,
    LogLine,
    Task,
    TaskState,
)

__all__ = [
    "BaseModel", "JSONText", "new_id", "transition_table",
    "LIMIT_NAMES", "ApiToken", "OwnerSpecBytes", "OwnerUid", "Role", "UiSession", "User", "Project",
    "ProjectMember", "AuthSession", "AuthProvider",
    "DEFAULT_HEALTH_POLICY", "DEFAULT_TASK_MEMORY_BYTES", "DEFAULT_TASK_PATH", "DEFAULT_TASK_PIDS_MAX",
    "MAX_TASK_MEMORY_BYTES", "MIN_TASK_MEMORY_BYTES", "NODE_ACTIONS", "Fleet", "Gpu", "GpuRecord",
    "InventoryChange", "InventoryVersion", "JoinToken", "Node", "NodeStatus", "RetiredNode", "Rollout",
    "RolloutNode", "Validation", "effective_health_policy",
    "Artifact", "ArtifactUpload", "Instance", "InstanceState", "Job", "JobState", "LogLine", "Task",
    "TaskState",
    "Budget", "BudgetNotice", "GpuType", "PriceChange", "Quota", "StorageRecord", "UsageDay", "UsageMark",
    "UsageRecord", "UsageWorkloadDay", "UsageWorkloadMonth",
    "WEBHOOK_KINDS", "ClusterSample", "Event", "GpuSample", "LeaderLease", "Setting", "Webhook",
    "WebhookDelivery",
    "MODELS",
]

# Every table, in the order tests and a new database create them.
MODELS = [ApiToken, Fleet, JoinToken, Node, Gpu, Event, Setting, Job, Task, Instance, LogLine, Artifact,
          ArtifactUpload, UiSession, GpuType, Quota, ClusterSample, GpuSample, InventoryVersion,
          InventoryChange, LeaderLease, Webhook, WebhookDelivery, OwnerUid, Rollout, RolloutNode, RetiredNode]
MODELS += [Validation, GpuRecord]  # the validation gate and GPU history (migrations 0023, 0024)
# Usage and budgets (migrations 0021, 0022).
MODELS += [UsageRecord, UsageDay, UsageWorkloadDay, UsageWorkloadMonth, UsageMark, StorageRecord, PriceChange,
           Budget, BudgetNotice]
MODELS += [OwnerSpecBytes]  # per-owner stored spec bytes (migration 0029)
MODELS += [User, Project, ProjectMember, AuthSession, AuthProvider]  # people and projects (migration 0031)
