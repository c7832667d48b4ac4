"""Backoff, jitter, sd_notify, and the register body against fleetd's own schema."""

import random
import socket

import pytest

from agent.config import Config
from agent.daemon import backoff_delay, jittered, register_body, sd_notify, watchdog_interval
from agent.devices import DeviceManager


def test_backoff_grows_exponentially_with_jitter_and_stays_under_the_cap():
    rng = random.Random(7)
    for attempt in range(1, 12):
        ceiling = min(60, 2**attempt)
        delays = [backoff_delay(attempt, 60, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len({round(d, 6) for d in delays}) > 100  # jittered, not one fixed value
    assert backoff_delay(1000, 5, rng) <= 5


def test_heartbeat_interval_is_jittered_within_ten_percent():
    rng = random.Random(3)
    values = [jittered(10, rng) for _ in range(500)]
    assert all(9 <= v <= 11 for v in values)
    assert max(values) - min(values) > 1


def test_sd_notify_sends_datagrams_to_the_notify_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        server.settimeout(5)
        assert sd_notify("READY=1", environ={"NOTIFY_SOCKET": path})
        assert server.recv(4096) == b"READY=1"
    assert not sd_notify("READY=1", environ={})


def test_watchdog_interval_is_half_of_watchdog_usec_and_only_for_this_process():
    import os

    assert watchdog_interval({"WATCHDOG_USEC": "4000000"}) == 2.0
    assert watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}) == 2.0
    assert (
        watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid() + 1)})
        is None
    )
    assert watchdog_interval({}) is None


@pytest.mark.parametrize("scenario", ["h100_x8", "a100_mig_x2", "gpu_lost", "no_driver"])
def test_register_body_passes_fleetds_strict_schema(fake_nvml, scenario):
    schemas = pytest.importorskip("fleetd.schemas.agent")
    manager = DeviceManager(f"fake:{fake_nvml.use(scenario)}", watch_xids=False)
    inventory = manager.discover()
    manager.close()
    config = Config(server_url="http://127.0.0.1:9", machine_id="m-1")
    body = register_body(config, inventory, "m-1", {"simulated": "true"})
    assert schemas.RegisterSchema().validate(body.to_wire()) == {}
    assert (
        schemas.HeartbeatSchema().validate(
            {"gpus": inventory.wire_gpus(), "metrics": inventory.metrics(), "tasks": []}
        )
        == {}
    )
    assert body.address == "127.0.0.1"


def test_run_with_no_fleetd_url_anywhere_says_so_even_when_it_would_deregister_on_stop(
    tmp_path, fake_nvml
):
    # Enrolled (node.json and session.token), but neither node.json nor the config names a fleetd
    # URL: the agent stops with the ConfigError, and its deregistration at the stop, which has no
    # URL to call, must not replace that error with another (nor skip the clean-up after it).
    from agent.config import ConfigError
    from agent.daemon import Agent
    from agent.state import State

    config = Config(
        state_dir=str(tmp_path / "state"),
        local_api_listen="127.0.0.1:0",
        limits_cgroup_parent="",
        devices_backend=f"fake:{fake_nvml.use('h100_x8')}",
    )
    State(config.state_dir).save_enrolment({"node_id": "n-1", "fleet": "default"}, "fls_session")
    agent = Agent(config, deregister_on_stop=True)
    with pytest.raises(ConfigError, match="no fleetd URL"):
        agent.run()
    assert agent.stop.is_set()
