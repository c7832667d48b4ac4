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
    assert config.server_url == [] and config.server_urls == [] and config.labels == {}


def test_environment_overrides_the_file_and_flags_override_both(tmp_path):
    path = write(
        tmp_path,
        'server_url = "http://file:1"\nstate_dir = "/s"\n[labels]\nrack = "r1"\n'
        '[local_api]\nlisten = "127.0.0.1:9001"\n[devices]\nbackend = "fake:/x.json"\n'
        "poll_seconds = 5\n",
    )
    environ = {
        "FLEET_AGENT_SERVER_URL": "http://env:2",
        "FLEET_AGENT_LABELS": "zone=a, simulated=true",
        "FLEET_AGENT_DEVICES_POLL_SECONDS": "0.5",
        "FLEET_AGENT_LOCAL_API_LISTEN": "127.0.0.2:9002",
        "FLEET_AGENT_MACHINE_ID": "m-1",
    }
    config = load_config(str(path), environ=environ, server_url="http://flag:3")
    assert config.server_url == ["http://flag:3"]
    assert config.labels == {"zone": "a", "simulated": "true"}
    assert config.devices_poll_seconds == 0.5
    assert config.devices_backend == "fake:/x.json"
    assert config.local_api_listen == "127.0.0.2:9002"
    assert config.state_dir == "/s"
    assert config.resolve_machine_id() == "m-1"


@pytest.mark.parametrize(
    "text, message",
    [
        ('serverurl = "http://x"\n', "unknown key"),
        ('[local_api]\nlisten = "0.0.0.0:8001"\n', "not a loopback address"),
        ('[local_api]\nlisten = "10.1.2.3:8001"\ntls_cert = "/c.pem"\n', "go together"),
        ('[devices]\nbackend = "auto"\n', "devices.backend"),
        ('[devices]\npoll_seconds = "soon"\n', "must be float"),
        ('machine_id = "has space"\n', "machine_id"),
        ('tls_pin = "abc"\n', "tls_pin"),
        ("server_url = \n", "not valid TOML"),
    ],
)
def test_invalid_configuration_is_refused_with_the_key_named(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(str(write(tmp_path, text)), environ={}).resolve_machine_id()


def test_non_loopback_local_api_is_accepted_with_tls(tmp_path):
    text = '[local_api]\nlisten = "0.0.0.0:8001"\ntls_cert = "/c.pem"\ntls_key = "/k.pem"\n'
    assert load_config(str(write(tmp_path, text)), environ={}).local_api_host_port == (
        "0.0.0.0",
        8001,
    )


def test_missing_explicit_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(str(tmp_path / "nope.toml"), environ={})


def test_state_files_are_private_and_complete(tmp_path):
    state = State(str(tmp_path / "state"))
    assert not state.enrolled()
    state.save_enrolment({"node_id": "n1", "fleet": "f"}, "fln_secret")
    token = state.local_api_token()
    assert (
        state.enrolled()
        and state.node()["node_id"] == "n1"
        and state.session_token() == "fln_secret"
    )
    for name in ("node.json", "session.token", "local-api.token"):
        assert stat.S_IMODE(os.stat(state.path(name)).st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(state.dir).st_mode) == 0o700
    assert state.local_api_token() == token
    assert [
        n for n in os.listdir(state.dir) if n.startswith(".")
    ] == []  # no temp files left behind


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


# server_url: one URL or several (replicas of one fleetd).


def test_server_url_may_be_a_toml_array_kept_in_order_without_trailing_slashes(tmp_path):
    path = write(
        tmp_path, 'server_url = ["https://cp1:8080/", "https://cp2:8080", "http://10.0.0.3"]\n'
    )
    config = load_config(str(path), environ={})
    assert (
        config.server_url
        == config.server_urls
        == ["https://cp1:8080", "https://cp2:8080", "http://10.0.0.3"]
    )


def test_server_url_may_be_comma_separated_in_the_environment_the_file_and_a_flag(tmp_path):
    path = write(tmp_path, 'server_url = "https://a:1, https://b:2"\n')
    assert load_config(str(path), environ={}).server_urls == ["https://a:1", "https://b:2"]
    config = load_config(
        str(path), environ={"FLEET_AGENT_SERVER_URL": "http://env1:1,http://env2:2"}
    )
    assert config.server_urls == ["http://env1:1", "http://env2:2"]
    config = load_config(
        str(path),
        environ={"FLEET_AGENT_SERVER_URL": "http://env1:1"},
        server_url="http://flag1:3,http://flag2:4",
    )
    assert config.server_urls == ["http://flag1:3", "http://flag2:4"]
    assert load_config(
        str(write(tmp_path, 'server_url = "http://one"\n')), environ={}
    ).server_urls == ["http://one"]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            'server_url = ["https://ok:1", "ftp://bad:2"]\n',
            r"server_url 'ftp://bad:2' must start with http:// or https://",
        ),
        ('server_url = "https://ok:1,cp2:8080"\n', r"server_url 'cp2:8080' must start with http"),
        ('server_url = ["https://ok:1", ""]\n', "server_url entry 2 is empty"),
        ('server_url = "https://ok:1,,https://b"\n', "server_url entry 2 is empty"),
        ('server_url = ["https://ok:1", 5]\n', "server_url entry 2 must be a string"),
        ("server_url = 5\n", "server_url must be a URL or a list of URLs"),
        (
            'server_url = ["https://a:1", "https://A:1/"]\n',
            r"'https://A:1/' is given twice \(entries 1 and 2\)",
        ),
        ('server_url = ["http://a:99999"]\n', r"server_url 'http://a:99999' is not a valid URL"),
        ('server_url = ["http://"]\n', "needs a host"),
        (
            "server_url = [" + ", ".join(f'"http://cp{i}:1"' for i in range(17)) + "]\n",
            "17 URLs; at most 16",
        ),
    ],
)
def test_bad_server_urls_are_refused_naming_the_bad_one(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(str(write(tmp_path, text)), environ={})


def test_bad_server_url_in_the_environment_is_refused_too(tmp_path):
    with pytest.raises(ConfigError, match="'nope' must start with http"):
        load_config(
            str(write(tmp_path, "")), environ={"FLEET_AGENT_SERVER_URL": "http://ok:1,nope"}
        )


def test_sixteen_server_urls_are_allowed(tmp_path):
    urls = [f"http://cp{i}:1" for i in range(16)]
    assert (
        load_config(str(write(tmp_path, "")), environ={}, server_url=",".join(urls)).server_urls
        == urls
    )


def test_node_json_of_an_older_agent_with_one_server_url_still_loads(tmp_path):
    from agent.config import node_server_urls

    state = State(str(tmp_path / "state"))
    state.save_enrolment({"node_id": "n1", "fleet": "f", "server_url": "http://old:8080/"}, "fln_s")
    assert node_server_urls(state.node()) == ["http://old:8080"]
    state.save_enrolment(
        {
            "node_id": "n1",
            "fleet": "f",
            "server_url": "http://a:1",
            "server_urls": ["http://a:1", "http://b:2"],
        },
        "fln_s",
    )
    assert node_server_urls(state.node()) == ["http://a:1", "http://b:2"]
    assert node_server_urls({"node_id": "n1"}) == [] and node_server_urls(None) == []


def test_joining_again_with_replicas_added_keeps_the_node_and_another_fleetd_needs_force(tmp_path):
    from agent.daemon import enrol

    state = State(str(tmp_path / "state"))
    state.save_enrolment(
        {"node_id": "n1", "fleet": "f", "server_url": "http://cp1:1"}, "fln_s"
    )  # an older agent
    config = load_config(
        str(write(tmp_path, f'state_dir = "{state.dir}"\n')),
        environ={},
        server_url="http://cp1:1,http://cp2:2",
    )
    node, registered = enrol(config, "flj_unused")
    assert not registered and node["node_id"] == "n1"
    assert (
        state.node()["server_urls"] == ["http://cp1:1", "http://cp2:2"]
        and state.session_token() == "fln_s"
    )
    other = load_config(
        str(write(tmp_path, f'state_dir = "{state.dir}"\n')),
        environ={},
        server_url="http://elsewhere:1",
    )
    with pytest.raises(
        ConfigError, match=r"already enrolled with http://cp1:1, http://cp2:2; use --force"
    ):
        enrol(other, "flj_unused")
