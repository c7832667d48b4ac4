"""The configuration loader fleetd and fleet-agent share: file, then environment, then overrides."""

import dataclasses

import pytest

import fleetconf
from fleetd.settings import Settings


@dataclasses.dataclass
class Conf:
    name: str = "a"
    count: int = 1
    ratio: float = 0.5
    enabled: bool = True


def load(values=None, environ=None, **overrides):
    return fleetconf.load(Conf, "T_", values or {}, environ or {}, overrides, ValueError)


def test_file_then_environment_then_overrides():
    assert load({"count": 2}) == Conf(count=2)
    assert load({"count": 2}, {"T_COUNT": "3"}) == Conf(count=3)
    assert load({"count": 2}, {"T_COUNT": "3"}, count=4) == Conf(count=4)
    assert load({}, {"T_COUNT": ""}) == Conf()  # an empty variable is no value


@pytest.mark.parametrize(
    "text, value",
    [
        ("false", False),
        ("no", False),
        ("0", False),
        ("off", False),
        ("TRUE", True),
        ("yes", True),
        ("1", True),
        ("on", True),
    ],
)
def test_a_bool_from_the_environment_reads_as_people_write_it(text, value):
    assert load(environ={"T_ENABLED": text}).enabled is value


@pytest.mark.parametrize(
    "values, message",
    [
        ({"enabled": "maybe"}, "enabled must be true or false"),
        ({"count": "many"}, "count must be int"),
        ({"count": 1.5}, "count must be int"),
        ({"ratio": "half"}, "ratio must be float"),
        ({"colour": "red"}, "unknown key(s) in config: colour"),
    ],
)
def test_bad_values_and_unknown_keys_are_named(values, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(values)


def test_tables_flatten_and_host_port_parses():
    assert fleetconf.flatten({"local_api": {"listen": "x"}, "labels": {"a": "b"}}) == {
        "local_api_listen": "x",
        "labels": {"a": "b"},
    }
    assert fleetconf.parse_host_port("[::1]:8001", ValueError) == ("::1", 8001)
    assert fleetconf.parse_host_port(":8080", ValueError, default_host="0.0.0.0") == (
        "0.0.0.0",
        8080,
    )
    for bad in ("8080", "host:", "host:70000", ":8080"):
        with pytest.raises(ValueError, match="must be HOST:PORT"):
            fleetconf.parse_host_port(bad, ValueError)


def test_fleetd_settings_use_it(tmp_path):
    config = tmp_path / "fleetd.toml"
    config.write_text("node_ttl_seconds = 45\n")
    settings = Settings.load(
        environ={"FLEETD_CONFIG": str(config), "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "5"}
    )
    assert settings.node_ttl_seconds == 45.0 and settings.heartbeat_interval_seconds == 5
    with pytest.raises(ValueError, match="node_ttl_seconds must be float"):
        Settings.load(environ={"FLEETD_NODE_TTL_SECONDS": "soon"})
