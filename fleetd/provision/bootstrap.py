"""`fleetd bootstrap`: from "I can SSH to these machines" to "they are ready GPU nodes".

Per host, in parallel, each host on its own (one host's failure never stops the others):
connect with strict host-key checking, preflight, install the offline bundle into a venv of its
own beside any other (installs.py), render config and unit from the shared templates, enrol with a
single-use join token minted for that host, enable and start the service, and wait until fleetd
reports the node `ready`. Running it again changes nothing on an enrolled host of the same bundle;
another bundle is an upgrade that fleetd wraps (POST /nodes/{id}/upgrade, then .../upgrade/end):
the node is drained and put back in the state the operator left it in, or kept drained if the
upgrade fails, and a new agent that does not come up is switched back to the install before.
`remove` drains, stops, uninstalls and deletes the node.
"""

import concurrent.futures
import dataclasses
import posixpath
import re
import shlex
import time
import urllib.parse

from fleetd.client import ClientError
from fleetd.provision import installs, rendering
from fleetd.provision.ssh import HostKeyRejected, Remote, SshError

MIN_PYTHON = (3, 10)
POLL_SECONDS = 0.5
JOIN_TOKEN_TTL_SECONDS = 3600
STEPS = ("connect", "preflight", "install", "configure", "enrol", "start", "ready")
REMOVE_STEPS = ("connect", "drain", "stop", "delete", "uninstall")
#: Statuses an upgrade goes through fleetd's upgrade routes from
#: (fleetd.services.nodes.upgrades.UPGRADABLE).
UPGRADABLE = ("ready", "cordoned", "draining", "drained")
#: Where a node of each status before a run is once it is done.
RETURNS_TO = {
    "cordoned": ("cordoned",),
    "draining": ("draining", "drained"),
    "drained": ("draining", "drained"),
    # The validation gate's: a failed node stays so (an operator decides); one validating is left to
    # it.
    "failed_validation": ("failed_validation",),
    "validating": ("validating", "ready", "failed_validation"),
}
AGENT_LOG_LINES = 15


# Where a node that a run waits on stops for good in this run: no wait past it.
_STOPS = {
    "failed_validation": "its validation failed: fix the host, then `fleetd node validate {id}`",
    "revoked": "it was revoked: enrol the host again with a new join token",
    "cordoned": "it was taken out of service (the fleet's health policy, or an operator)",
    "draining": "it is being drained (the fleet's health policy, or an operator)",
    "drained": "it was drained (the fleet's health policy, or an operator)",
}


def stopped_short_of(targets):
    """stop(node) for _poll: why a node waited on to reach one of `targets` never will in this run
    (a terminal status for it), else None."""

    def stop(node):
        status = node["status"]
        if status in targets or status not in _STOPS:
            return None
        if status in ("cordoned", "draining", "drained") and tuple(targets) != ("ready",):
            return None  # on its way to where the run takes it (an upgrade's drain)
        why = node.get("status_reason") or "no reason given"
        hint = _STOPS[status].format(id=node["id"])
        return f"node {node['id']} is {status} ({why}), not {' or '.join(targets)}: {hint}"

    return stop


class HostFailed(Exception):
    """This host cannot be bootstrapped; the message is the reason shown in the final table."""


class InstallStepFailed(HostFailed):
    """The install step failed (a full disk, pip): the agent that runs was not touched, so its log
    says nothing of the cause, which the message gives."""


@dataclasses.dataclass
class BootstrapOptions:
    """What to install and how (everything but SSH, which is `SshOptions`)."""

    fleet: str = ""
    server_url: object = (
        ""  # how agents reach fleetd: a URL, or a list of them (replicas), tried in turn
    )
    bundle: object = None  # fleetd.provision.bundle.Bundle
    python: str = "python3"
    labels: dict = dataclasses.field(default_factory=dict)
    devices_backend: str = "nvml"
    tls_pin: str = ""
    ca_pem: str = ""  # contents of a CA bundle to install as <config_dir>/ca.pem
    install_dir: str = "/opt/fleet-agent"
    config_dir: str = "/etc/fleet-agent"
    state_dir: str = "/var/lib/fleet-agent"
    unit_dir: str = "/etc/systemd/system"
    wait_timeout: float = 180.0
    drain_deadline: int = 3600
    min_free_mb: int = 512
    keep_versions: int = installs.KEEP_VERSIONS  # installs kept on a host (installs.py)
    command_timeout: float = 600.0
    allow_downgrade: bool = False
    force_remove: bool = (
        False  # remove: drain and delete the node in fleetd when the host cannot be reached
    )
    check_server_url: bool = True  # preflight: can the host reach fleetd's /api/v1/health?
    # A rollout's upgrade of an enrolled node (fleetd.provision.rollout): the host must be that node
    # (it never enrols), and its config and unit stay as they are (rewriting them is bootstrap's
    # job).
    upgrade_only: bool = False
    readmit: bool = False  # enrol a host whose node was revoked again, under its old id
    # The fleet has a validation gate: an upgraded node passes its suite before it is back in
    # service.
    validate: bool = False
    validation_timeout: float = 3600.0

    @property
    def server_urls(self):
        """The agents' fleetd URLs as a list (TemplateError for a bad one)."""
        return rendering.server_urls(self.server_url)

    @property
    def unit_path(self):
        return posixpath.join(self.unit_dir, rendering.UNIT_NAME)

    @property
    def config_path(self):
        return posixpath.join(self.config_dir, "agent.toml")

    def template_values(self):
        """The template variables for this run."""
        return rendering.template_vars(
            server_url=self.server_url,
            labels=self.labels,
            devices_backend=self.devices_backend,
            tls_pin=self.tls_pin,
            ca_file=posixpath.join(self.config_dir, "ca.pem") if self.ca_pem else "",
            install_dir=self.install_dir,
            config_dir=self.config_dir,
            state_dir=self.state_dir,
            unit_dir=self.unit_dir,
        )


@dataclasses.dataclass
class HostResult:
    """One row of the final table."""

    host: str
    result: str = (
        "failed"  # enrolled | upgraded | downgraded | updated | unchanged | removed | failed
    )
    node_id: str = ""
    gpus: int | None = None
    reason: str = ""
    preflight: str = ""
    version: str = ""
    validation: str = ""  # an upgrade in a gated fleet: "passed", or why it did not run

    @property
    def ok(self):
        return self.result != "failed"

    def to_dict(self):
        return dataclasses.asdict(self)


def parse_facts(text):
    """key=value lines of fleet-agent-facts.sh -> dict."""
    facts = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[a-z_0-9]+", key):
            facts[key] = value.strip()
    if "facts_version" not in facts:
        raise HostFailed(
            "the host's facts script printed nothing usable: " + (text.strip()[:200] or "(empty)")
        )
    return facts


def _version_tuple(text):
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def is_downgrade(installed, new):
    """True when version `new` is older than `installed` (PEP 440; digits only for odd strings)."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging comes with pip and setuptools
        return _version_tuple(new) < _version_tuple(installed)
    try:
        return Version(new) < Version(installed)
    except InvalidVersion:
        return _version_tuple(new) < _version_tuple(installed)


def install_plan(facts, bundle, allow_downgrade=False):
    """(install, upgrade): whether the bundle must be installed, and whether that replaces another
    installed bundle (an upgrade, wrapped in drain and undrain). The same version with another
    SHA-256 (a rebuilt bundle) is installed too; an older version only with allow_downgrade."""
    installed = facts.get("installed_version", "")
    if installed == bundle.version and facts.get("installed_sha256", "") == bundle.sha256:
        return False, False
    if installed and not allow_downgrade and is_downgrade(installed, bundle.version):
        raise HostFailed(
            f"refusing to downgrade fleet-agent {installed} to {bundle.version} (bundle "
            f"{bundle.path.name}); give --allow-downgrade to do it anyway"
        )
    return True, bool(installed)


def operator_reason(node):
    """Why an operator drained or cordoned a node, as fleetd says."""
    node = node or {}
    return (node.get("drain") or {}).get("reason") or node.get("status_reason") or "no reason given"


def first_cause(text, limit=300):
    """The real cause of a failed command first: its last line (the error), then what came before
    (warnings such as NVML's), so a leading warning never hides it."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    cause = lines[-1]
    before = " | ".join(lines[:-1])
    return (cause + (f" (before it: {before})" if before else ""))[:limit]


def judge_preflight(facts, options):
    """(problems, summary): what stops the install, and a one-line verdict for the operator."""
    problems, parts = [], []
    if facts.get("uid") != "0":
        problems.append(f"not root (uid {facts.get('uid', '?')}): use --sudo or log in as root")
    python = facts.get("python", "")
    if not python:
        problems.append(
            f"no {options.python} on the host (Python >= {'.'.join(map(str, MIN_PYTHON))} needed)"
        )
    elif _version_tuple(python) < MIN_PYTHON:
        problems.append(f"Python {python} < {'.'.join(map(str, MIN_PYTHON))}")
    else:
        parts.append(f"Python {python}")
        if facts.get("python_venv") != "yes":
            problems.append(f"Python {python} has no venv module (install python3-venv)")
        if options.bundle is not None:
            why = options.bundle.supports(python, facts.get("arch", ""))
            if why:
                problems.append(why)
    if facts.get("systemctl") != "yes":
        problems.append("no systemd (systemctl not found)")
    elif facts.get("systemd_running") == "yes":
        parts.append("systemd")
    else:
        parts.append("systemctl without systemd as PID 1 (a stand-in)")
    free_kb = facts.get("disk_free_kb", "")
    if free_kb.isdigit():
        free_mb = int(free_kb) // 1024
        parts.append(f"{free_mb / 1024:.1f} GiB free for {options.install_dir}")
        if free_mb < options.min_free_mb:
            problems.append(
                f"only {free_mb} MiB free for {options.install_dir} (need {options.min_free_mb} "
                f"MiB)"
            )
    else:
        problems.append(f"cannot tell the free disk space for {options.install_dir}")
    driver = facts.get("nvidia_driver", "")
    if driver:
        gpus = facts.get("nvidia_gpus") or "?"
        parts.append(f"NVIDIA driver {driver} ({gpus} GPU(s))")
    elif options.devices_backend.startswith("fake:"):
        parts.append(f"no NVIDIA driver; fake GPUs from {options.devices_backend[5:]}")
    else:
        parts.append("no NVIDIA driver: CPU-only")
    if options.check_server_url and "fleetd_reachable" in facts and python:
        if facts["fleetd_reachable"]:
            parts.append(f"reaches fleetd at {facts['fleetd_reachable']}")
        else:
            problems.append(
                f"the host cannot reach fleetd at {', '.join(options.server_urls)}: "
                f"{facts.get('fleetd_unreachable') or 'no answer'} (is --server-url the URL the "
                "hosts reach fleetd at?)"
            )
    verdict = "ok" if not problems else "FAILED: " + "; ".join(problems)
    return problems, f"{verdict} ({', '.join(parts)})" if parts else verdict


class Bootstrapper:
    """Runs bootstrap or removal on many hosts in parallel; `progress(host, step, message)`
    reports."""

    def __init__(
        self, client, options, ssh_options, progress=None, clock=time.monotonic, sleep=time.sleep
    ):
        self.client = client
        self.options = options
        self.ssh = ssh_options
        self.progress = progress or (lambda host, step, message: None)
        self.clock = clock
        self.sleep = sleep

    # ------------------------------------------------------------------ orchestration

    def run(self, specs, parallel=10, remove=False):
        """Bootstrap (or remove) every host; returns HostResults in the order of `specs`."""
        work = self.remove_host if remove else self.bootstrap_host
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, min(parallel, len(specs)))
        ) as pool:
            futures = [pool.submit(self._guarded, work, spec, not remove) for spec in specs]
            return [f.result() for f in futures]

    def _guarded(self, work, spec, record):
        result = HostResult(host=str(spec))
        try:
            work(spec, result)
        except (HostFailed, SshError, ClientError, rendering.TemplateError) as exc:
            result.result = "failed"
            result.reason = (
                str(exc) if not isinstance(exc, ClientError) else f"fleetd: {exc.message}"
            )
        except (
            Exception
        ) as exc:  # one host's surprise must never sink the others; it is reported, not hidden
            result.result = "failed"
            result.reason = f"unexpected {type(exc).__name__}: {exc}"
        # A run that changed nothing (`unchanged`) is no event of the node: reruns (a Terraform
        # apply, a cron) would bury the runs that did something.
        if record and result.node_id and result.result != "unchanged":
            self._record_run(result)
        self.progress(
            result.host, "done" if result.ok else "failed", result.reason or result.result
        )
        return result

    def _record_run(self, result):
        """The run as an event of its node: the host, the bundle's version and sha256, the outcome
        (fleetd names the host by the node's hostname). A fleetd that cannot take it costs a note in
        the result, never the run."""
        bundle = self.options.bundle
        body = {
            "kind": "node.bootstrap",
            "host": result.host[:255],
            "outcome": result.result,
            "bundle_version": bundle.version if bundle is not None else "",
            "bundle_sha256": bundle.sha256 if bundle is not None else "",
            "detail": result.reason[:1000],
        }
        try:
            self.client.post(f"/api/v1/nodes/{result.node_id}/events", body)
        except ClientError as exc:
            result.reason += f"; this run was not recorded on node {result.node_id} ({exc.message})"

    # ------------------------------------------------------------------ one host

    def _connect(self, spec, result):
        self.progress(result.host, "connect", "connecting")
        try:
            return Remote(spec, self.ssh).open()
        except HostKeyRejected as exc:
            raise HostFailed(str(exc)) from None

    def _facts(self, remote, check_urls=False):
        options = self.options
        args = [
            options.python,
            options.install_dir,
            options.config_dir,
            options.state_dir,
            options.unit_path,
        ]
        if check_urls and options.check_server_url:
            args.append(",".join(options.server_urls))
        _, out, _ = remote.run_script(rendering.script(rendering.FACTS_SCRIPT), args, timeout=120)
        return parse_facts(out)

    def bootstrap_host(self, spec, result):
        """Install, configure, enrol and start the agent on one host; fills `result`."""
        options = self.options
        remote = self._connect(spec, result)
        try:
            self.progress(result.host, "preflight", "checking the host")
            facts = self._facts(remote, check_urls=True)
            problems, result.preflight = judge_preflight(facts, options)
            self.progress(result.host, "preflight", result.preflight)
            if problems:
                raise HostFailed("preflight: " + "; ".join(problems))

            node = self._enrolled_node(facts)
            if node is not None:
                result.node_id = node["id"]
            expected = getattr(spec, "node_id", None)  # a rollout's host names the node it must be
            if options.upgrade_only and (node is None or (expected and node["id"] != expected)):
                raise HostFailed(
                    f"the host is not enrolled as node {expected or '?'} of fleet {options.fleet} "
                    f"(its node.json says {facts.get('node_id') or 'nothing'}): a rollout upgrades "
                    "enrolled nodes only; left untouched"
                )
            install, upgrade = install_plan(facts, options.bundle, options.allow_downgrade)
            # An upgrade that failed before (node.upgrade still set) ends with this run, installing
            # or not.
            upgrading = node is not None and (
                (node["status"] in UPGRADABLE and install and upgrade)
                or node.get("upgrade") is not None
            )
            if upgrading:
                node = self._begin_upgrade(node, facts, install, result)
            switched = installs.Switched()
            try:
                self._bootstrap_after_drain(
                    remote, facts, node, install, upgrade, upgrading, result, switched
                )
            except (HostFailed, SshError, ClientError, rendering.TemplateError) as exc:
                if not upgrading and not switched.pending:
                    raise
                reason = str(exc) if not isinstance(exc, ClientError) else f"fleetd: {exc.message}"
                if not isinstance(exc, InstallStepFailed):
                    reason += self._agent_log(remote)
                if switched.pending:
                    reason += self._switch_back(remote, facts, switched, result)
                if not upgrading:
                    raise HostFailed(reason) from None
                raise HostFailed(
                    f"{reason}; {self._fail_upgrade(node['id'], reason, result)}"
                ) from None
        finally:
            remote.close()

    def _begin_upgrade(self, node, facts, install, result):
        """Tell fleetd an upgrade begins: it remembers the node's state and drains a ready or
        cordoned node (an operator's drain stays); wait until the node is drained. Returns the node
        as it was."""
        options = self.options
        installed = facts.get("installed_version", "")
        verb = (
            "downgrading"
            if install and is_downgrade(installed, options.bundle.version)
            else "upgrading"
        )
        if not install:
            what = f"{installed} (ending the upgrade that failed before)"
        elif installed != options.bundle.version:
            what = f"{installed} -> {options.bundle.version}"
        else:
            what = (
                f"{installed} (rebuilt bundle of the same version, sha256 "
                f"{options.bundle.sha256[:12]})"
            )
        reason = f"fleetd bootstrap: {verb} the agent {what}"
        if node["status"] not in UPGRADABLE and not (
            node["status"] == "lost" and node.get("upgrade") is not None
        ):
            return node
        # Lost (its agent died in the upgrade that failed): fleetd keeps the record it holds and
        # takes this run as the upgrade's retry (the failure is no longer open: the node may be
        # validated as part of it).
        self.progress(
            result.host,
            "install",
            f"draining node {node['id']} for the upgrade: {reason}"
            if node["status"] in ("ready", "cordoned")
            else reason,
        )
        self.client.post(
            f"/api/v1/nodes/{node['id']}/upgrade",
            {"reason": reason, "deadline_seconds": options.drain_deadline},
        )
        # lost: the agent of an upgrade that failed before went silent since the node was read; it
        # is out of service all the same, and fleetd kept the upgrade's record.
        self._poll(
            node["id"],
            lambda n: n["status"] in ("drained", "lost"),
            options.drain_deadline + 60,
            "drained",
        )
        return node

    def _agent_log(self, remote):
        """The last lines the agent logged ('' when there are none), for a failure's message."""
        try:
            _, out, _ = remote.run_script(
                rendering.script(rendering.LOG_SCRIPT), [AGENT_LOG_LINES], timeout=60
            )
        except (SshError, rendering.TemplateError):
            return ""
        lines = [line.strip() for line in out.splitlines() if line.strip()][-AGENT_LOG_LINES:]
        return f" (the agent's log ends: {' | '.join(lines)[-1500:]})" if lines else ""

    def _fail_upgrade(self, node_id, reason, result):
        """Tell fleetd the upgrade failed: the node stays out of service, its reason naming the
        failure. Says what became of the node."""
        self.progress(
            result.host, "failed", f"the upgrade of node {node_id} failed; it stays out of service"
        )
        try:
            now = self.client.post(
                f"/api/v1/nodes/{node_id}/upgrade/end",
                {"outcome": "failed", "detail": reason[:1000]},
            )
        except ClientError as exc:
            return f"node {node_id}: fleetd did not take the failed upgrade ({exc.message})"
        kept = (now.get("upgrade") or {}).get("returns_to") or {}
        return (
            f"node {node_id} stays out of service (upgrade failed; it is {now.get('status')}): fix "
            f"the agent and run again, which returns it to {kept.get('status') or 'its state'}, or "
            f"undrain it"
        )

    def _switch_back(self, remote, facts, switched, result):
        """The new agent did not come up: point current back at the install before it, restart the
        agent there and wait for its heartbeat. Says what became of the host."""
        old = f"fleet-agent {facts.get('installed_version') or '(the install before)'}"
        self.progress(
            result.host, "start", f"the new agent did not come up: switching back to {old}"
        )
        try:
            why = installs.switch_back(remote, self.options.install_dir, switched)
            if why:
                return f"; switching back to {old} failed too ({why})"
            before = self._node(result.node_id) if result.node_id else None
            remote.run_script(
                "set -e\nsystemctl daemon-reload\nsystemctl restart fleet-agent.service\n",
                timeout=180,
            )
        except (SshError, ClientError, rendering.TemplateError) as exc:
            return f"; switching back to {old} failed too ({getattr(exc, 'message', exc)})"
        if before is not None:
            last, sha = before.get("last_heartbeat_at"), facts.get("installed_sha256")
            try:
                self._poll(
                    result.node_id,
                    lambda n: n.get("last_heartbeat_at") != last and n.get("bundle_sha256") == sha,
                    self.options.wait_timeout,
                    f"heartbeating on {old}",
                )
            except (HostFailed, ClientError) as exc:
                return f"; switched back to {old} and restarted it, but {exc}"
        return f"; switched back to {old}, which runs again"

    def _bootstrap_after_drain(
        self, remote, facts, node, install, upgrade, upgrading, result, switched
    ):
        options = self.options
        previous = node["status"] if node is not None else None
        if node is not None and node.get("upgrade"):
            previous = node["upgrade"]["returns_to"]["status"]
        installed = facts.get("installed_version", "")
        changed = []
        if install:
            self.progress(
                result.host,
                "install",
                f"installing fleet-agent {options.bundle.version}"
                + (f" beside {installed}" if installed else ""),
            )
            unit_rewritten = self._install(remote, switched)
            changed.append(
                ("downgraded" if is_downgrade(installed, options.bundle.version) else "upgraded")
                if upgrade
                else "installed"
            )
        else:
            self.progress(result.host, "install", f"fleet-agent {installed} already installed")
            unit_rewritten = False
            if installed and not facts.get("install_current") and not options.upgrade_only:
                # An install of the older layout gets the link the unit written below goes through.
                try:
                    installs.adopt(remote, options.install_dir)
                except installs.InstallFailed as exc:
                    raise InstallStepFailed(str(exc)) from None
        result.version = options.bundle.version

        if options.upgrade_only:
            self.progress(result.host, "configure", "config and unit kept as they are")
            unit_changed = False
        else:
            self.progress(result.host, "configure", "rendering config and unit")
            unit_changed = self._configure(remote, facts, self.options.template_values(), changed)

        if node is None:
            stale = bool(facts.get("node_id"))
            self.progress(
                result.host,
                "enrol",
                "enrolling with a single-use join token"
                + (" (the stored node is gone, revoked or elsewhere)" if stale else ""),
            )
            self._enrol(remote, result)
            changed.append("enrolled")
        else:
            result.node_id = node["id"]
            self.progress(result.host, "enrol", f"already enrolled as node {node['id']}")

        restart = bool(changed)
        active = facts.get("service_active") == "active"
        self.progress(
            result.host,
            "start",
            "restarting fleet-agent"
            if active and restart
            else "fleet-agent already running"
            if active
            else "starting fleet-agent",
        )
        before = self._node(result.node_id)
        action = self._start(
            remote, facts, restart=restart, reload_units=unit_changed or unit_rewritten
        )
        if action:
            changed.append(action)
        else:
            before = None  # nothing restarted: no fresh heartbeat to wait for

        if previous == "validating":
            self.progress(
                result.host,
                "ready",
                f"waiting for node {result.node_id} to heartbeat; it is validating "
                "(its validation decides where it goes)",
            )
        elif previous in ("draining", "drained", "cordoned", "failed_validation"):
            self.progress(
                result.host,
                "ready",
                f"waiting for node {result.node_id} to heartbeat; it stays "
                f"{previous} as an operator left it ({operator_reason(node)})",
            )
        else:
            self.progress(result.host, "ready", f"waiting for node {result.node_id} to be ready")
        node_now = self._wait_ready(result, before, upgrading, previous, switched)
        if upgrading and not install:
            # The host was right already (an upgrade switched back to it, or fixed by hand): what
            # this run changed is the node's, in fleetd.
            changed.append("ended the upgrade that failed before")
        result.gpus = len(node_now.get("gpus") or [])
        if "enrolled" in changed:
            result.result = "enrolled"
        elif "upgraded" in changed or "downgraded" in changed:
            result.result = "downgraded" if "downgraded" in changed else "upgraded"
        elif changed:
            result.result = "updated"
        else:
            result.result = "unchanged"
        result.reason = ", ".join(changed) if changed else "already installed, configured and ready"
        if result.validation:
            result.reason += f"; validation {result.validation}"
        if previous in ("draining", "drained"):
            result.reason += (
                f"; node stays {node_now['status']} as an operator left it "
                f"({operator_reason(node)})"
            )
        elif previous == "cordoned":
            result.reason += "; node stays cordoned as an operator left it"
        if switched.installed:
            self._prune(remote, result)

    def _prune(self, remote, result):
        """The new agent answered: remove the installs beyond the last keep_versions. A failure is
        a note in the result, never the run's."""
        try:
            removed, why = installs.prune(
                remote, self.options.install_dir, self.options.keep_versions
            )
        except (SshError, rendering.TemplateError) as exc:
            removed, why = [], str(exc)
        if removed:
            self.progress(result.host, "ready", f"removed older installs: {', '.join(removed)}")
        if why:
            result.reason += f"; older installs stay ({why})"

    def _node(self, node_id):
        try:
            return self.client.get(f"/api/v1/nodes/{node_id}")
        except ClientError as exc:
            if exc.status == 404:
                return None
            raise

    def _enrolled_node(self, facts):
        """The fleetd node this host is enrolled as, or None if it must enrol (again)."""
        node_id = facts.get("node_id")
        if not node_id:
            return None
        # node.json of an agent that knows several URLs lists them all (node_server_urls); an older
        # one holds one. Another fleetd (no URL in common) means enrolling again; a list that only
        # gained or lost replicas of the same one does not (the rewritten config brings it).
        stored = {
            u.strip().rstrip("/").lower()
            for u in (facts.get("node_server_urls") or facts.get("node_server_url", "")).split(",")
            if u.strip()
        }
        # A rollout (upgrade_only) never enrols: the node its fleetd knows it as is the one it
        # checks.
        if (
            stored
            and not self.options.upgrade_only
            and not stored & {u.lower() for u in self.options.server_urls}
        ):
            return None
        node = self._node(node_id)
        if node is not None and node["status"] == "revoked" and not self.options.readmit:
            # A revoke is an operator's decision: a routine rerun must not undo it.
            why = node.get("status_reason") or "no reason given"
            raise HostFailed(
                f"node {node_id} of this host was revoked ({why}): a rerun does not admit it "
                "again; give --readmit to enrol the host again (under its old node id, with a new "
                "join token)"
            )
        if node is None or node["status"] == "revoked" or node.get("fleet") != self.options.fleet:
            return None
        return node

    def _install(self, remote, switched):
        """Install the bundle beside what runs and switch to it (installs.install); fills
        `switched`. Returns whether the unit was rewritten for this layout."""
        options = self.options
        try:
            done, unit_rewritten = installs.install(
                remote,
                options.bundle,
                options.python,
                options.install_dir,
                options.unit_path,
                options.command_timeout,
            )
        except installs.InstallFailed as exc:
            raise InstallStepFailed(str(exc)) from None
        switched.previous, switched.installed = done.previous, done.installed
        return unit_rewritten

    def _configure(self, remote, facts, values, changed):
        """Write config, CA and unit where they differ; returns whether the unit changed."""
        options = self.options
        config = rendering.render_config(values)
        unit = rendering.render_unit(values)
        files = []
        if facts.get("config_sha256") != rendering.sha256_text(config):
            files.append((config, options.config_path, "0644"))
        if options.ca_pem:
            files.append((options.ca_pem, posixpath.join(options.config_dir, "ca.pem"), "0644"))
        unit_changed = facts.get("unit_sha256") != rendering.sha256_text(unit)
        if unit_changed:
            files.append((unit, options.unit_path, "0644"))
        if not files:
            return False
        _, tmp, _ = remote.run("mktemp -d", timeout=60)
        tmp = tmp.strip()
        try:
            commands = [
                f"install -d -m 0755 {shlex.quote(options.config_dir)} "
                f"{shlex.quote(options.unit_dir)}"
            ]
            written = []
            for index, (text, target, mode) in enumerate(files):
                staged = posixpath.join(tmp, f"{index}.staged")
                remote.put_text(text, staged)
                # cmp: a CA bundle that is already there unchanged is not a change.
                commands.append(
                    f"if ! cmp -s {shlex.quote(staged)} {shlex.quote(target)}; then "
                    f"install -m {mode} {shlex.quote(staged)} {shlex.quote(target)} && "
                    f"echo wrote={shlex.quote(target)}; fi"
                )
                written.append(target)
            _, out, _ = remote.run_script("set -e\n" + "\n".join(commands) + "\n", timeout=120)
        finally:
            remote.run(f"rm -rf {shlex.quote(tmp)}", timeout=60, check=False)
        wrote = [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("wrote=")]
        if wrote:
            changed.append("configured")
        return options.unit_path in wrote

    def _enrol(self, remote, result):
        options = self.options
        token = self.client.post(
            f"/api/v1/fleets/{options.fleet}/join-tokens",
            {
                "ttl_seconds": JOIN_TOKEN_TTL_SECONDS,
                "max_uses": 1,
                "description": f"fleetd bootstrap {result.host}"[:200],
            },
        )
        agent = posixpath.join(options.install_dir, "current", "bin", "fleet-agent")
        # The token travels on stdin into the environment of `fleet-agent join`: never in an
        # argument. --force: this host was found not to be validly enrolled, whatever credentials it
        # still has.
        join = (
            f"FLEET_AGENT_JOIN_TOKEN=$(head -n 1) exec {shlex.quote(agent)} join --force --server "
            f"{shlex.quote(','.join(options.server_urls))} --config "
            f"{shlex.quote(options.config_path)}"
        )
        command = remote.privileged("sh -c " + shlex.quote(join))
        try:
            code, out, err = remote.run(
                command, stdin=token["token"] + "\n", timeout=120, check=False
            )
        finally:
            token["token"] = None
        if code != 0:
            self._revoke_token(token["id"])
            raise HostFailed(
                f"fleet-agent join failed (exit {code}): {first_cause(err.strip() or out)}"
            )
        match = re.search(r"enrolled as node (\S+)", out)
        if not match:
            raise HostFailed(f"fleet-agent join did not say which node: {out.strip()[-200:]}")
        result.node_id = match.group(1)

    def _revoke_token(self, token_id):
        try:
            self.client.delete(f"/api/v1/join-tokens/{token_id}")
        except ClientError:
            pass  # already used or expired: nothing is left to revoke

    def _start(self, remote, facts, restart, reload_units):
        """Enable, and start or restart the service as needed; returns "started", "restarted" or
        None."""
        commands, action = [], None
        if reload_units:
            commands.append("systemctl daemon-reload")
        enable = facts.get("service_enabled") != "enabled"
        if facts.get("service_active") != "active":
            commands.append(
                "systemctl enable --now fleet-agent.service"
                if enable
                else "systemctl start fleet-agent.service"
            )
            action = "started"
            enable = False
        if enable:
            commands.append("systemctl enable fleet-agent.service")
        if restart and action is None:
            commands.append("systemctl restart fleet-agent.service")
            action = "restarted"
        if commands:
            remote.run_script("set -e\n" + "\n".join(commands) + "\n", timeout=180)
        return action

    # ------------------------------------------------------------------ fleetd side

    def _poll(self, node_id, done, timeout, what, stop=None):
        """Poll the node until done(node) is truthy; returns the node. Bounded in time and count.
        `stop(node)`: why the node will not get there in this run (HostFailed at once), or None."""
        deadline = self.clock() + timeout
        node = None
        for _ in range(int(timeout / POLL_SECONDS) + 2):
            node = self._node(node_id)
            if node is not None and done(node):
                return node
            why = stop(node) if stop is not None and node is not None else None
            if why:
                raise HostFailed(why)
            if self.clock() >= deadline:
                break
            self.sleep(POLL_SECONDS)
        state = (
            "gone"
            if node is None
            else f"{node['status']} ({node.get('status_reason') or 'no reason given'})"
        )
        raise HostFailed(f"node {node_id} not {what} after {timeout:.0f}s: it is {state}")

    def _drain(self, node, reason, result, step="install"):
        """Drain the node and wait until it is drained (an operator's drain is waited for, not
        redone)."""
        if node["status"] in ("drained", "lost"):
            return
        if node["status"] != "draining":
            self.progress(result.host, step, f"draining node {node['id']}: {reason}")
            self.client.post(
                f"/api/v1/nodes/{node['id']}/drain",
                {"reason": reason, "deadline_seconds": self.options.drain_deadline},
            )
        self._poll(
            node["id"],
            lambda n: n["status"] == "drained",
            self.options.drain_deadline + 60,
            "drained",
        )

    def _wait_ready(self, result, before, upgrading, previous, switched=None):
        """Wait for a fresh heartbeat after a (re)start, end the upgrade when there is one (fleetd
        puts the node back where it was, in one step), and wait for the node to be there: ready, or
        cordoned or drained when an operator had put it there."""
        switched = switched if switched is not None else installs.Switched()
        timeout = self.options.wait_timeout
        if before is not None:
            last = before.get("last_heartbeat_at")
            self._poll(
                result.node_id,
                lambda n: (
                    n.get("last_heartbeat_at")
                    and n["last_heartbeat_at"] != last
                    and n["status"] not in ("lost", "pending")
                ),
                timeout,
                "heartbeating after the restart",
            )
        if (upgrading or switched.pending) and before is not None and self.options.bundle:
            # Validate: the restarted agent runs the new bundle (it reports it at its first
            # heartbeat). Until then a failure switches back to the install before.
            sha = self.options.bundle.sha256
            self._poll(
                result.node_id,
                lambda n: n.get("bundle_sha256") == sha,
                timeout,
                f"running bundle {sha[:12]} after the restart",
            )
        switched.answered = True
        if upgrading and before is not None and self.options.validate:
            self._validate(result)
        if upgrading:
            self.progress(
                result.host,
                "ready",
                f"ending the upgrade: node {result.node_id} goes back to {previous}",
            )
            bundle = self.options.bundle
            detail = (
                f"fleet-agent {bundle.version} (bundle sha256 {bundle.sha256[:12]})"
                if bundle
                else ""
            )
            self.client.post(
                f"/api/v1/nodes/{result.node_id}/upgrade/end",
                {"outcome": "succeeded", "detail": detail},
            )
        targets = RETURNS_TO.get(previous, ("ready",))
        return self._poll(
            result.node_id,
            lambda n: n["status"] in targets,
            timeout,
            " or ".join(targets),
            stop=stopped_short_of(targets),
        )

    def _validate(self, result):
        """Run the fleet's validation suite on the upgraded node while it is still out of service
        (POST /nodes/{id}/validate; it comes back drained once it passes). HostFailed when it
        fails."""
        self.progress(
            result.host, "ready", f"validating node {result.node_id} (its fleet's validation suite)"
        )
        try:
            self.client.post(f"/api/v1/nodes/{result.node_id}/validate")
        except ClientError as exc:
            if exc.status != 409:
                raise
            # An operator's drain whose tasks still run: no validation now; the node stays out of
            # service.
            result.validation = f"not run ({exc.message})"
            return
        node = self._poll(
            result.node_id,
            lambda n: n["status"] != "validating",
            self.options.validation_timeout,
            "through its validation",
        )
        if node["status"] == "failed_validation":
            raise HostFailed(f"validation failed: {node.get('status_reason') or 'no reason given'}")
        result.validation = "passed"

    # ------------------------------------------------------------------ removal

    def remove_host(self, spec, result):
        """Drain, stop, uninstall and delete the node of one host; fills `result`."""
        options = self.options
        try:
            remote = self._connect(spec, result)
        except (HostFailed, SshError) as exc:
            if isinstance(exc, HostKeyRejected) or "host key" in str(exc).lower():
                raise  # a refused host key is never "unreachable": that host may be an impostor
            if not options.force_remove:
                raise HostFailed(
                    f"{exc}; if the host is gone for good, --remove --force drains and deletes its "
                    "node in fleetd without touching the host"
                ) from None
            self._remove_unreachable(spec, result, exc)
            return
        try:
            facts = self._facts(remote)
            if facts.get("uid") != "0":
                raise HostFailed(
                    f"not root (uid {facts.get('uid', '?')}): use --sudo or log in as root"
                )
            node_id = facts.get("node_id") or ""
            node = self._node(node_id) if node_id else None
            result.node_id = node_id
            if node is not None:
                result.gpus = len(node.get("gpus") or [])
                if node["status"] not in ("drained", "lost", "revoked", "pending"):
                    self._drain(
                        node, "removing the host (fleetd bootstrap --remove)", result, step="drain"
                    )
            self.progress(result.host, "stop", "stopping and disabling fleet-agent")
            unit = shlex.quote(options.unit_path)
            remote.run_script(
                f"if command -v systemctl >/dev/null 2>&1 && [ -e {unit} ]; then\n"
                "    systemctl disable --now fleet-agent.service || systemctl stop "
                "fleet-agent.service\n"
                "fi\n",
                timeout=180,
            )
            # Right after the agent stops, before fleetd could declare the silent node lost.
            if node is not None:
                self.progress(result.host, "delete", f"deleting node {node_id}")
                self._delete_node(node_id)
            remote.run_script(uninstall_script(options), timeout=180)
            self.progress(result.host, "uninstall", "removed the agent, its config, state and unit")
            result.result = "removed"
            result.reason = (
                f"node {node_id} drained and deleted"
                if node is not None
                else "no enrolled node found; the agent's files were removed"
            )
        finally:
            remote.close()

    def _delete_node(self, node_id):
        try:
            self.client.delete(f"/api/v1/nodes/{node_id}")
        except ClientError as exc:
            if exc.status != 404:
                raise

    def _remove_unreachable(self, spec, result, why):
        """--remove --force on a host SSH cannot reach: drain and delete its node in fleetd only."""
        self.progress(
            result.host,
            "connect",
            f"unreachable ({why}); --force: removing its node in fleetd only",
        )
        nodes = self._nodes_of_host(spec.host)
        if not nodes:
            raise HostFailed(
                f"{why}; --force: fleetd has no node with address or hostname {spec.host}"
            )
        if len(nodes) > 1:
            raise HostFailed(
                f"{why}; --force: {len(nodes)} nodes have address or hostname {spec.host} "
                f"({', '.join(n['id'] for n in nodes)}): delete the right one with `fleetd node "
                f"delete`"
            )
        node = nodes[0]
        result.node_id = node["id"]
        result.gpus = len(node.get("gpus") or [])
        if node["status"] not in ("drained", "lost", "revoked", "pending"):
            self.progress(result.host, "drain", f"draining node {node['id']}")
            try:
                self.client.post(
                    f"/api/v1/nodes/{node['id']}/drain",
                    {
                        "reason": (
                            "removing an unreachable host (fleetd bootstrap --remove --force)"
                        ),
                        "deadline_seconds": self.options.drain_deadline,
                    },
                )
            except ClientError as exc:
                if exc.status != 409:  # already draining or drained, or lost meanwhile
                    raise
            # A dead agent reports no finished tasks: the drain ends at its deadline, or the node is
            # lost.
            self._poll(
                node["id"],
                lambda n: n["status"] in ("drained", "lost"),
                self.options.drain_deadline + 60,
                "drained or lost",
            )
        self.progress(result.host, "delete", f"deleting node {node['id']}")
        self._delete_node(node["id"])
        result.result = "removed"
        result.reason = (
            f"host unreachable ({why}); --force: node {node['id']} drained and deleted in fleetd, "
            "nothing on the host was touched"
        )

    def _nodes_of_host(self, host):
        """Nodes whose address or hostname is `host` (pages bounded)."""
        found, cursor = [], None
        for _ in range(1000):
            page = self.client.get(
                "/api/v1/nodes" + (f"?cursor={urllib.parse.quote(cursor)}" if cursor else "")
            )
            found += [
                n for n in page.get("items", []) if host in (n.get("address"), n.get("hostname"))
            ]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return found


def uninstall_script(options):
    """Remove the agent, its config, its state and its unit. The state directory (and the others)
    may be mount points: their contents go, the mount point stays."""
    dirs = " ".join(
        shlex.quote(p) for p in (options.install_dir, options.config_dir, options.state_dir)
    )
    return (
        f"for dir in {dirs}; do\n"
        '    [ -d "$dir" ] || continue\n'
        '    find "$dir" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +\n'
        '    if mountpoint -q "$dir" 2>/dev/null; then echo "kept mount point $dir (emptied)"; '
        'else rmdir -- "$dir"; fi\n'
        "done\n"
        f"rm -f -- {shlex.quote(options.unit_path)}\n"
        "if command -v systemctl >/dev/null 2>&1; then systemctl daemon-reload; fi\n"
    )
