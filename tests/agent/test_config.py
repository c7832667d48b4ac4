"""Configuration precedence and validation; state files."""

import os
import stat
import threading

import pytest

from agent.config import ConfigError, load_config
from agent.state import State


def write(tmp_path, text):
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_defaults_match_api_md(tmp_path):
    config = load_config(str(write(tmp_path, "")), environ={})
    assert config.state_dir == "/var/lib/fleet-agent"
    assert config.local_api_listen == "127.0.0.1:8001"
    assert config.devices_backend == "nvml"
    assert config.devices_poll_seconds == 1.0
    assert config.server_url == "" and config.labels == {}


def test_environment_overrides_the_file_and_flags_override_both(tmp_path):
    path = write(tmp_path, 'server_url = "http://file:1"\nstate_dir = "/s"\n[labels]\nrack = "r1"\n'
                           '[local_api]\nlisten = "127.0.0.1:9001"\n[devices]\nbackend = "fake:/x.json"\n'
                           'poll_seconds = 5\n')
    environ = {"FLEET_AGENT_SERVER_URL": "http://env:2", "FLEET_AGENT_LABELS": "zone=a, simulated=true",
               "FLEET_AGENT_DEVICES_POLL_SECONDS": "0.5", "FLEET_AGENT_LOCAL_API_LISTEN": "127.0.0.2:9002",
               "FLEET_AGENT_MACHINE_ID": "m-1"}
    config = load_config(str(path), environ=environ, server_url="http://flag:3")
    assert config.server_url == "http://flag:3"
    assert config.labels == {"zone": "a", "simulated": "true"}
    assert config.devices_poll_seconds == 0.5
    assert config.devices_backend == "fake:/x.json"
    assert config.local_api_listen == "127.0.0.2:9002"
    assert config.state_dir == "/s"
    assert config.resolve_machine_id() == "m-1"


@pytest.mark.parametrize("text, message", [
    ('serverurl = "http://x"\n', "unknown key"),
    ('[local_api]\nlisten = "0.0.0.0:8001"\n', "not a loopback address"),
    ('[local_api]\nlisten = "10.1.2.3:8001"\ntls_cert = "/c.pem"\n', "go together"),
    ('[devices]\nbackend = "auto"\n', "devices.backend"),
    ('[devices]\npoll_seconds = "soon"\n', "must be float"),
    ('machine_id = "has space"\n', "machine_id"),
    ('tls_pin = "abc"\n', "tls_pin"),
    ("server_url = \n", "not valid TOML"),
])
def test_invalid_configuration_is_refused_with_the_key_named(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(str(write(tmp_path, text)), environ={}).resolve_machine_id()


def test_non_loopback_local_api_is_accepted_with_tls(tmp_path):
    text = '[local_api]\nlisten = "0.0.0.0:8001"\ntls_cert = "/c.pem"\ntls_key = "/k.pem"\n'
    assert load_config(str(write(tmp_path, text)), environ={}).local_api_host_port == ("0.0.0.0", 8001)


def test_missing_explicit_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(str(tmp_path / "nope.toml"), environ={})


def test_state_files_are_private_and_complete(tmp_path):
    state = State(str(tmp_path / "state"))
    assert not state.enrolled()
    state.save_enrolment({"node_id": "n1", "fleet": "f"}, "fln_secret")
    token = state.local_api_token()
    assert state.enrolled() and state.node()["node_id"] == "n1" and state.session_token() == "fln_secret"
    for name in ("node.json", "session.token", "local-api.token"):
        assert stat.S_IMODE(os.stat(state.path(name)).st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(state.dir).st_mode) == 0o700
    assert state.local_api_token() == token
    assert [n for n in os.listdir(state.dir) if n.startswith(".")] == []  # no temp files left behind


def test_racing_creators_agree_on_one_local_api_token(tmp_path):
    state_dir = str(tmp_path / "state")
    State(state_dir).ensure_dir()
    tokens = []
    barrier = threading.Barrier(8)

    def create():
        barrier.wait(timeout=10)
        tokens.append(State(state_dir).local_api_token())

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(tokens) == 8 and len(set(tokens)) == 1
    assert State(state_dir).local_api_token(create=False) == tokens[0]
