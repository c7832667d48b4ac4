"""Enrolment and the long-running service: device polling, heartbeats, the work loop, sd_notify.

Every loop waits on one stop event, so SIGTERM ends them all within one wait (the acquire long
poll ends with its request). Tasks themselves run in agent/task/.
"""

import dataclasses
import functools
import gc
import importlib.metadata
import logging
import os
import random
import socket
import sys
import threading
import time
import urllib.parse

from agent.client import (
    FleetClient,
    FleetdError,
    Rejected,
    ServerUrls,
    Unreachable,
    backoff_delay,
    display_url,
)
from agent.config import Config, ConfigError, node_server_urls
from agent.devices import DeviceManager
from agent.isolation import Isolation
from agent.keeper import start_keeper, stop_keeper, write_lease
from agent.lease import LeaseClock
from agent.localapi import LocalApi
from agent.mig import MigChanges, held_mig_devices
from agent.procfs import read_memory_total
from agent.state import State
from agent.task.container import ContainerRuntime
from agent.task.limits import Limits, LimitSettings
from agent.task.runner import Runner
from agent.validator import Validator
from agent.workers import Workers
from fleetwire.heartbeat import Heartbeat
from fleetwire.registration import Registration, Resources
from fleetwire.topology import Topology

log = logging.getLogger("agent.daemon")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_REVOKED = 3  # revoked or session rejected: restarting will not help; re-enrol

DEFAULT_HEARTBEAT_SECONDS = 10.0
ENROLMENT_POLL_SECONDS = 1.0
ACQUIRE_WAIT_SECONDS = 30  # the most fleetd allows (docs/api.md, acquire)
ACQUIRE_BATCH = 16  # assignments one acquire may deliver (a fleetd that predates batches gets 1)
# After a stop that requeued tasks: how long the acquire in flight may take to bring back an
# assignment (fleetd may place a requeued job on this node again at once) so it is handed back.
HAND_BACK_SECONDS = 2.0
LEASE_CHECK_SECONDS = (
    0.5  # how often the job tasks' lease is looked at (the stop comes this late at most)
)
RUNTIME_DETECT_SECONDS = (
    300.0  # how often the container runtime is looked for again (one installed since)
)


def agent_version():
    """The installed package version."""
    try:
        return importlib.metadata.version("fleetd")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def installed_bundle(prefix=None):
    """{agent_version, bundle_sha256} of this agent: the package version and the SHA-256 of the
    offline bundle it was installed from (bundle.json in the venv, written by the installer; ''
    when the agent was not installed from a bundle). Sent in heartbeats so fleetd learns of
    upgrades."""
    import json

    path = os.path.join(prefix or sys.prefix, "bundle.json")
    sha = ""
    try:
        with open(path) as fh:
            value = json.load(fh).get("bundle_sha256", "")
        if (
            isinstance(value, str)
            and len(value) == 64
            and all(c in "0123456789abcdef" for c in value)
        ):
            sha = value
    except (OSError, ValueError, AttributeError):
        pass
    return {"agent_version": agent_version(), "bundle_sha256": sha}


def jittered(interval, rng=random, spread=0.1):
    """`interval` +/- 10 %, so that agents started together do not heartbeat in lockstep."""
    return interval * rng.uniform(1 - spread, 1 + spread)


def sd_notify(message, environ=None):
    """Send a systemd notification (READY=1, WATCHDOG=1, ...); False when not under systemd."""
    environ = os.environ if environ is None else environ
    address = environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("sd_notify failed: %s", exc)
        return False
    return True


def watchdog_interval(environ=None):
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when not asked for."""
    environ = os.environ if environ is None else environ
    usec = environ.get("WATCHDOG_USEC")
    pid = environ.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2e6


def host_resources(container_runtime=None):
    """{cpu_count, memory_bytes, container_runtime} of this host."""
    memory = read_memory_total()
    if memory is None:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": memory,
        "container_runtime": container_runtime,
    }


def runtime_name(config):
    """ "podman", "docker" or None: the container runtime containers.command gives."""
    runtime = ContainerRuntime.detect(config.containers_command)
    return runtime.name if runtime is not None else None


def detect_address(server_url):
    """The local address used to reach fleetd (a UDP connect sends nothing); `server_url` may be a
    list: the first URL whose host resolves and routes counts."""
    for url in [server_url] if isinstance(server_url, str) else server_url:
        parsed = urllib.parse.urlsplit(url)
        host = parsed.hostname or "127.0.0.1"
        try:
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
            family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0][0]
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((host, port))
                return sock.getsockname()[0]
        except (OSError, ValueError):
            continue
    return socket.gethostname()


def register_body(config, inventory, machine_id, labels):
    """The Registration (fleetwire.registration) this host sends with a join token."""
    return Registration(
        hostname=socket.gethostname()[:255],
        machine_id=machine_id,
        agent_version=agent_version(),
        address=config.address or detect_address(config.server_urls),
        labels=dict(labels),
        resources=Resources(**host_resources(runtime_name(config))),
        gpus=tuple(inventory.wire_gpus()),
        topology=wire_topology(inventory),
    )


def wire_topology(inventory):
    """The inventory's topology as the wire carries it, or None (said in the log) when the wire
    would refuse it: registration never fails for its topology."""
    if inventory.topology is None:
        return None
    try:
        return Topology.from_wire(inventory.topology, [g.gpu.uuid for g in inventory.devices])
    except ValueError as exc:
        log.warning("GPU topology left out of the registration: %s", exc)
        return None


def refused_topology(exc):
    """True when fleetd refused a request for its `topology` (one older than the field)."""
    return exc.status in (400, 422) and "topology" in f"{exc} {exc.details}"


def make_client(config, server_url, session_token=None):
    """A FleetClient with the configured TLS trust; `server_url`: a URL, a list, or a shared
    ServerUrls."""
    return FleetClient(
        server_url,
        session_token,
        ca_file=config.ca_file,
        tls_pin=config.tls_pin,
        timeout=config.request_timeout_seconds,
    )


ADMISSION_WAIT_SECONDS = 600.0  # how long a registration waits its turn in a storm of hosts


def register_when_admitted(client, join_token, body, wait_seconds=ADMISSION_WAIT_SECONDS):
    """client.register(), asked again while fleetd answers 429 or 503 (a storm of hosts: fleetd
    admits so many registrations a second and says when to come back), after its Retry-After
    with up to a second of jitter added, for at most `wait_seconds`. Anything else, a fleetd that
    cannot be reached among them, fails at once."""
    deadline = time.monotonic() + wait_seconds
    rng = random.SystemRandom()
    for attempt in range(1, 100_000):  # bounded by the deadline well before
        try:
            return client.register(join_token, body)
        except Unreachable as exc:
            if exc.status not in (429, 503):
                raise
            delay = max(exc.retry_after or 0.0, 1.0) + rng.uniform(0.0, 1.0)
            if time.monotonic() + delay > deadline:
                raise
            if attempt == 1 or attempt % 10 == 0:
                log.info(
                    "fleetd is busy admitting hosts (%s); registering again in %.1fs", exc, delay
                )
            time.sleep(delay)
    raise FleetdError("registration: fleetd never admitted this host")


def enrol(config, join_token, force=False, devices=None):
    """Register with a join token and store the credentials; a no-op when already enrolled.

    Returns (node dict, True if it registered now).
    """
    urls = config.server_urls
    if not urls:
        raise ConfigError("no fleetd URL: pass --server or set server_url")
    state = State(config.state_dir)
    node = state.node()
    if node is not None and state.session_token() and not force:
        stored = node_server_urls(node)
        if stored and not {u.lower() for u in stored} & {u.lower() for u in urls}:
            raise ConfigError(
                f"already enrolled with {', '.join(stored)}; use --force to enrol with "
                f"{', '.join(urls)} instead"
            )
        if stored and stored != urls:
            # The same control plane (a URL in common) with replicas added or removed: keep the
            # list.
            node = dict(node, server_url=urls[0], server_urls=urls)
            state.save_enrolment(node, state.session_token())
            log.info(
                "fleetd URLs of node %s are now %s",
                node.get("node_id"),
                ", ".join(map(display_url, urls)),
            )
        return node, False
    machine_id = config.resolve_machine_id()
    state.ensure_dir()
    state.local_api_token()
    devices = devices or DeviceManager(config.devices_backend, watch_xids=False)
    try:
        inventory = devices.discover()
    finally:
        devices.close()
    body = register_body(config, inventory, machine_id, config.labels)
    client = make_client(config, urls)
    try:
        try:
            reply = register_when_admitted(client, join_token, body)
        except FleetdError as exc:
            if body.topology is None or not refused_topology(exc):
                raise
            log.warning("fleetd refused the GPU topology (an older fleetd?): %s; without it", exc)
            reply = register_when_admitted(
                client, join_token, dataclasses.replace(body, topology=None)
            )
    finally:
        client.close()
    node = {
        "node_id": reply.node_id,
        "fleet": reply.fleet,
        "server_url": urls[0],  # what agents that know one URL read
        "server_urls": urls,
        "machine_id": machine_id,
        "heartbeat_interval_seconds": reply.heartbeat_interval_seconds,
        "registered_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    state.save_enrolment(node, reply.session_token)
    log.info(
        "enrolled as node %s in fleet %s with %d GPU(s)",
        node["node_id"],
        node["fleet"],
        len(body.gpus),
    )
    return node, True


class Deadlines:
    """What the systemd watchdog checks: each loop promises its next beat before a deadline."""

    def __init__(self):
        self._lock = threading.Lock()
        self._due = {}

    def beat(self, name, next_within):
        """Loop `name` is alive and will beat again within `next_within` seconds."""
        with self._lock:
            self._due[name] = time.monotonic() + next_within

    def all_alive(self):
        """True when no loop has missed its promised beat."""
        now = time.monotonic()
        with self._lock:
            return all(due > now for due in self._due.values())


class Agent:
    """`fleet-agent run`: the service."""

    def __init__(
        self,
        config: Config,
        deregister_on_stop: bool = False,
        stop: threading.Event | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.state = State(config.state_dir)
        self.deregister_on_stop = deregister_on_stop
        self.topology_refused = False  # fleetd refused heartbeats with the GPU topology
        self.stop = stop or threading.Event()
        self.rng = rng or random.Random()
        self.devices = DeviceManager(config.devices_backend)
        self.workers = Workers()
        self.limits = Limits(
            LimitSettings.from_config(config), self.devices, self.workers, config.state_dir
        )
        self.runner: Runner | None = None  # created once enrolled
        # Dynamic MIG: the layouts fleetd asks for, applied, and their results until sent.
        self.mig = MigChanges(self.devices, lambda: held_mig_devices(self.workers, self.runner))
        self.validator: Validator | None = (
            None  # runs the validations fleetd asks for, once enrolled
        )
        self._keeper = None  # the fence keeper's Popen (agent/keeper.py)
        self.lease = LeaseClock(
            self.config.tasks_kill_grace_seconds
        )  # job tasks stop when it runs out
        self.deadlines = Deadlines()
        self.node: dict | None = None  # node.json, once enrolled
        self.session_ok = False  # a heartbeat succeeded with the stored session
        self.fleetd_error = ""  # why the last heartbeat failed, empty when it succeeded
        self.node_status = None
        # What the operator said on this host (local API POST /api/v1/draining,
        # `fleet-agent drain`): sent in every heartbeat once said, so that fleetd cordons the node
        # while it is true; None: never said.
        self.draining = None
        self.exit_code = EXIT_OK
        self._threads: list[threading.Thread] = []
        self._acquire_thread = None
        self._runtime_checked: float | None = (
            None  # monotonic time the container runtime was last looked for
        )
        self.urls: ServerUrls | None = None  # shared by every client, once enrolled

    # Readiness, as /readyz reports it.

    def readiness(self):
        """(ready, details)."""
        details = {
            "devices": "initialised" if self.devices.inventory is not None else "discovering",
            "enrolled": self.node is not None or self.state.enrolled(),
            "session": "ok" if self.session_ok else "not yet confirmed by fleetd",
            "node_id": self.node["node_id"] if self.node else None,
            "node_status": self.node_status,
        }
        if self.fleetd_error:
            details["fleetd_error"] = self.fleetd_error
        if self.urls is not None:
            details["fleetd_url"] = display_url(self.urls.current)
            details["fleetd_urls"] = [display_url(url) for url in self.urls.urls]
        ready = self.devices.inventory is not None and self.session_ok
        return ready, details

    # The service.

    def run(self) -> int:
        """Run until stopped, revoked or rejected; returns the process exit code."""
        self.state.ensure_dir()
        api = LocalApi(self, self.config, self.state.local_api_token())
        api.start()
        log.info(
            "agent %s starting: local API on %s, devices backend %s",
            agent_version(),
            api.url,
            self.config.devices_backend,
        )
        try:
            inventory = self.devices.discover()
            log.info(
                "devices: %d GPU(s)%s",
                len(inventory.devices),
                f" ({inventory.reason})" if inventory.reason else "",
            )
            self._spawn("device-poller", self._poll_devices)
            self._spawn(
                "limits",
                self.limits.run,
                self.stop,
                functools.partial(self.deadlines.beat, "limits"),
            )
            interval = watchdog_interval()
            if interval:
                self._spawn("watchdog", self._watchdog, interval)
            # MAINPID too: systemd knows it already; stand-in service managers (the one containers
            # run, docker-systemctl-replacement) wait seconds for it after READY=1
            sd_notify(
                f"READY=1\nMAINPID={os.getpid()}\nSTATUS=devices discovered; connecting to fleetd"
            )
            if self._wait_for_enrolment():
                self._start_work()
                self.exit_code = self._heartbeat_loop()
        finally:
            self.stop.set()
            sd_notify("STOPPING=1")
            for thread in self._threads:
                thread.join(timeout=10)
            if self.runner is not None:
                revoked = self.exit_code == EXIT_REVOKED  # the one stop that ends instances too
                stopped = self.runner.shutdown(
                    "node revoked" if revoked else "fleet-agent stopped",
                    lost=not revoked,
                    stop_instances=revoked,
                )
                if stopped and self._acquire_thread is not None:
                    self._acquire_thread.join(HAND_BACK_SECONDS)
                stop_keeper(self.state.dir, self._keeper)
            self._leave()
            api.stop()
            self.limits.close()
            self.devices.close()
        log.info("agent stopped (exit %d)", self.exit_code)
        return self.exit_code

    def _spawn(self, name, target, *args, wait_on_stop=True):
        def guarded():
            try:
                target(*args)
            except (
                Exception
            ):  # a bug in a loop must end the service loudly, not leave it half-alive
                log.exception("%s crashed; stopping the agent", name)
                self.exit_code = EXIT_FAILURE
                self.stop.set()

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        if wait_on_stop:
            self._threads.append(thread)
        return thread

    def _poll_devices(self):
        poll = self.config.devices_poll_seconds
        while True:
            self.deadlines.beat("devices", poll + 60)
            if self.stop.wait(poll):
                return
            since = time.monotonic() - (self.devices.discovered_monotonic or 0)
            if since >= self.config.devices_rediscover_seconds:
                self.devices.discover()
            else:
                self.devices.poll()

    def _watchdog(self, interval):
        while not self.stop.wait(interval):
            if self.deadlines.all_alive():
                sd_notify("WATCHDOG=1")
            else:
                log.error("a loop missed its deadline; withholding the systemd watchdog ping")

    def _wait_for_enrolment(self):
        """True once node.json and session.token exist; False if stopped first."""
        logged = False
        while not self.stop.is_set():
            if self.state.enrolled():
                self.node = self.state.node()
                self.urls = ServerUrls(self._server_urls())
                return True
            if not logged:
                log.warning(
                    "not enrolled yet: waiting for `fleet-agent join` to write %s", self.state.dir
                )
                logged = True
            self.deadlines.beat("heartbeat", ENROLMENT_POLL_SECONDS + 30)
            self.stop.wait(ENROLMENT_POLL_SECONDS)
        return False

    def _server_urls(self):
        """fleetd's URLs: the configured ones, else those stored at join."""
        urls = self.config.server_urls or node_server_urls(self.node)
        if not urls:
            raise ConfigError("no fleetd URL: set server_url")
        return urls

    def _enrolled(self) -> tuple[dict, ServerUrls]:
        """(node.json, the shared ServerUrls): _wait_for_enrolment set both before any work
        starts."""
        assert self.node is not None and self.urls is not None, "the work starts once enrolled"
        return self.node, self.urls

    def _working(self) -> Runner:
        """The Runner: _start_work made it before the loops that use it started."""
        assert self.runner is not None, "the runner is made before the loops that use it"
        return self.runner

    def _client(self):
        """A FleetClient (one per thread) on the agent's shared URLs: a switch by one moves all."""
        return make_client(self.config, self.urls, self.state.session_token())

    def _round_seconds(self, call_seconds):
        """The longest one call may take: every URL tried once, each up to `call_seconds`."""
        return call_seconds * (len(self.urls) if self.urls is not None else 1)

    def _retry_delay(self, failures, exc):
        """Seconds to wait after `failures` failed calls in a row, the last one `exc`: the backoff,
        or fleetd's Retry-After where that is longer; either at most backoff_max_seconds."""
        cap = self.config.backoff_max_seconds
        return max(backoff_delay(failures, cap, self.rng), min(exc.retry_after or 0, cap))

    def _start_work(self):
        """Recover from a restart (kill and report what it left running), then start acquiring
        work."""
        _node, urls = self._enrolled()
        address = self.config.address or detect_address(list(urls.urls))
        self.isolation = Isolation()
        self.runner = Runner.from_config(
            self.config,
            self.state.dir,
            self.workers,
            self._client,
            address,
            limits=self.limits,
            isolation=self.isolation,
        )
        log.info("container runtime for instances: %s", self.runner.containers or "none")
        self.validator = Validator(
            self.devices,
            self._client,
            self.isolation,
            self.state.dir,
            self.stop,
            backoff_max=self.config.backoff_max_seconds,
        )
        self.runner.recover()
        self._keeper = start_keeper(self.state.dir, self.limits.cgroups)
        # What start-up built lives as long as the agent: the collector's full passes skip it.
        gc.collect()
        gc.freeze()
        # Not waited for on stop: its long poll can take 30 s to return. An assignment that arrives
        # while the agent stops is handed back, not started (fleetd requeues it, no attempt used).
        self._acquire_thread = self._spawn("acquire", self._acquire_loop, wait_on_stop=False)
        self._spawn("lease", self._lease_loop)

    def _acquire_loop(self):
        """Long-poll fleetd for work: stop the tasks it says to stop, hand each assignment to the
        runner.

        The long poll stays open whatever runs here (the agent takes every assignment fleetd
        places), so a stop (cancel, preemption, a drain's deadline) arrives the moment it is
        decided; the heartbeat's `cancel` repeats it should a reply be lost."""
        runner = self._working()
        client = self._client()
        failures = 0
        batch: int | None = ACQUIRE_BATCH
        try:
            while not self.stop.is_set():
                self.deadlines.beat(
                    "acquire",
                    self._round_seconds(ACQUIRE_WAIT_SECONDS + self.config.request_timeout_seconds)
                    + 30,
                )
                try:
                    assignments, cancel, flush = client.acquire_work(
                        ACQUIRE_WAIT_SECONDS, max_assignments=batch
                    )
                except FleetdError as exc:
                    if batch is not None and exc.status == 400:
                        log.info(
                            "fleetd does not deliver assignments in batches (%s); asking for one "
                            "at a time",
                            exc,
                        )
                        batch = None
                        continue
                    failures += 1
                    delay = self._retry_delay(failures, exc)
                    if failures == 1 or failures % 10 == 0:
                        log.warning(
                            "acquire failed (attempt %d): %s; retrying in %.1fs",
                            failures,
                            exc,
                            delay,
                        )
                    self.deadlines.beat("acquire", delay + 30)
                    self.stop.wait(delay)
                    continue
                failures = 0
                if cancel:  # before the assignments: a stop never concerns a task of this reply
                    runner.cancel(cancel, "cancelled by fleetd")
                if flush:
                    runner.flush_output(flush)
                for assignment in assignments:
                    if self.stop.is_set():
                        # The runner hands it back, as any that comes from now on.
                        runner.closing.set()
                    runner.submit(assignment)
        finally:
            client.close()

    def _heartbeat_loop(self):
        node, urls = self._enrolled()
        client = self._client()
        interval = (
            self.config.heartbeat_interval_seconds
            or node.get("heartbeat_interval_seconds")
            or DEFAULT_HEARTBEAT_SECONDS
        )
        failures = 0
        sent_version = sent_capabilities = None
        # What this agent is (version, bundle, labels): sent until fleetd took it, then again only
        # on change. Labels too: a changed config file (provisioning run again with other labels)
        # reaches fleetd.
        sent_info, info = None, dict(installed_bundle(), labels=dict(self.config.labels))
        log.info(
            "heartbeating to %s as node %s%s",
            display_url(client.base),
            node["node_id"],
            f" (fleetd URLs: {', '.join(map(display_url, urls.urls))})" if len(urls) > 1 else "",
        )
        try:
            while not self.stop.is_set():
                version = self.devices.version
                capabilities = self._capabilities()
                beat = self._heartbeat_body(
                    version != sent_version,
                    capabilities if capabilities != sent_capabilities else None,
                )
                if info != sent_info:
                    beat = dataclasses.replace(beat, **info)
                sent_at = time.monotonic()
                try:
                    reply = client.heartbeat(beat)
                except Rejected as exc:
                    self.session_ok = False
                    log.error(
                        "fleetd rejected this node's session (%s): the node was revoked, deleted "
                        "or enrolled again elsewhere; stopping all work. Re-enrol with "
                        "`fleet-agent join --force`.",
                        exc,
                    )
                    self.workers.stop_all("session rejected by fleetd")
                    return EXIT_REVOKED
                except FleetdError as exc:
                    if beat.topology is not None and refused_topology(exc):
                        log.warning("fleetd refused the GPU topology (%s); not sending it", exc)
                        self.topology_refused = True
                        continue
                    if info != sent_info and exc.status == 422:
                        # A fleetd older than these fields refuses them: go on without.
                        log.warning(
                            "fleetd does not take the agent version in heartbeats (%s); not "
                            "sending it",
                            exc,
                        )
                        sent_info = info
                        continue
                    failures += 1
                    delay = self._retry_delay(failures, exc)
                    self.fleetd_error = str(exc)
                    kind = (
                        "fleetd unreachable"
                        if isinstance(exc, Unreachable)
                        else "heartbeat refused"
                    )
                    left = self.lease.seconds_left()
                    log.warning(
                        "%s (attempt %d): %s; retrying in %.1fs; %s",
                        kind,
                        failures,
                        exc,
                        delay,
                        "running tasks keep running"
                        if left is None
                        else (
                            f"job tasks stop in {max(0.0, left):.0f}s unless fleetd answers (their "
                            f"lease)"
                        ),
                    )
                    self.deadlines.beat(
                        "heartbeat",
                        delay + self._round_seconds(self.config.request_timeout_seconds) + 30,
                    )
                    self.stop.wait(delay)
                    continue
                if failures:
                    log.info("heartbeat restored after %d failed attempt(s)", failures)
                failures = 0
                self.lease.renewed(sent_at, reply.lease_seconds)
                self.mig.sent(beat.mig_events)
                self._tell_keeper()
                sent_version, sent_capabilities, sent_info = version, capabilities, info
                self.fleetd_error = ""
                if not self.session_ok:
                    self.session_ok = True
                    sd_notify("STATUS=connected to fleetd")
                if not self._follow(reply):
                    return EXIT_REVOKED
                if not self.config.heartbeat_interval_seconds:
                    interval = float(reply.heartbeat_interval_seconds)
                delay = jittered(interval, self.rng)
                self.deadlines.beat(
                    "heartbeat",
                    delay + self._round_seconds(self.config.request_timeout_seconds) + 30,
                )
                self.stop.wait(delay)
        finally:
            client.close()
        return EXIT_OK

    def _heartbeat_body(self, send_gpus, capabilities):
        """One Heartbeat (fleetwire.heartbeat): tasks, metrics, volumes, instances, gpus and their
        topology when `send_gpus`, capabilities when given."""
        runner = self._working()
        inventory = self.devices.inventory
        metrics = inventory.metrics()
        limits = self.limits.report()
        metrics["foreign_processes"] = limits["foreign_processes"]
        metrics["limits"] = {
            "polls": limits["polls"],
            "poll_seconds": limits["poll_seconds"],
            "foreign_policy": limits["foreign_policy"],
            "violations": [
                {
                    k: d.get(k)
                    for k in (
                        "task_id",
                        "epoch",
                        "kind",
                        "gpu_uuid",
                        "used",
                        "limit",
                        "detected_at",
                    )
                }
                for d in self.limits.recent_detections()[-20:]
            ],
        }
        return Heartbeat(
            tasks=tuple(self.workers.report()),
            metrics=metrics,
            volumes=tuple(runner.volumes.list()),
            draining=self.draining,
            instances=tuple(runner.instances_report() or ()),
            gpus=tuple(inventory.wire_gpus()) if send_gpus else None,
            topology=wire_topology(inventory) if send_gpus and not self.topology_refused else None,
            capabilities=capabilities,
            mig_events=self.mig.events(),
        )

    def _capabilities(self):
        """{container_runtime, containers, isolation...}: the runtime looked for again every few
        minutes, so that one installed since is used, and probed (`<runtime> info`) each time:
        "ready" or "unavailable: <why>"."""
        runner = self.runner
        assert runner is not None, "the runner is made before the heartbeat loop starts"
        now = time.monotonic()
        if self._runtime_checked is None or now - self._runtime_checked >= RUNTIME_DETECT_SECONDS:
            self._runtime_checked = now
            runtime = ContainerRuntime.detect(self.config.containers_command)
            if repr(runtime) != repr(runner.containers):
                log.info("container runtime: %s", runtime or "none")
                runner.containers = runtime
            if runner.containers is not None:
                runner.containers.probe()
        caps = {
            "container_runtime": runner.containers.name if runner.containers else None,
            "containers": ContainerRuntime.capability(runner.containers),
        }
        caps.update(runner.isolation.capabilities())
        return caps

    def _tell_keeper(self):
        """The new moment job tasks must have stopped by, for the keeper (which acts if this agent
        dies)."""
        fence_at = self.lease.fence_at()
        if fence_at is None or self.runner is None:
            return
        try:
            write_lease(self.state.dir, fence_at)
        except OSError as exc:
            log.warning(
                "cannot write the tasks' lease for the fence keeper: %s", exc.strerror or exc
            )

    def _lease_loop(self):
        """Stop the job tasks once fleetd has not answered a heartbeat for as long as their lease
        (less the margins of agent/lease.py), before fleetd may run their jobs elsewhere; instances
        run on. Its own thread: a heartbeat call blocked on a dead connection must not delay the
        stop."""
        while not self.stop.is_set():
            left = self.lease.seconds_left()
            if self.lease.due() and self.runner is not None:
                reason = (
                    f"fleetd could not be reached for {self.lease.lease_seconds:.0f}s, the tasks' "
                    "lease: stopped so that the job never runs in two places"
                )
                log.error(
                    "%s (%d job task(s))", reason, self.runner.fence_jobs(reason, self.lease.grace)
                )
            self.stop.wait(
                LEASE_CHECK_SECONDS if left is None or left <= 0 else min(left, LEASE_CHECK_SECONDS)
            )

    def _follow(self, reply):
        """Do what a heartbeat's answer (a HeartbeatReply) says; False when the node was revoked
        (the agent exits)."""
        node, _urls = self._enrolled()
        if reply.revoked:
            log.error(
                "node %s was revoked by fleetd: stopping all work and exiting; "
                "re-enrol with a new join token to return",
                node["node_id"],
            )
            self.workers.cancel(list(reply.cancel), "node revoked")
            self.workers.stop_all("node revoked")
            return False
        if reply.cancel:
            self.workers.cancel(list(reply.cancel), "cancelled by fleetd")
        if reply.delete_volumes:
            self._working().delete_volumes(list(reply.delete_volumes))
        if reply.lookup_accounts:  # reported with the next heartbeat's capabilities
            self._working().isolation.look_up(reply.lookup_accounts)
        if reply.mig_layouts:  # applied now; the results and new devices go with the next heartbeat
            self.mig.follow(reply.mig_layouts)
        if reply.validation and self.validator is not None:
            self.validator.want(reply.validation)  # the node validates: run the suite (once)
        if reply.status != self.node_status:
            log.info("node %s status: %s", node["node_id"], reply.status)
            self.node_status = reply.status
        return True

    def _leave(self):
        # Enrolled, but with no fleetd URL (the agent stopped for that) there is no one to tell.
        if not (
            self.deregister_on_stop
            and self.node
            and self.urls is not None
            and self.exit_code == EXIT_OK
        ):
            return
        client = self._client()
        try:
            client.deregister()
            log.info("deregistered node %s from fleetd", self.node["node_id"])
        except FleetdError as exc:
            log.error("could not deregister node %s: %s", self.node["node_id"], exc)
        finally:
            client.close()
