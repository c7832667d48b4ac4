"""The per-process state that services need besides the database."""

import dataclasses

from flask import current_app, request

from fleetd.auth import FailureLimiter, RequestRates, client_address
from fleetd.clock import Clock
from fleetd.liveness import LeaseTracker, LivenessTracker, Notifier, RuntimeSamples
from fleetd.replicas import Leadership
from fleetd.services.cluster import call
from fleetd.services.identities import Identities


@dataclasses.dataclass
class Runtime:
    """Settings, clock and the in-memory trackers of one fleetd process."""

    settings: object
    clock: Clock
    liveness: LivenessTracker
    limiter: FailureLimiter
    leases: LeaseTracker
    notifier: Notifier
    nominations: dict = dataclasses.field(default_factory=dict)  # job id -> task ids preempted for it
    storage: dict = dataclasses.field(default_factory=dict)  # last measurement of the data dir
    instruments: object = None  # services.metrics.Instruments, set by create_app
    tasks: object = None  # background.TaskRunner, set by create_app
    scheduler: object = None  # services.scheduling.SchedulerLoop, set by create_app
    trusted_networks: tuple = ()  # proxies whose X-Forwarded-For names the client
    parked: object = None  # services.scheduling.ParkedGroups, set by create_app
    inventory: object = None  # services.cluster.InventoryCache, set by create_app
    engines: object = None  # services.engines.Engines (placement engines kept between passes), set by create_app
    # Runs CPU-heavy pure work (a pass's decisions) off the request loop: fleetd serve sets it to
    # gevent's thread pool; elsewhere it is a plain call.
    offload: object = call
    # Who leads the replicas (fleetd.replicas); one process on SQLite always leads.
    leader: Leadership = dataclasses.field(default_factory=Leadership)
    identities: Identities | None = None  # who tasks run as (services.identities), set by build()
    samples: RuntimeSamples | None = None  # what nodes last reported of their instance runs, set by build()
    rates: RequestRates | None = None  # each API token's request rate, set by build()

    @classmethod
    def build(cls, settings, clock=None):
        """Create the runtime for these settings."""
        clock = clock or Clock()
        liveness = LivenessTracker(
            clock, settings.node_ttl_seconds, settings.node_grace_seconds, settings.failover_grace,
            settings.heartbeat_interval_seconds, settings.max_heartbeats_per_second,
        )
        limiter = FailureLimiter(settings.auth_failure_limit, settings.auth_failure_window_seconds,
                                 settings.auth_failure_global_limit)
        leases = LeaseTracker(clock, settings.task_lease_seconds, liveness.scale)
        return cls(settings, clock, liveness, limiter, leases, Notifier(), trusted_networks=settings.trusted_networks,
                   identities=Identities(settings.task_uids), samples=RuntimeSamples(clock),
                   rates=RequestRates(settings.limits_requests_per_second, settings.limits_request_burst_seconds))


def current_runtime():
    """The Runtime of the running application."""
    return current_app.extensions["fleetd"]


def public_url():
    """How agents reach fleetd: the configured public URL, else the URL of this request."""
    return current_runtime().settings.public_url or request.host_url


def request_address():
    """The client's address for this request (behind a trusted proxy, from X-Forwarded-For)."""
    rt = current_runtime()
    return client_address(request.remote_addr, request.headers.get("X-Forwarded-For"), rt.trusted_networks)
