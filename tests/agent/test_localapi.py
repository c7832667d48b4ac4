"""The local API in-process over a real socket: envelope, auth on every route, TLS rule."""

import pytest
import requests

from agent.client import ServerUrls
from agent.config import Config, ConfigError
from agent.daemon import Agent
from agent.localapi import LocalApi
from agent.workers import Worker

ROUTES = [
    ("GET", "/api/v1/devices"),
    ("GET", "/api/v1/devices/GPU-5f3c6b1e-7a1d-4c2e-9b0f-000000000000"),
    ("POST", "/api/v1/devices/discover"),
    ("GET", "/api/v1/workers"),
    ("GET", "/api/v1/workers/t-1"),
    ("GET", "/api/v1/limiter"),
    ("POST", "/api/v1/trap"),
]
GPU0 = "GPU-5f3c6b1e-7a1d-4c2e-9b0f-000000000000"


@pytest.fixture
def local(tmp_path, fake_nvml):
    config = Config(
        state_dir=str(tmp_path / "state"),
        local_api_listen="127.0.0.1:0",
        devices_backend=f"fake:{fake_nvml.use('h100_x8')}",
    )
    agent = Agent(config)
    agent.devices.discover()
    api = LocalApi(agent, config, agent.state.local_api_token()).start()
    session = requests.Session()
    session.trust_env = False
    yield agent, api, session, {"Authorization": f"Bearer {agent.state.local_api_token()}"}
    session.close()
    api.stop()
    agent.devices.close()


def test_every_private_route_refuses_a_missing_or_wrong_token(local):
    _agent, api, http, _ok = local
    for method, path in ROUTES:
        for auth in (None, "Bearer wrong", "Basic abc", "Bearer ", _ok["Authorization"] + "x"):
            headers = {"Authorization": auth} if auth else {}
            resp = http.request(
                method, api.url + path, headers=headers, json={"gpu_uuid": GPU0}, timeout=10
            )
            assert resp.status_code == 401, (method, path, auth)
            assert resp.json()["error"]["code"] == "unauthorized"
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")


def test_healthz_is_public_and_readyz_waits_for_the_fleetd_session(local):
    agent, api, http, ok = local
    assert http.get(api.url + "/healthz", timeout=10).json() == {"data": {"status": "ok"}}
    resp = http.get(api.url + "/readyz", headers=ok, timeout=10)
    assert resp.status_code == 503
    assert resp.json()["error"]["details"]["session"] == "not yet confirmed by fleetd"
    agent.session_ok = True
    assert http.get(api.url + "/readyz", timeout=10).json()["data"]["status"] == "ready"


def test_readyz_without_the_token_says_ready_or_not_and_nothing_of_the_node_or_fleetd(local):
    agent, api, http, ok = local
    agent.node = {"node_id": "n-secret", "fleet": "lab"}
    agent.urls = ServerUrls(["https://fleetd.internal:8443"])
    for ready in (False, True):
        agent.session_ok = ready
        for auth in (None, "Bearer wrong"):
            resp = http.get(
                api.url + "/readyz", headers={"Authorization": auth} if auth else {}, timeout=10
            )
            assert resp.status_code == (200 if ready else 503)
            assert "n-secret" not in resp.text and "fleetd.internal" not in resp.text, resp.text
            assert resp.json() == (
                {"data": {"status": "ready"}}
                if ready
                else {"error": {"code": "unavailable", "message": "not ready"}}
            )
        told = http.get(api.url + "/readyz", headers=ok, timeout=10).json()
        details = told["data"] if ready else told["error"]["details"]
        assert (
            details["node_id"] == "n-secret"
            and details["fleetd_url"] == "https://fleetd.internal:8443"
        )


def test_devices_with_the_token_return_gpus_with_live_readings(local):
    _agent, api, http, ok = local
    gpus = http.get(api.url + "/api/v1/devices", headers=ok, timeout=10).json()["data"]
    assert len(gpus) == 8
    for key in (
        "uuid",
        "memory_total_bytes",
        "memory_used_bytes",
        "utilization_percent",
        "temperature_c",
        "power_w",
        "pci_bus_id",
        "healthy",
    ):
        assert key in gpus[0], key
    one = http.get(api.url + f"/api/v1/devices/{GPU0}", headers=ok, timeout=10).json()["data"]
    assert one["index"] == 0
    missing = http.get(api.url + "/api/v1/devices/GPU-nope", headers=ok, timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert (
        len(http.post(api.url + "/api/v1/devices/discover", headers=ok, timeout=10).json()["data"])
        == 8
    )


def test_workers_limiter_and_trap_are_empty_lists_without_tasks(local):
    _agent, api, http, ok = local
    assert http.get(api.url + "/api/v1/workers", headers=ok, timeout=10).json() == {"data": []}
    assert http.get(api.url + "/api/v1/limiter", headers=ok, timeout=10).json() == {"data": []}
    assert http.get(api.url + "/api/v1/workers/t-1", headers=ok, timeout=10).status_code == 404
    trap = http.post(
        api.url + "/api/v1/trap", headers=ok, json={"gpu_uuid": GPU0}, timeout=10
    ).json()["data"]
    assert trap["candidates"] == []


def test_trap_orders_workers_lowest_priority_then_largest_first(local, fake_nvml):
    agent, api, http, ok = local
    for task, prio, pid, used in [
        ("a", "on-demand", 101, 30),
        ("b", "spot", 102, 10),
        ("c", "spot", 103, 20),
    ]:
        agent.workers.add(
            Worker(
                task_id=task,
                epoch=1,
                priority_class=prio,
                pids=[pid],
                gpus=[{"uuid": GPU0, "memory_limit_bytes": 40 * 2**30}],
            )
        )
        fake_nvml.add_process(0, pid, used * 2**30)
    agent.devices.poll()
    trap = http.post(
        api.url + "/api/v1/trap",
        headers=ok,
        json={"gpu_uuid": GPU0, "pressure_bytes": 25 * 2**30},
        timeout=10,
    ).json()["data"]
    assert [c["task_id"] for c in trap["candidates"]] == ["c", "b"]
    worker = http.get(api.url + "/api/v1/workers/a", headers=ok, timeout=10).json()["data"]
    assert worker["usage"][GPU0]["used_memory_bytes"] == 30 * 2**30
    limiter = http.get(api.url + "/api/v1/limiter", headers=ok, timeout=10).json()["data"]
    assert {row["task_id"]: row["used_memory_bytes"] for row in limiter}["b"] == 10 * 2**30


def test_bad_requests_get_the_error_envelope(local):
    _agent, api, http, ok = local
    assert http.post(api.url + "/api/v1/trap", headers=ok, json={}, timeout=10).status_code == 400
    resp = http.post(
        api.url + "/api/v1/trap",
        headers=dict(ok, **{"Content-Type": "application/json"}),
        data=b"{nope",
        timeout=10,
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_request"
    big = http.post(api.url + "/api/v1/trap", headers=ok, data=b"x" * (70 * 1024), timeout=10)
    assert big.status_code == 413
    assert http.get(api.url + "/api/v1/nothing", headers=ok, timeout=10).status_code == 404
    assert http.delete(api.url + "/api/v1/devices", headers=ok, timeout=10).status_code == 405


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "192.0.2.1:8001"])
def test_non_loopback_bind_without_tls_is_refused(tmp_path, listen):
    config = Config(state_dir=str(tmp_path), local_api_listen=listen)
    with pytest.raises(ConfigError, match="non-loopback"):
        LocalApi(Agent(config), config, "fll_x").start()
