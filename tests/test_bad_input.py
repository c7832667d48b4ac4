"""Bad input gets 400/404/405/413 in the error envelope, never a 500, and changes nothing."""

import pytest

from tests.conftest import admin_client


def _error(resp, status, code):
    assert resp.status_code == status, resp.get_data(as_text=True)
    body = resp.get_json()
    assert set(body) == {"error"} and body["error"]["code"] == code and body["error"]["message"]
    return body["error"]


def test_malformed_json_is_invalid_request(api):
    resp = api.call("POST", "/api/v1/fleets", data="{not json", headers={"Content-Type": "application/json"})
    _error(resp, 400, "invalid_request")


@pytest.mark.parametrize("body", [
    [],
    "fleet",
    {"name": 5},
    {"name": "UPPER"},
    {"name": "a" * 64},
    {"name": "ok", "unknown": 1},
    {"name": "ok", "labels": {"k": 5}},
    {"name": "ok", "labels": {"bad key!": "v"}},
    {"name": "ok", "description": "nul\x00byte"},
    {},
])
def test_invalid_fleet_bodies_are_refused_and_create_nothing(api, body):
    err = _error(api.post("/api/v1/fleets", body), 400, "invalid_request")
    assert "fields" in err["details"]
    assert api.get("/api/v1/fleets").get_json()["items"] == []


@pytest.mark.parametrize("body", [
    {"ttl_seconds": "3600"},
    {"ttl_seconds": 1.5},
    {"ttl_seconds": 10},
    {"ttl_seconds": 2**70},
    {"max_uses": 0},
    {"max_uses": True},
    {"max_uses": -1},
])
def test_invalid_join_token_bodies_are_refused(api, body):
    api.create_fleet()
    _error(api.post("/api/v1/fleets/gpu-a/join-tokens", body), 400, "invalid_request")
    assert api.get("/api/v1/fleets/gpu-a/join-tokens").get_json()["items"] == []


@pytest.mark.parametrize("override", [
    {"machine_id": "has spaces"},
    {"resources": {"cpu_count": -1, "memory_bytes": 1}},
    {"resources": {"cpu_count": 1, "memory_bytes": 2**64}},
    {"gpus": [{"uuid": "GPU-1"}]},
    {"gpus": [{"uuid": "GPU-1", "index": 0, "model": "m", "memory_total_bytes": 1}] * 2},
    {"hostname": ""},
    {"extra": True},
])
def test_invalid_registrations_are_refused_without_using_the_token(api, override):
    api.create_fleet()
    join = api.create_join_token(max_uses=1)
    err = api.register(join, expect=400, **override)
    assert err["error"]["code"] == "invalid_request"
    assert api.get("/api/v1/fleets/gpu-a/join-tokens").get_json()["items"][0]["uses"] == 0
    assert api.get("/api/v1/nodes").get_json()["items"] == []


def test_oversize_body_is_payload_too_large(make_app, clock):
    api = admin_client(make_app(max_body_bytes=4096), clock)
    resp = api.post("/api/v1/fleets", {"name": "big", "description": "x" * 10_000})
    _error(resp, 413, "payload_too_large")
    assert api.get("/api/v1/fleets").get_json()["items"] == []


@pytest.mark.parametrize("query", ["cursor=!!!", "cursor=bm90LWpzb24", "cursor=WzFd", "limit=0", "limit=1001",
                                   "limit=ten", "status=sleeping"])
def test_bad_list_parameters_are_invalid_request(api, query):
    _error(api.get(f"/api/v1/nodes?{query}"), 400, "invalid_request")


@pytest.mark.parametrize("method, path", [
    ("GET", "/api/v1/nodes/nope"),
    ("POST", "/api/v1/nodes/nope/cordon"),
    ("GET", "/api/v1/nodes/nope/events"),
    ("GET", "/api/v1/fleets/nope"),
    ("DELETE", "/api/v1/fleets/nope"),
    ("DELETE", "/api/v1/tokens/nope"),
    ("DELETE", "/api/v1/join-tokens/nope"),
    ("GET", "/api/v1/fleets/nope/join-tokens"),
    ("POST", "/api/v1/fleets/nope/join-tokens"),
    ("POST", "/api/v1/admin/tasks/nope/run"),
    ("GET", "/api/v1/no-such-route"),
])
def test_unknown_ids_and_routes_are_not_found(api, method, path):
    _error(api.call(method, path, json={} if method == "POST" else None), 404, "not_found")


def test_wrong_method_is_405_in_the_envelope(api):
    err = _error(api.call("PUT", "/api/v1/fleets", json={}), 405, "invalid_request")
    assert "POST" in err["details"]["allowed_methods"]


def test_duplicate_fleet_is_conflict(api):
    api.create_fleet("gpu-a")
    _error(api.post("/api/v1/fleets", {"name": "gpu-a"}), 409, "conflict")


def test_fleet_crud(api):
    created = api.create_fleet("gpu-a", description="rack 1", labels={"zone": "eu-1"})
    assert created == {"name": "gpu-a", "description": "rack 1", "labels": {"zone": "eu-1"},
                       "node_count": 0, "gpu_count": 0, "created_at": "2026-01-01T12:00:00.000Z",
                       "availability": None}
    patched = api.patch("/api/v1/fleets/gpu-a", {"labels": {"zone": "eu-2"}}).get_json()
    assert patched["labels"] == {"zone": "eu-2"} and patched["description"] == "rack 1"
    reg = api.register(api.create_join_token("gpu-a"), gpu_count=8)
    assert api.get("/api/v1/fleets/gpu-a").get_json()["node_count"] == 1
    assert api.get("/api/v1/fleets").get_json()["items"][0]["gpu_count"] == 8
    api.delete(f"/api/v1/nodes/{reg['node_id']}")
    assert api.delete("/api/v1/fleets/gpu-a").status_code == 204
    assert api.get("/api/v1/fleets/gpu-a").status_code == 404
