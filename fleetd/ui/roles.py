"""Who may open each UI page and press each button: taken from the API view that does the same.

The roles are read from the API's own `require` decorators, so the UI cannot drift from the
API: a page that shows what GET /api/v1/nodes shows admits exactly the roles that route admits.
"""

from fleetd.api import (
    admin,
    auth,
    cluster,
    fleets,
    instances,
    jobs,
    metrics,
    nodes,
    people,
    tokens,
    usage,
    webhooks,
)
from fleetd.auth import allowed_roles


def _roles(view, method):
    # With what the roles imply (a member, an operator or a viewer what a submitter may), as the
    # API checks them.
    return frozenset(allowed_roles(getattr(view, method).required_roles, method.upper()))


OVERVIEW = _roles(cluster.ClusterStatus, "get")
HISTORY = _roles(metrics.MetricsHistory, "get")
STORAGE = frozenset({"admin"})  # cluster status shows storage to admins only (API view)
NODES = _roles(nodes.Nodes, "get") | _roles(nodes.NodeById, "get")
NODE_EVENTS = _roles(nodes.NodeEvents, "get")
NODE_ACTIONS = {
    "cordon": _roles(nodes.NodeCordon, "post"),
    "uncordon": _roles(nodes.NodeUncordon, "post"),
    "drain": _roles(nodes.NodeDrain, "post"),
    "undrain": _roles(nodes.NodeUndrain, "post"),
    "revoke": _roles(nodes.NodeRevoke, "post"),
}
ALLOCATION = _roles(cluster.ClusterAllocation, "get")
JOBS = _roles(jobs.Jobs, "get")
JOB = _roles(jobs.JobById, "get")
JOB_SUBMIT = _roles(jobs.Jobs, "post")
JOB_CANCEL = _roles(jobs.JobCancel, "post")
JOB_LOGS = _roles(jobs.JobLogs, "get")
JOB_EVENTS = _roles(jobs.JobEvents, "get")
SIMULATE = _roles(cluster.SimulateSchedule, "post")
INSTANCES = _roles(instances.Instances, "get")
INSTANCE = _roles(instances.InstanceById, "get")
INSTANCE_ACTIONS = {
    "stop": _roles(instances.InstanceStop, "post"),
    "resume": _roles(instances.InstanceResume, "post"),
    "delete": _roles(instances.InstanceById, "delete"),
}
INSTANCE_CREATE = _roles(instances.Instances, "post")
INSTANCE_LOGS = _roles(instances.InstanceLogs, "get")
INSTANCE_EVENTS = _roles(instances.InstanceEvents, "get")
FLEETS = _roles(fleets.Fleets, "get")
FLEET = _roles(fleets.FleetByName, "get")
FLEET_CREATE = _roles(fleets.Fleets, "post")
FLEET_UPDATE = _roles(fleets.FleetByName, "patch")
QUOTAS = _roles(cluster.Quotas, "get")
QUOTA_SET = _roles(cluster.QuotaByTeam, "put")
QUOTA_DELETE = _roles(cluster.QuotaByTeam, "delete")
USAGE = _roles(usage.Usage, "get")
IDLE = _roles(usage.IdleWorkloads, "get")
BUDGETS = _roles(usage.Budgets, "get")
BUDGET_SET = _roles(usage.BudgetByTeam, "put")
WEBHOOKS = _roles(webhooks.Webhooks, "get")
WEBHOOK_CREATE = _roles(webhooks.Webhooks, "post")
WEBHOOK_DELETE = _roles(webhooks.WebhookById, "delete")
WEBHOOK_DELIVERIES = _roles(webhooks.WebhookDeliveries, "get")
JOIN_TOKENS = _roles(fleets.FleetJoinTokens, "get")
JOIN_TOKEN_CREATE = _roles(fleets.FleetJoinTokens, "post")
JOIN_TOKEN_REVOKE = _roles(fleets.JoinTokenById, "delete")
API_TOKENS = _roles(tokens.Tokens, "get")
API_TOKEN_CREATE = _roles(tokens.Tokens, "post")
API_TOKEN_REVOKE = _roles(tokens.TokenById, "delete")
TASKS = _roles(admin.BackgroundTasks, "get")
TASK_RUN = _roles(admin.BackgroundTaskRun, "post")
GPU_TYPES = _roles(cluster.GpuTypes, "get")
GPU_TYPE_SET = _roles(cluster.GpuTypeByModel, "put")
PROFILE = _roles(people.Whoami, "get")
USERS = _roles(people.Users, "get")
USER = _roles(people.UserByLogin, "get")
USER_UPDATE = _roles(people.UserByLogin, "patch")
USER_DELETE = _roles(people.UserByLogin, "delete")
PROJECTS = _roles(people.Projects, "get")
PROJECT_CREATE = _roles(people.Projects, "post")
PROJECT = _roles(people.ProjectByKey, "get") & _roles(people.Members, "get")
PROJECT_UPDATE = _roles(people.ProjectByKey, "patch")
PROJECT_DELETE = _roles(people.ProjectByKey, "delete")
MEMBER_SET = _roles(people.Member, "put")
MEMBER_REMOVE = _roles(people.Member, "delete")
SERVICE_ACCOUNTS = _roles(people.ServiceAccounts, "get")
SERVICE_ACCOUNT_CREATE = _roles(people.ServiceAccounts, "post")
PROVIDERS = _roles(auth.Providers, "get")
PROVIDER = _roles(auth.ProviderByName, "get")
PROVIDER_SET = _roles(auth.ProviderByName, "put")
PROVIDER_DELETE = _roles(auth.ProviderByName, "delete")
BINDINGS = _roles(auth.Bindings, "get")
BINDINGS_SET = _roles(auth.Bindings, "put")
SIGN_IN_SETTINGS = PROVIDERS & BINDINGS

# The navigation bar: (endpoint, label, roles that see the link).
NAV = [
    ("ui.overview", "Overview", OVERVIEW),
    ("ui.node_list", "Nodes", NODES),
    ("ui.job_list", "Jobs", JOBS),
    ("ui.instance_list", "Instances", INSTANCES),
    ("ui.fleet_list", "Fleets", FLEETS),
    ("ui.quotas", "Quotas", QUOTAS),
    ("ui.webhooks_page", "Webhooks", WEBHOOKS),
    ("ui.usage_page", "Usage", USAGE),
    ("ui.join_tokens", "Join tokens", JOIN_TOKENS),
    ("ui.api_tokens", "API tokens", API_TOKENS),
    ("ui.maintenance", "Maintenance", TASKS),
    ("ui.gpu_types", "GPU types", GPU_TYPES),
    ("ui.user_list", "Users", USERS),
    ("ui.project_list", "Projects", PROJECTS),
    ("ui.sign_in_settings", "Sign-in", SIGN_IN_SETTINGS),
]
