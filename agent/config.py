"""Agent configuration: defaults, then the TOML file, then FLEET_AGENT_* environment, then flags.

Keys and variables are those of docs/api.md "Agent configuration"; tables flatten to
`<table>_<key>` (``local_api.listen`` is ``local_api_listen``, variable
``FLEET_AGENT_LOCAL_API_LISTEN``). Unknown keys are an error, so a typo never silently
falls back to a default.
"""

import dataclasses
import ipaddress
import os
import re
import shlex
import urllib.parse

import fleetconf

DEFAULT_CONFIG_PATH = "/etc/fleet-agent/agent.toml"
DEFAULT_STATE_DIR = "/var/lib/fleet-agent"
MACHINE_ID_PATH = "/etc/machine-id"
MACHINE_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
ENV_PREFIX = "FLEET_AGENT_"
MAX_SERVER_URLS = 16


class ConfigError(Exception):
    """The configuration is invalid; the message says which key and why."""


@dataclasses.dataclass
class Config:
    """Everything the agent can be configured with."""

    # fleetd's URLs (replicas): required for join; run falls back to the ones stored at join. A list
    # after loading (TOML array, or a comma-separated string); a plain string is taken too.
    server_url: list = dataclasses.field(default_factory=list)
    ca_file: str = ""  # PEM bundle to verify fleetd's certificate; empty: system trust store
    tls_pin: str = ""  # SHA-256 fingerprint (hex) of fleetd's certificate, instead of a CA
    state_dir: str = DEFAULT_STATE_DIR
    labels: dict = dataclasses.field(default_factory=dict)
    machine_id: str = ""  # empty: /etc/machine-id
    address: str = ""  # address fleetd and peers reach this host at; empty: detected
    heartbeat_interval_seconds: float = 0.0  # 0: the interval fleetd asks for
    backoff_max_seconds: float = 60.0  # cap of the retry backoff while fleetd is unreachable
    request_timeout_seconds: float = 10.0
    local_api_listen: str = "127.0.0.1:8001"
    local_api_tls_cert: str = ""
    local_api_tls_key: str = ""
    devices_backend: str = "nvml"  # or fake:<path to shape json>
    devices_poll_seconds: float = 1.0
    devices_rediscover_seconds: float = (
        300.0  # full NVML re-initialisation (new driver, swapped GPU)
    )
    tasks_kill_grace_seconds: float = (
        10.0  # cancel: SIGTERM to the process group, SIGKILL this much later
    )
    tasks_rendezvous_timeout_seconds: float = (
        600.0  # how long a rank > 0 waits for rank 0's address
    )
    tasks_report_retry_seconds: float = (
        7 * 86400.0
    )  # how long a finish report is retried through an outage
    tasks_log_batch_lines: int = 1000  # most line texts in one POST .../logs
    tasks_log_batch_bytes: int = 256 * 1024  # about the most text in one POST .../logs
    tasks_log_interval_seconds: float = 0.25  # output files read, a batch sent, this often
    tasks_log_buffer_bytes: int = 8 * 1024 * 1024  # most read from one output file at one tick
    tasks_output_chunk_age_seconds: float = 120.0  # an output chunk older than this is uploaded
    limits_poll_seconds: float = 0.25  # VRAM watchdog period; at most 0.5
    limits_memory_tolerance_bytes: int = (
        32 * 1024 * 1024
    )  # usage over a GPU memory limit by at most this is allowed
    limits_kill_grace_seconds: float = (
        0.5  # a task over a limit: SIGTERM, then SIGKILL this much later
    )
    limits_foreign_processes: str = "report"  # GPU processes of no task: "report" or "kill"
    limits_mps_enabled: bool = (
        False  # start and supervise an MPS control daemon per GPU for mps tasks
    )
    limits_mps_control_command: str = "nvidia-cuda-mps-control"
    limits_mps_dir: str = ""  # MPS pipe and log directories; empty: <state_dir>/mps
    limits_cgroup_parent: str = (
        "fleet-agent"  # task cgroups under <cgroup v2 mount>/<this>; empty: none
    )
    ports_range: str = "40000-41000"  # host ports handed to instances' declared ports ("low-high")
    containers_command: str = (
        ""  # podman/docker command line (shlex); empty: podman, else docker; "none": off
    )
    instances_restart_limit: int = (
        10  # restarts in a row, each after a run under 60 s, before a policy gives up; 0: none
    )
    log_level: str = "info"

    @property
    def server_urls(self):
        """fleetd's URLs, in the order to try them ([] when none is configured)."""
        return parse_server_urls(self.server_url)

    @property
    def ports_bounds(self):
        """(low, high) of ports.range."""
        return parse_port_range(self.ports_range)

    @property
    def local_api_host_port(self):
        """(host, port) of the local API."""
        return parse_listen(self.local_api_listen)

    def resolve_machine_id(self):
        """The configured machine id, else /etc/machine-id; validated like fleetd does."""
        value = self.machine_id
        if not value:
            try:
                with open(MACHINE_ID_PATH) as fh:
                    value = fh.read().strip()
            except OSError as exc:
                raise ConfigError(
                    f"machine_id is not set and {MACHINE_ID_PATH} is unreadable: {exc}"
                ) from None
        if not MACHINE_ID_RE.fullmatch(value):
            raise ConfigError("machine_id must be 1-128 letters, digits or ._:-")
        return value

    def validate(self):
        """Check values that would otherwise fail late; returns self."""
        if bool(self.local_api_tls_cert) != bool(self.local_api_tls_key):
            raise ConfigError("local_api.tls_cert and local_api.tls_key go together")
        host, _port = self.local_api_host_port
        if not is_loopback(host) and not (self.local_api_tls_cert and self.local_api_tls_key):
            raise ConfigError(
                f"local_api.listen {self.local_api_listen} is not a loopback address; "
                "set local_api.tls_cert and local_api.tls_key to serve it over TLS"
            )
        if self.devices_poll_seconds <= 0 or self.devices_rediscover_seconds <= 0:
            raise ConfigError(
                "devices.poll_seconds and devices.rediscover_seconds must be positive"
            )
        if (
            self.heartbeat_interval_seconds < 0
            or self.backoff_max_seconds <= 0
            or self.request_timeout_seconds <= 0
        ):
            raise ConfigError(
                "heartbeat_interval_seconds, backoff_max_seconds and request_timeout_seconds "
                "must be positive (heartbeat 0 means: as fleetd says)"
            )
        if (
            self.tasks_kill_grace_seconds < 0
            or self.tasks_rendezvous_timeout_seconds <= 0
            or self.tasks_report_retry_seconds <= 0
            or self.tasks_log_interval_seconds <= 0
            or self.tasks_output_chunk_age_seconds <= 0
        ):
            raise ConfigError(
                "tasks.kill_grace_seconds must be >= 0; tasks.rendezvous_timeout_seconds, "
                "tasks.report_retry_seconds, tasks.log_interval_seconds and "
                "tasks.output_chunk_age_seconds must be positive"
            )
        if (
            self.tasks_log_batch_lines < 1
            or self.tasks_log_batch_bytes < 1024
            or self.tasks_log_buffer_bytes < self.tasks_log_batch_bytes
        ):
            raise ConfigError(
                "tasks.log_batch_lines must be >= 1, tasks.log_batch_bytes >= 1024 and "
                "tasks.log_buffer_bytes >= tasks.log_batch_bytes"
            )
        if self.tls_pin and not re.fullmatch(
            r"[0-9a-f]{64}", self.tls_pin.replace(":", "").lower()
        ):
            raise ConfigError(
                "tls_pin must be a SHA-256 fingerprint: 64 hex digits, colons allowed"
            )
        if self.devices_backend != "nvml" and not self.devices_backend.startswith("fake:"):
            raise ConfigError("devices.backend must be 'nvml' or 'fake:<path to shape json>'")
        if not 0 < self.limits_poll_seconds <= 0.5:
            raise ConfigError("limits.poll_seconds must be > 0 and at most 0.5")
        if self.limits_memory_tolerance_bytes < 0 or self.limits_kill_grace_seconds < 0:
            raise ConfigError(
                "limits.memory_tolerance_bytes and limits.kill_grace_seconds must be >= 0"
            )
        if self.limits_foreign_processes not in ("report", "kill"):
            raise ConfigError("limits.foreign_processes must be 'report' or 'kill'")
        if self.limits_mps_enabled and not self.limits_mps_control_command:
            raise ConfigError(
                "limits.mps_control_command is required when limits.mps_enabled is true"
            )
        self.server_url = parse_server_urls(self.server_url)
        self.ports_bounds  # noqa: B018 - raises ConfigError for a bad ports.range
        if self.instances_restart_limit < 0:
            raise ConfigError(
                "instances.restart_limit must be >= 0 (0: a restart policy never gives up)"
            )
        try:
            shlex.split(self.containers_command)
        except ValueError as exc:
            raise ConfigError(f"containers.command is not a valid command line: {exc}") from None
        return self


def parse_server_urls(value):
    """server_url as given (a URL, 'URL,URL', or a list of URLs) -> [URL, ...] without trailing
    slashes.

    Each must be http:// or https:// with a host; at most MAX_SERVER_URLS, none twice. ConfigError
    names the entry that is wrong."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.strip()
        items = [part.strip() for part in value.split(",")] if value else []
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ConfigError(f"server_url must be a URL or a list of URLs, got {value!r}")
    urls: list[str] = []
    seen: dict[str, int] = {}
    for position, item in enumerate(items, 1):
        if not isinstance(item, str):
            raise ConfigError(f"server_url entry {position} must be a string, got {item!r}")
        given = item.strip()
        if not given:
            raise ConfigError(f"server_url entry {position} is empty")
        if not re.match(r"^https?://", given, re.IGNORECASE):
            raise ConfigError(f"server_url {given!r} must start with http:// or https://")
        url = given.rstrip("/")
        try:
            parsed = urllib.parse.urlsplit(url)
            parsed.port  # noqa: B018 - raises ValueError for a port that is not a number in range
        except ValueError as exc:
            raise ConfigError(f"server_url {given!r} is not a valid URL: {exc}") from None
        if not parsed.hostname or any(c.isspace() for c in url):
            raise ConfigError(
                f"server_url {given!r} is not a valid URL: it needs a host and no spaces"
            )
        key = urllib.parse.urlunsplit(
            (
                parsed.scheme.lower(),
                parsed.netloc.lower(),
                parsed.path,
                parsed.query,
                parsed.fragment,
            )
        )
        if key in seen:
            raise ConfigError(
                f"server_url {given!r} is given twice (entries {seen[key]} and {position})"
            )
        seen[key] = position
        urls.append(url)
    if len(urls) > MAX_SERVER_URLS:
        raise ConfigError(
            f"server_url lists {len(urls)} URLs; at most {MAX_SERVER_URLS} are allowed"
        )
    return urls


def node_server_urls(node):
    """The fleetd URLs a node.json holds: `server_urls` (a list, since several are allowed), else
    the single `server_url` older agents wrote; [] when neither is usable."""
    if not node:
        return []
    for key in ("server_urls", "server_url"):
        try:
            urls = parse_server_urls(node.get(key))
        except ConfigError:
            continue
        if urls:
            return urls
    return []


def parse_port_range(value):
    """'40000-41000' -> (40000, 41000): two integers 1..65535, low <= high; ConfigError
    otherwise."""
    match = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", str(value))
    if not match:
        raise ConfigError(f"ports.range {value!r} must be 'low-high', e.g. '40000-41000'")
    low, high = int(match[1]), int(match[2])
    if not (1 <= low <= high <= 65535):
        raise ConfigError(f"ports.range {value!r}: ports must be 1 to 65535 and low <= high")
    return low, high


def parse_listen(value):
    """'host:port' (IPv6 as '[::1]:8001') -> (host, port)."""
    return fleetconf.parse_host_port(value, ConfigError, "listen address")


def is_loopback(host):
    """True for 127.0.0.0/8, ::1 and localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_labels(text):
    """'k=v,k=v' -> dict."""
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"label {item!r} must be key=value")
        labels[key.strip()] = value.strip()
    return labels


def _labels(raw):
    if isinstance(raw, str):
        return parse_labels(raw)
    if not isinstance(raw, dict):
        raise ConfigError("labels must be a table")
    return {str(k): str(v) for k, v in raw.items()}


def load_config(path=None, environ=None, **overrides):
    """Build the Config; `path` None means the default file if it exists (or FLEET_AGENT_CONFIG)."""
    environ = os.environ if environ is None else environ
    explicit = path or environ.get(ENV_PREFIX + "CONFIG")
    path = explicit or DEFAULT_CONFIG_PATH
    values = fleetconf.read_toml(path, ConfigError) if explicit or os.path.exists(path) else {}
    return fleetconf.load(
        Config,
        ENV_PREFIX,
        values,
        environ,
        overrides,
        ConfigError,
        where=path,
        special={"server_url": parse_server_urls, "labels": _labels},
    ).validate()
