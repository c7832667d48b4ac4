"""Settings: defaults, then an optional TOML file (FLEETD_CONFIG), then FLEETD_* environment."""

import dataclasses
import ipaddress
import os

import fleetconf
from fleetwire.assignment import USER_NAME_RE

DEFAULT_DATA_DIR = "/var/lib/fleetd"


@dataclasses.dataclass
class Settings:
    """Everything fleetd can be configured with; every field has a FLEETD_<NAME> variable."""

    data_dir: str = DEFAULT_DATA_DIR
    db_url: str = ""  # empty: sqlite:///<data_dir>/fleetd.db
    bind: str = "127.0.0.1:8080"
    public_url: str = ""  # how agents reach fleetd; empty: the URL of the request
    sqlite_synchronous: str = "FULL"
    heartbeat_interval_seconds: int = 10
    max_heartbeats_per_second: float = (
        200.0  # the interval widens (TTL with it) to keep all nodes under this; 0: off
    )
    # Registrations this process admits per second; past it 429 with Retry-After, and the agent
    # comes back then (a storm of thousands of hosts must not starve the jobs' requests); 0: off
    max_registrations_per_second: float = 100.0
    max_registrations_in_flight: int = 8  # ... and being served at once (0: no bound)
    node_ttl_seconds: float = 30.0
    node_grace_seconds: float = 10.0
    failover_grace_seconds: float = -1.0  # negative: 2 x node_ttl_seconds
    max_body_bytes: int = 1024 * 1024
    auth_failure_limit: int = 20  # failed authentications per client address ...
    auth_failure_window_seconds: float = (
        60.0  # ... within this window, then 429 for failing requests
    )
    auth_failure_global_limit: int = 1000  # failed authentications from all addresses in the window
    trusted_proxies: str = ""  # comma-separated addresses/CIDRs whose X-Forwarded-For is believed
    token_retention_seconds: int = 86400  # keep expired tokens listed this long
    liveness_sweep_seconds: float = 5.0
    token_cleanup_seconds: float = 3600.0
    drain_check_seconds: float = 5.0
    task_lease_seconds: float = 40.0  # a task whose node stops renewing it this long is lost
    scheduler_interval_seconds: float = 5.0  # periodic pass, besides the passes events trigger
    # ... which asks a parked group again once it has been parked this long (events wake the rest)
    scheduler_parked_recheck_seconds: float = 30.0
    mig_plan_seconds: float = 15.0  # dynamic MIG: how often idle GPUs are planned from the queue
    lease_sweep_seconds: float = 5.0
    gpu_hold_check_seconds: float = (
        60.0  # the check that frees GPUs held by tasks that are not active
    )
    scheduler_max_placements_per_pass: int = (
        1000  # the rest of the queue waits for the next pass ...
    )
    scheduler_max_pass_seconds: float = 2.0  # ... as it does once a pass has decided for this long
    scheduler_policy: str = ""  # empty: the engine's default policy
    fleet_policies: str = ""  # per fleet, for jobs that select it: "gpu-a=packing,gpu-b=fgd"
    artifact_max_bytes: int = 1024**3
    output_dir: str = ""  # the output store's directory; empty: <data_dir>/output
    output_store: str = ""  # empty: that directory; s3://BUCKET/PREFIX: a bucket instead
    output_s3_endpoint: str = ""  # an S3-compatible server's URL (empty: AWS's)
    output_s3_region: str = ""  # the bucket's region (empty: boto3's own default)
    output_tail_lines: int = 1000  # the newest lines of each task's output kept as text
    output_search_seconds: float = 5.0  # a search (q) answers what it found by then, and a cursor
    output_flush_seconds: float = 5.0  # a download waits this long for running tasks' newest lines
    long_poll_max_seconds: float = 30.0  # cap on acquire, job wait and rendezvous wait
    metrics_sample_seconds: float = 60.0
    metrics_retention_seconds: int = 86400
    # Per-GPU rows a sample writes for GPUs no task holds (0: none); those tasks hold are sampled
    # every time (usage needs them), the others in turn past this many: at 100,000 nodes every
    # GPU every minute was 800,000 rows a minute.
    metrics_idle_gpu_samples_max: int = 20_000
    notification_retention_seconds: int = 30 * 86400  # the gc forgets older notifications
    usage_flush_seconds: float = (
        60.0  # how often the usage ledger accounts running work (and budgets are checked)
    )
    storage_measure_seconds: float = 300.0
    storage_watermark_percent: float = 85.0
    gc_interval_seconds: float = 3600.0
    webhook_send_seconds: float = (
        2.0  # how often queued webhook deliveries are sent (and retried when due)
    )
    webhooks_allow_targets: str = (
        ""  # comma-separated CIDRs webhooks may target although not global (a LAN receiver)
    )
    job_retention_seconds: int = 0  # > 0: the gc task deletes jobs ended longer ago than this
    shutdown_timeout_seconds: float = 10.0
    leader_lease_seconds: float = (
        8.0  # replicas on PostgreSQL: the leader renews its lease every quarter of this
    )
    db_pool_size: int = 32  # PostgreSQL connections per replica
    db_pool_wait_seconds: int = (
        10  # PostgreSQL: a request waits this long for a pooled connection, then 503
    )
    db_statement_timeout_seconds: float = (
        30.0  # PostgreSQL: a statement running longer is cancelled
    )
    max_connections: int = 10000
    http_idle_timeout_seconds: float = (
        300.0  # a keep-alive connection with no request this long is closed
    )
    http_header_timeout_seconds: float = 10.0  # a request's headers must all arrive within this
    http_body_timeout_seconds: float = (
        30.0  # and its body within this, plus its length at the rate below
    )
    http_body_min_bytes_per_second: int = (
        102400  # the slowest upload a long body may take (100 KiB/s)
    )
    max_connections_per_address: int = 2048  # connections one client address may hold open at once
    instances_max_host_ports_per_owner_per_node: int = (
        64  # declared ports an owner's instances may hold on a node
    )
    instances_resume_preempted: bool = (
        True  # a preempted instance that should run resumes by itself when there is room
    )
    task_uid_range: str = (
        "61184-65519"  # uids allocated to owners without a unix_user (systemd's DynamicUser range)
    )
    # Host users below uid 1000 (or nobody, 65534) that a token's unix_user may still name:
    # comma-separated (e.g. "ci-runner"); empty: none. Tokens run as system accounts only where the
    # operator says so here.
    tokens_allow_system_users: str = ""
    # What happens to the running work of a user deactivated (or deleted) through SCIM: "keep" it
    # running to its end, or "stop" its jobs and instances at once.
    scim_deactivated_work: str = "keep"
    # GraphQL's cloudType: the node labels (k=v,k=v) each type selects; empty: any node
    secure_cloud_labels: str = ""
    community_cloud_labels: str = "cloud_type=community"
    # Per-owner limits ([limits] in the file): each API token's, unless an admin set its own on the
    # token.
    limits_max_active_jobs: int = 10_000  # its jobs queued, running or cancelling
    limits_max_instances: int = 100  # its instances that are not deleted
    limits_max_spec_bytes: int = 256 * 1024  # one job or instance spec as stored
    # the specs its jobs, instances and runs store, ended ones included until the gc deletes them
    limits_max_stored_spec_bytes: int = 1024**3
    limits_max_artifact_bytes: int = (
        10 * 1024**3
    )  # what it uploaded, counted as if nothing were shared
    limits_requests_per_second: float = (
        1000.0  # its API requests (node sessions are exempt); 0: no limit
    )
    limits_request_burst_seconds: float = (
        2.0  # a token may spend this many seconds' worth of requests at once
    )

    @property
    def database_url(self):
        """The database URL, defaulting to SQLite in the data directory."""
        return self.db_url or "sqlite:///" + os.path.join(
            os.path.abspath(self.data_dir), "fleetd.db"
        )

    @property
    def failover_grace(self):
        """Seconds after start-up before any node may be declared lost."""
        if self.failover_grace_seconds < 0:
            return 2 * self.node_ttl_seconds
        return self.failover_grace_seconds

    @property
    def policy_by_fleet(self):
        """{fleet: policy name} from fleet_policies."""
        out = {}
        for item in filter(None, (part.strip() for part in self.fleet_policies.split(","))):
            fleet, sep, policy = item.partition("=")
            if not sep or not fleet.strip() or not policy.strip():
                raise ValueError(f"fleet_policies wants fleet=policy items, got {item!r}")
            out[fleet.strip()] = policy.strip()
        return out

    @property
    def trusted_networks(self):
        """trusted_proxies as a tuple of ip_network."""
        return _networks("trusted_proxies", self.trusted_proxies)

    @property
    def webhook_allowed_networks(self):
        """webhooks_allow_targets as a tuple of ip_network."""
        return _networks(
            "webhooks_allow_targets (FLEETD_WEBHOOKS_ALLOW_TARGETS)", self.webhooks_allow_targets
        )

    @property
    def task_uids(self):
        """task_uid_range as range(first, last + 1)."""
        first, sep, last = self.task_uid_range.partition("-")
        try:
            uids = range(int(first), int(last) + 1)
        except ValueError:
            uids = None
        if not sep or uids is None or not uids or uids.start < 1000 or uids.stop > 2**31:
            raise ValueError(
                f"task_uid_range wants FIRST-LAST with 1000 <= FIRST <= LAST < 2^31, "
                f"got {self.task_uid_range!r}"
            )
        return uids

    @property
    def allowed_system_users(self):
        """tokens_allow_system_users as a frozenset of user names."""
        names = frozenset(
            filter(None, (part.strip() for part in self.tokens_allow_system_users.split(",")))
        )
        for name in names:
            if not USER_NAME_RE.fullmatch(name) or name == "root":
                raise ValueError(
                    f"tokens_allow_system_users wants host user names other than root, "
                    f"comma-separated, got {name[:64]!r}"
                )
        return names

    @property
    def cloud_type_labels(self):
        """{cloudType: {label: value}} the GraphQL cloud types select (ALL: any node)."""
        return {
            "ALL": {},
            "SECURE": _labels("secure_cloud_labels", self.secure_cloud_labels),
            "COMMUNITY": _labels("community_cloud_labels", self.community_cloud_labels),
        }

    def validate(self):
        """Raise ValueError for settings that cannot work (unknown policy names, bad lists)."""
        from fleetd.scheduler import POLICIES

        self.trusted_networks  # noqa: B018 - raises on a bad list
        self.webhook_allowed_networks  # noqa: B018 - raises on a bad list
        self.task_uids  # noqa: B018 - raises on a bad range
        self.allowed_system_users  # noqa: B018 - raises on a bad list
        self.cloud_type_labels  # noqa: B018 - raises on a bad label list
        if (
            self.db_pool_wait_seconds < 1
        ):  # whole seconds (the pool's own unit); 0 would wait for ever
            raise ValueError("db_pool_wait_seconds must be >= 1")
        if self.scim_deactivated_work not in ("keep", "stop"):
            raise ValueError(
                f"scim_deactivated_work is keep or stop, got {self.scim_deactivated_work!r}"
            )
        if self.instances_max_host_ports_per_owner_per_node < 0:
            raise ValueError("instances_max_host_ports_per_owner_per_node must be >= 0")
        for name in (
            "limits_max_active_jobs",
            "limits_max_instances",
            "limits_max_spec_bytes",
            "limits_max_stored_spec_bytes",
            "limits_max_artifact_bytes",
            "limits_requests_per_second",
            "limits_request_burst_seconds",
            "max_registrations_per_second",
            "max_registrations_in_flight",
            "metrics_idle_gpu_samples_max",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

        for name in [self.scheduler_policy, *self.policy_by_fleet.values()]:
            if name and name not in POLICIES:
                raise ValueError(
                    f"unknown scheduler policy {name!r}; known: {', '.join(sorted(POLICIES))}"
                )
        return self

    @classmethod
    def load(cls, environ=None, **overrides):
        """Build settings from FLEETD_CONFIG (TOML), FLEETD_* variables and explicit overrides."""
        environ = os.environ if environ is None else environ
        path = environ.get("FLEETD_CONFIG")
        values = fleetconf.read_toml(path, ValueError) if path else {}
        return fleetconf.load(
            cls, "FLEETD_", values, environ, overrides, ValueError, where=path or "settings"
        ).validate()


def _labels(name, text):
    """ "k=v,k=v" as a dict; ValueError naming the setting."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{name} wants key=value items, comma-separated, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _networks(name, text):
    """A comma-separated list of addresses or CIDRs as a tuple of ip_network; ValueError naming the
    setting."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{name} wants addresses or CIDRs, got {item!r}") from None
    return tuple(out)
