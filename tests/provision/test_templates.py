"""The host templates: rendered unit and config are valid, and missing variables are errors."""

import shutil
import subprocess
import sys

import pytest

from fleetd.provision import rendering

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from agent.config import load_config


def values(**overrides):
    base = {
        "server_url": "https://fleetd.example:8443",
        "labels": {"rack": "r12", 'zone "b"': "a<b>&c"},
    }
    base.update(overrides)
    return rendering.template_vars(**base)


def test_config_is_toml_that_the_agent_loads_with_every_key_the_operator_set(tmp_path):
    text = rendering.render_config(
        values(
            tls_pin="ab" * 32,
            address="10.1.2.3",
            machine_id="m-1",
            heartbeat_interval_seconds=5,
            devices_backend="fake:/opt/shape.json",
            devices_poll_seconds=0.5,
            state_dir=str(tmp_path / "state"),
        )
    )
    data = tomllib.loads(text)
    assert data["server_url"] == "https://fleetd.example:8443"
    assert data["labels"] == {"rack": "r12", 'zone "b"': "a<b>&c"}
    assert data["devices"] == {"backend": "fake:/opt/shape.json", "poll_seconds": 0.5}
    path = tmp_path / "agent.toml"
    path.write_text(text)
    config = load_config(str(path), environ={})
    assert (
        config.tls_pin == "ab" * 32 and config.address == "10.1.2.3" and config.machine_id == "m-1"
    )
    assert config.heartbeat_interval_seconds == 5.0 and config.local_api_listen == "127.0.0.1:8001"
    assert config.labels == {"rack": "r12", 'zone "b"': "a<b>&c"}


def test_config_leaves_out_optional_keys_that_are_empty():
    data = tomllib.loads(rendering.render_config(values()))
    assert set(data) == {"server_url", "state_dir", "log_level", "labels", "local_api", "devices"}


def test_unit_is_a_notify_service_with_watchdog_restart_and_exit_3_kept_down():
    unit = rendering.render_unit(values(install_dir="/srv/agent", config_dir="/etc/fa"))
    lines = set(unit.splitlines())
    for expected in (
        "Type=notify",
        "WatchdogSec=60",
        "Restart=always",
        "RestartPreventExitStatus=3",
        "ExecStart=/srv/agent/current/bin/fleet-agent run --config /etc/fa/agent.toml",
        "StateDirectory=fleet-agent",
        "Delegate=yes",
        "WantedBy=multi-user.target",
    ):
        assert expected in lines, expected
    # Nothing that would cut the agent off /dev/nvidia* or CUDA's JIT.
    keys = {line.split("=", 1)[0] for line in lines if "=" in line and not line.startswith("#")}
    assert not keys & {
        "PrivateDevices",
        "ProtectClock",
        "MemoryDenyWriteExecute",
        "DevicePolicy",
        "DeviceAllow",
    }


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    install = tmp_path / "install"
    (install / "versions" / "1.0-abc" / "bin").mkdir(parents=True)
    (install / "versions" / "1.0-abc" / "bin" / "fleet-agent").write_text("#!/bin/sh\n")
    (install / "versions" / "1.0-abc" / "bin" / "fleet-agent").chmod(0o755)
    (install / "current").symlink_to("versions/1.0-abc")
    unit = tmp_path / "fleet-agent.service"
    unit.write_text(rendering.render_unit(values(install_dir=str(install))))
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    complaints = [line for line in result.stderr.splitlines() if "fleet-agent.service" in line]
    assert result.returncode == 0 and not complaints, result.stderr


def test_a_missing_variable_is_an_error_not_an_empty_string():
    with pytest.raises(rendering.TemplateError, match="fleet_agent_server_url"):
        rendering.template_vars()
    broken = dict(values())
    del broken["fleet_agent_devices_backend"]
    with pytest.raises(rendering.TemplateError, match="fleet_agent_devices_backend"):
        rendering.render_config(broken)
    with pytest.raises(rendering.TemplateError, match="unknown template variable"):
        rendering.template_vars(server_url="http://x", no_such_thing=1)


def test_facts_script_reports_an_empty_host_in_key_value_lines(tmp_path):
    result = subprocess.run(
        [
            "sh",
            "-s",
            "--",
            "python3",
            str(tmp_path / "opt"),
            str(tmp_path / "etc"),
            str(tmp_path / "state"),
            str(tmp_path / "unit.service"),
        ],
        input=rendering.script(rendering.FACTS_SCRIPT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    from fleetd.provision.bootstrap import parse_facts

    facts = parse_facts(result.stdout)
    assert result.returncode == 0, result.stderr
    assert facts["python"].startswith("3.") and facts["python_venv"] == "yes"
    assert (
        facts["installed_version"] == "" and facts["node_id"] == "" and facts["config_sha256"] == ""
    )
    assert int(facts["disk_free_kb"]) > 0


@pytest.mark.parametrize(
    "given",
    [
        ["https://cp1:8443", "https://cp2:8443/"],
        "https://cp1:8443, https://cp2:8443",
        ("https://cp1:8443", "https://cp2:8443"),
    ],
)
def test_several_server_urls_render_as_a_toml_array_the_agent_loads(tmp_path, given):
    text = rendering.render_config(values(server_url=given))
    assert 'server_url = ["https://cp1:8443", "https://cp2:8443"]' in text.splitlines()
    path = tmp_path / "agent.toml"
    path.write_text(text)
    assert load_config(str(path), environ={}).server_urls == [
        "https://cp1:8443",
        "https://cp2:8443",
    ]


def test_one_server_url_renders_as_before_so_existing_configs_do_not_change():
    for given in ("https://fleetd.example:8443", ["https://fleetd.example:8443"]):
        data = tomllib.loads(rendering.render_config(values(server_url=given)))
        assert data["server_url"] == "https://fleetd.example:8443"


def test_the_template_alone_takes_a_list_or_a_comma_separated_string_as_ansible_passes_them():
    base = dict(values())
    for given in (
        ["http://a:1", "http://b:2"],
        "http://a:1,http://b:2",
        "http://a:1 , http://b:2,",
    ):
        text = rendering.render(rendering.CONFIG_TEMPLATE, dict(base, fleet_agent_server_url=given))
        assert tomllib.loads(text)["server_url"] == ["http://a:1", "http://b:2"], given


@pytest.mark.parametrize(
    "given, message",
    [
        (["https://ok:1", "cp2:8443"], r"fleet_agent_server_url 'cp2:8443' must start with http"),
        (["https://ok:1", "https://ok:1/"], "given twice"),
        ([], "fleet_agent_server_url"),
        ("", "fleet_agent_server_url"),
        ([f"https://cp{i}:1" for i in range(17)], "at most 16"),
    ],
)
def test_bad_server_urls_are_refused_before_rendering(given, message):
    with pytest.raises(rendering.TemplateError, match=message):
        rendering.template_vars(server_url=given)


def test_facts_script_reports_the_stored_server_urls_of_new_and_old_agents(tmp_path):
    import json

    from fleetd.provision.bootstrap import parse_facts

    state = tmp_path / "state"
    state.mkdir()
    (state / "session.token").write_text("fln_x\n")

    def facts(node):
        (state / "node.json").write_text(json.dumps(node))
        result = subprocess.run(
            [
                "sh",
                "-s",
                "--",
                "python3",
                str(tmp_path / "opt"),
                str(tmp_path / "etc"),
                str(state),
                str(tmp_path / "unit.service"),
            ],
            input=rendering.script(rendering.FACTS_SCRIPT),
            capture_output=True,
            text=True,
            timeout=60,
        )
        return parse_facts(result.stdout)

    new = facts(
        {"node_id": "n1", "server_url": "http://a:1", "server_urls": ["http://a:1", "http://b:2"]}
    )
    assert (new["node_id"], new["node_server_url"], new["node_server_urls"]) == (
        "n1",
        "http://a:1",
        "http://a:1,http://b:2",
    )
    old = facts({"node_id": "n2", "server_url": "http://a:1"})
    assert (old["node_server_url"], old["node_server_urls"]) == ("http://a:1", "")


def fake_bundle(tmp_path, wheels, digests):
    """A fleet-agent-bundle-9.9.tar.gz with these wheel files and this manifest `wheels` map."""
    import hashlib
    import json
    import tarfile

    top = tmp_path / "src" / "fleet-agent-bundle-9.9"
    (top / "wheels").mkdir(parents=True)
    for name, data in wheels.items():
        (top / "wheels" / name).write_bytes(data)
    manifest = {
        "format": 1,
        "version": "9.9",
        "wheels": {
            name: digests.get(name) or hashlib.sha256(data).hexdigest()
            for name, data in wheels.items()
        },
    }
    (top / "manifest.json").write_text(json.dumps(manifest))
    path = tmp_path / "fleet-agent-bundle-9.9.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    return path


@pytest.mark.parametrize(
    "digests, message",
    [
        (
            {"pip-24.0-py3-none-any.whl": "0" * 64},
            "pip-24.0-py3-none-any.whl does not match its SHA-256 in the manifest",
        ),
        ({}, None),
    ],
)
def test_the_installer_checks_every_wheel_against_the_manifest_before_anything_is_installed(
    tmp_path, digests, message
):
    bundle = fake_bundle(
        tmp_path,
        {
            "pip-24.0-py3-none-any.whl": b"not really pip",
            "fleetd-9.9-py3-none-any.whl": b"not really fleetd",
        },
        digests,
    )
    install_dir = tmp_path / "venv"
    result = subprocess.run(
        ["sh", "-s", "--", str(bundle), sys.executable, str(install_dir)],
        input=rendering.script(rendering.INSTALL_SCRIPT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    if message:
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert not install_dir.exists()  # refused before the venv was made
    else:
        # The manifest holds: the installer went on to pip, which cannot read these fake wheels.
        assert "SHA-256" not in result.stderr and install_dir.exists(), result.stderr
