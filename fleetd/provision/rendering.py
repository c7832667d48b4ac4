"""The host templates (`templates/`, shipped inside the package as fleetd/provision/templates):
the systemd unit, the agent config and the helper scripts, rendered with StrictUndefined so that
a missing variable is an error, never an empty string.

Variable names are the Ansible role's (`fleet_agent_*`), so that one template file serves
`fleetd bootstrap`, the playbooks and the Terraform module alike.
"""

import hashlib
import os
from pathlib import Path

import jinja2

UNIT_NAME = "fleet-agent.service"
UNIT_TEMPLATE = "fleet-agent.service.j2"
CONFIG_TEMPLATE = "agent.toml.j2"
FACTS_SCRIPT = "fleet-agent-facts.sh"
INSTALL_SCRIPT = "fleet-agent-install.sh"
LOG_SCRIPT = "fleet-agent-log.sh"
VERSIONS_SCRIPT = "fleet-agent-versions.sh"

MANAGED_BY = "fleetd bootstrap, the fleet_agent Ansible role or the fleet-nodes Terraform module"

#: Defaults of every template variable; the role's defaults/main.yml holds the same values.
DEFAULTS: dict[str, object] = {
    # The same words from every path, so that switching between them rewrites nothing and restarts
    # nothing.
    "fleet_agent_managed_by": MANAGED_BY,
    "fleet_agent_install_dir": "/opt/fleet-agent",
    "fleet_agent_config_dir": "/etc/fleet-agent",
    "fleet_agent_state_dir": "/var/lib/fleet-agent",
    "fleet_agent_unit_dir": "/etc/systemd/system",
    # Required: one URL, several comma-separated, or a list (replicas).
    "fleet_agent_server_url": None,
    "fleet_agent_ca_file": "",
    "fleet_agent_tls_pin": "",
    "fleet_agent_machine_id": "",
    "fleet_agent_address": "",
    "fleet_agent_labels": {},
    "fleet_agent_local_api_listen": "127.0.0.1:8001",
    "fleet_agent_devices_backend": "nvml",
    "fleet_agent_devices_poll_seconds": 1.0,
    "fleet_agent_heartbeat_interval_seconds": 0,
    "fleet_agent_log_level": "info",
    "fleet_agent_restart_seconds": 5,
    "fleet_agent_watchdog_seconds": 60,
    "fleet_agent_stop_timeout_seconds": 90,
}


class TemplateError(Exception):
    """A template is missing or a variable it needs was not given."""


def templates_dir():
    """Where the templates are: FLEETD_TEMPLATES_DIR, else the copy inside the package."""
    override = os.environ.get("FLEETD_TEMPLATES_DIR")
    path = Path(override) if override else Path(__file__).resolve().parent / "templates"
    if not (path / UNIT_TEMPLATE).is_file():
        raise TemplateError(f"fleet-agent templates not found in {path} (set FLEETD_TEMPLATES_DIR)")
    return path


def _environment():
    return jinja2.Environment(  # nosec B701  # systemd units and TOML for hosts, not HTML: escaping would corrupt them
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,  # as Ansible renders templates
        keep_trailing_newline=True,
        autoescape=False,
    )


def template_vars(**overrides):
    """DEFAULTS updated with `overrides` (keys without the fleet_agent_ prefix are accepted)."""
    values = dict(DEFAULTS)
    for key, value in overrides.items():
        name = key if key.startswith("fleet_agent_") else f"fleet_agent_{key}"
        if name not in DEFAULTS:
            raise TemplateError(f"unknown template variable {name}")
        values[name] = value
    missing = sorted(k for k, v in values.items() if v is None)
    if missing:
        raise TemplateError("missing template variable(s): " + ", ".join(missing))
    values["fleet_agent_server_url"] = server_urls(values["fleet_agent_server_url"])
    return values


def server_urls(value):
    """fleetd's URLs for the agents, from one URL, 'URL,URL' or a list: checked as the agent checks
    its server_url (http or https with a host, at most 16, none twice), so that a bad one is refused
    here rather than by every host's agent."""
    from agent.config import ConfigError, parse_server_urls

    try:
        urls = parse_server_urls(list(value) if isinstance(value, tuple) else value)
    except ConfigError as exc:
        raise TemplateError(f"fleet_agent_{exc}") from None
    if not urls:
        raise TemplateError("missing template variable(s): fleet_agent_server_url (no URL given)")
    return urls


def render(name, values):
    """Render one template with `values`; StrictUndefined makes any missing variable an error."""
    missing = sorted(name for name in DEFAULTS if name not in values)
    if missing:
        raise TemplateError(f"template {name}: missing variable(s) " + ", ".join(missing))
    try:
        return _environment().get_template(name).render(**values)
    except jinja2.TemplateNotFound:
        raise TemplateError(f"template {name} not found in {templates_dir()}") from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"template {name}: {exc}") from None


def render_unit(values):
    """The systemd unit fleet-agent.service."""
    return render(UNIT_TEMPLATE, values)


def render_config(values):
    """The agent's TOML config, /etc/fleet-agent/agent.toml."""
    return render(CONFIG_TEMPLATE, values)


def script(name):
    """The text of a helper script that runs on hosts (facts, install, versions, the agent's
    log)."""
    path = templates_dir() / name
    try:
        return path.read_text()
    except OSError as exc:
        raise TemplateError(f"cannot read {path}: {exc}") from None


def sha256_text(text):
    """Hex SHA-256 of a text as the host's sha256sum would print it."""
    return hashlib.sha256(text.encode()).hexdigest()
