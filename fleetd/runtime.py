"""The per-process state that services need besides the database."""

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from flask import current_app, request

from fleetd.auth import FailureLimiter, RequestRates, client_address
from fleetd.background import TaskRunner
from fleetd.clock import Clock
from fleetd.liveness import LeaseTracker, LivenessTracker, Notifier, RuntimeSamples
from fleetd.replicas import Leadership
from fleetd.services.agents.admission import Registrations
from fleetd.services.fleet_ops.metrics import Instruments
from fleetd.services.identity.identities import Identities
from fleetd.services.identity.oidc import OidcCache
from fleetd.services.nodes.accounts import Accounts
from fleetd.services.placement.engines import Engines
from fleetd.services.placement.inventory import InventoryCache, call
from fleetd.services.placement.loop import SchedulerLoop
from fleetd.services.placement.parking import ParkedGroups
from fleetd.services.placement.reservations import Reservations
from fleetd.services.placement.terms import TermsCache
from fleetd.services.workloads import output_store
from fleetd.services.workloads.lifecycle import NodeStops
from fleetd.services.workloads.output_store import FlushRequests


@dataclasses.dataclass
class Runtime:
    """Settings, clock, caches and trackers of one fleetd process: all of its state besides the
    database, made by build() (create_app calls it; tests get the same machine as
    `fleetd serve`)."""

    settings: Any  # fleetd.settings.Settings
    clock: Clock
    liveness: LivenessTracker
    limiter: FailureLimiter
    leases: LeaseTracker
    notifier: Notifier
    identities: Identities  # who tasks run as
    samples: RuntimeSamples  # what nodes last reported of their instance runs
    rates: RequestRates  # each API token's request rate
    # the registrations this process admits (a storm of hosts waits its turn)
    registrations: Registrations = dataclasses.field(default_factory=Registrations)
    trusted_networks: tuple = ()  # proxies whose X-Forwarded-For names the client
    stops: NodeStops = dataclasses.field(
        default_factory=NodeStops
    )  # stops nodes owe their processes
    terms: TermsCache = dataclasses.field(
        default_factory=TermsCache
    )  # a job's placement terms, by id
    parked: ParkedGroups = dataclasses.field(
        default_factory=ParkedGroups
    )  # groups that fit nowhere
    inventory: InventoryCache = dataclasses.field(
        default_factory=InventoryCache
    )  # nodes, GPUs, fleets
    engines: Engines = dataclasses.field(
        default_factory=Engines
    )  # placement engines kept between passes
    # what tasks hold, summed, kept between reads (services/placement/reservations.py)
    reservations: Reservations = dataclasses.field(default_factory=Reservations)
    pass_lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock
    )  # passes never overlap
    nominations: dict = dataclasses.field(
        default_factory=dict
    )  # job id -> task ids preempted for it
    oidc: OidcCache = dataclasses.field(default_factory=OidcCache)  # providers' discovery and keys
    # fleets that run tasks as their owners' own accounts, and who waits (services.nodes.accounts)
    accounts: Accounts = dataclasses.field(default_factory=Accounts)
    storage: dict = dataclasses.field(default_factory=dict)  # last measurement of the data dir
    # Who leads the replicas (fleetd.replicas); one process on SQLite always leads.
    leader: Leadership = dataclasses.field(default_factory=Leadership)
    # Runs CPU-heavy pure work (a pass's decisions) off the request loop: `fleetd serve` gives
    # gevent's thread pool; elsewhere it is a plain call.
    offload: Callable = call
    # Gives the event loop away between the pieces of long background work (a sweep that finds
    # thousands of nodes lost, a long write-down of heartbeat times): `fleetd serve` gives
    # gevent.sleep; elsewhere None (nothing to give away to).
    pause: Callable | None = None
    output_store: Any = None  # where stored output lives (services/workloads/output_store.py)
    # outputs whose open chunk a reader waits for, until their node's acquire takes them
    flushes: FlushRequests = dataclasses.field(default_factory=FlushRequests)
    instruments: Instruments | None = None  # the app's Prometheus instruments
    tasks: TaskRunner | None = None  # the background tasks (`fleetd serve` starts them)
    scheduler: SchedulerLoop | None = None  # passes after kicks (`fleetd serve` starts its thread)

    @classmethod
    def build(cls, settings, clock=None, app=None, offload=None, after_full_read=None, pause=None):
        """The runtime for these settings, and for `app` its instruments, background tasks and
        scheduler loop. `offload`: where CPU-heavy work runs (`fleetd serve`: a thread pool; its
        inventory reads are then throttled), `after_full_read`: called after a full inventory read
        or engine build (`fleetd serve` freezes what lives long), `pause`: gives the event loop
        away between the chunks of a long read (`fleetd serve`: gevent.sleep)."""
        clock = clock or Clock()
        liveness = LivenessTracker(
            clock,
            settings.node_ttl_seconds,
            settings.node_grace_seconds,
            settings.failover_grace,
            settings.heartbeat_interval_seconds,
            settings.max_heartbeats_per_second,
        )
        limiter = FailureLimiter(
            settings.auth_failure_limit,
            settings.auth_failure_window_seconds,
            settings.auth_failure_global_limit,
        )
        leases = LeaseTracker(clock, settings.task_lease_seconds, liveness.scale)
        rt = cls(
            settings,
            clock,
            liveness,
            limiter,
            leases,
            Notifier(),
            Identities(settings.task_uids, settings.allowed_system_users),
            RuntimeSamples(clock),
            RequestRates(
                settings.limits_requests_per_second, settings.limits_request_burst_seconds
            ),
            trusted_networks=settings.trusted_networks,
            registrations=Registrations(
                settings.max_registrations_per_second, settings.max_registrations_in_flight
            ),
        )
        rt.terms.accounts = rt.accounts.any
        rt.output_store = output_store.make_store(settings)
        if offload is not None:
            rt.offload = rt.inventory.offload = offload
            rt.inventory.throttle = True  # a view a few seconds old while reads would come faster
        if pause is not None:
            rt.pause = rt.inventory.pause = pause
        if after_full_read is not None:
            rt.inventory.after_full_read = rt.engines.after_build = after_full_read
        if app is not None:
            rt.instruments = Instruments(rt)
            rt.tasks = TaskRunner(app, rt)
            rt.scheduler = SchedulerLoop(app, rt)
        return rt


def current_runtime():
    """The Runtime of the running application."""
    return current_app.extensions["fleetd"]


def public_url():
    """How agents reach fleetd: the configured public URL, else the URL of this request."""
    return current_runtime().settings.public_url or request.host_url


def request_address():
    """The client's address for this request (behind a trusted proxy, from X-Forwarded-For)."""
    rt = current_runtime()
    return client_address(
        request.remote_addr, request.headers.get("X-Forwarded-For"), rt.trusted_networks
    )
