"""The agent protocol: enrolment, join-token atomicity, heartbeats, deregistration."""

import sqlite3

import pytest

from tests.conftest import ApiClient, admin_client, gpus
from tests.support.concurrency import all_at_once
from tests.support.http import register_body


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    return "gpu-a"


def test_agent_routes_refuse_a_missing_or_wrong_protocol_header(api, fleet):
    join = api.create_join_token(fleet)
    for headers in ({}, {"X-Fleet-Protocol": "2"}, {"X-Fleet-Protocol": "one"}):
        resp = api.call("POST", "/api/v1/agent/register", token=join, headers=headers, json={})
        assert resp.status_code == 400
        assert resp.get_json()["error"]["code"] == "protocol_mismatch"


def test_registration_returns_a_pending_node_that_becomes_ready_on_first_heartbeat(api, fleet):
    reg = api.register(api.create_join_token(fleet), gpu_count=8)
    assert reg["fleet"] == fleet and reg["heartbeat_interval_seconds"] == 10
    node = api.node(reg["node_id"])
    assert node["status"] == "pending" and len(node["gpus"]) == 8
    assert node["gpus"][3]["index"] == 3 and node["gpus"][3]["memory_total_bytes"] == 80 * 1024**3
    reply = api.heartbeat(reg["session_token"])
    assert reply == {
        "status": "ready",
        "drain": None,
        "revoked": False,
        "cancel": [],
        "heartbeat_interval_seconds": 10,
        "delete_volumes": [],
        "lease_seconds": 40.0,
    }
    assert api.node(reg["node_id"])["status"] == "ready"


def test_the_heartbeat_tells_the_task_lease_widened_with_the_interval_it_gives(make_app, clock):
    api = admin_client(make_app(max_heartbeats_per_second=0.1, task_lease_seconds=30), clock)
    api.create_fleet("gpu-a")
    join = api.create_join_token("gpu-a", max_uses=5)
    _, first = api.ready_node(join, "n1")
    reply = api.heartbeat(first)
    assert (reply["heartbeat_interval_seconds"], reply["lease_seconds"]) == (10, 30.0)
    api.ready_node(join, "n2")  # 2 nodes at 0.1 heartbeats/s: every 20 s, the lease twice as long
    reply = api.heartbeat(first)
    assert (reply["heartbeat_interval_seconds"], reply["lease_seconds"]) == (20, 60.0)


def test_single_use_token_admits_one_host_under_concurrency(api, fleet, app):
    join = api.create_join_token(fleet, max_uses=1)
    results = _register_concurrently(app, join, 20)
    assert sorted(results) == [201] + [401] * 19
    assert len(api.get("/api/v1/nodes").get_json()["items"]) == 1
    token = api.get(f"/api/v1/fleets/{fleet}/join-tokens").get_json()["items"][0]
    assert token["uses"] == 1 and token["max_uses"] == 1


def test_token_with_three_uses_admits_exactly_three_hosts_under_concurrency(api, fleet, app):
    join = api.create_join_token(fleet, max_uses=3)
    results = _register_concurrently(app, join, 20)
    assert sorted(results) == [201] * 3 + [401] * 17
    assert len(api.get("/api/v1/nodes").get_json()["items"]) == 3


def _register_concurrently(app, join, count):
    """`count` hosts register at once, each in its own thread with its own connection."""

    def register(i):
        return ApiClient(app).post(
            "/api/v1/agent/register",
            {
                "hostname": f"h{i}",
                "machine_id": f"machine-{i}",
                "agent_version": "0.1.0",
                "address": "10.0.0.1",
                "resources": {"cpu_count": 1, "memory_bytes": 1},
                "gpus": gpus(1),
            },
            token=join,
            agent=True,
        )

    return all_at_once(count, register)


def test_expired_revoked_and_used_up_join_tokens_are_refused(api, fleet, clock):
    expiring = api.create_join_token(fleet, ttl_seconds=60)
    revoked = api.post(f"/api/v1/fleets/{fleet}/join-tokens", {}).get_json()
    used_up = api.create_join_token(fleet, max_uses=1)
    api.register(used_up, machine_id="m-used")
    assert api.delete(f"/api/v1/join-tokens/{revoked['id']}").status_code == 204
    clock.advance(61)
    for token, message in (
        (expiring, "join token expired"),
        (revoked["token"], "join token revoked"),
        (used_up, "join token used up"),
    ):
        body = api.register(token, machine_id="m-new", expect=401)
        assert body["error"]["message"] == message


def test_registrations_past_the_rate_get_429_with_retry_after_and_nothing_stored(make_app, clock):
    api = admin_client(make_app(max_registrations_per_second=2), clock)
    api.create_fleet("gpu-a")
    join = api.create_join_token("gpu-a")
    for i in range(2):  # a second's worth passes at once
        api.register(join, machine_id=f"m-{i}", hostname=f"h-{i}")
    refused = api.register(join, machine_id="m-2", hostname="h-2", expect=429)
    assert refused["error"]["code"] == "rate_limited"
    message = refused["error"]["message"]
    assert "too many registrations at once on this fleetd (limit 2/s)" in message
    body = register_body("m-9", "h-9")
    resp = api.post("/api/v1/agent/register", body, token=join, agent=True)
    assert resp.status_code == 429 and resp.headers["Retry-After"] == "1"
    assert [n["hostname"] for n in api.get("/api/v1/nodes").get_json()["items"]] == ["h-0", "h-1"]
    clock.advance(0.5)  # one more turn
    api.register(join, machine_id="m-2", hostname="h-2")
    api.register(join, machine_id="m-3", hostname="h-3", expect=429)
    assert len(api.get("/api/v1/nodes").get_json()["items"]) == 3


def test_same_machine_registering_again_gets_its_node_back_and_old_session_stops(api, fleet, clock):
    join = api.create_join_token(fleet)
    first = api.register(join, machine_id="m-1", hostname="old-name")
    api.heartbeat(first["session_token"])
    clock.advance(31)  # its agent stopped heartbeating a TTL ago
    second = api.register(join, machine_id="m-1", hostname="new-name", gpu_count=4)
    assert second["node_id"] == first["node_id"]
    api.heartbeat(first["session_token"], expect=401)
    api.heartbeat(second["session_token"])
    node = api.node(first["node_id"])
    assert node["hostname"] == "new-name" and len(node["gpus"]) == 4 and node["status"] == "ready"
    assert len(api.get("/api/v1/nodes").get_json()["items"]) == 1


def test_cordoned_node_stays_cordoned_when_its_agent_re_registers(api, fleet, clock):
    join = api.create_join_token(fleet)
    reg = api.register(join)
    api.heartbeat(reg["session_token"])
    api.post(f"/api/v1/nodes/{reg['node_id']}/cordon")
    clock.advance(31)
    again = api.register(join)
    assert api.heartbeat(again["session_token"])["status"] == "cordoned"


def test_heartbeat_with_changed_gpus_updates_inventory_and_records_an_event(api, fleet):
    reg = api.register(api.create_join_token(fleet), gpu_count=2)
    api.heartbeat(reg["session_token"])
    changed = gpus(2)
    changed[1].update(healthy=False, health_reason="XID 79: GPU has fallen off the bus")
    api.heartbeat(reg["session_token"], gpus=changed)
    node = api.node(reg["node_id"])
    assert [g["healthy"] for g in node["gpus"]] == [True, False]
    assert node["gpus"][1]["health_reason"].startswith("XID 79")
    events = api.get(f"/api/v1/nodes/{reg['node_id']}/events").get_json()["items"]
    # The GPU event first; the fleet's health policy then takes the node out
    # (tests/fleetd/services/nodes/test_health_policy.py).
    assert [e for e in events if e["kind"] == "node.gpus"][-1]["reason"].endswith(
        "unhealthy: " + changed[1]["uuid"]
    )


def test_heartbeat_without_changes_writes_nothing_to_the_database(api, fleet, app):
    reg = api.register(api.create_join_token(fleet))
    api.heartbeat(reg["session_token"])
    con = sqlite3.connect(app.extensions["fleetd"].settings.database_url.removeprefix("sqlite:///"))
    try:
        # PRAGMA data_version changes whenever another connection commits a write.
        before = con.execute("PRAGMA data_version").fetchone()[0]
        for _ in range(20):
            api.heartbeat(reg["session_token"], metrics={"gpu_util": 50})
        after = con.execute("PRAGMA data_version").fetchone()[0]
        api.post(f"/api/v1/nodes/{reg['node_id']}/cordon")
        after_cordon = con.execute("PRAGMA data_version").fetchone()[0]
    finally:
        con.close()
    assert before == after
    assert after_cordon != after  # the probe does see writes


def test_tasks_unknown_to_the_control_plane_are_cancelled(api, fleet):
    reg = api.register(api.create_join_token(fleet))
    reply = api.heartbeat(
        reg["session_token"], tasks=[{"id": "t-stray", "epoch": 3, "state": "running"}]
    )
    assert reply["cancel"] == ["t-stray"]


def test_deregister_ends_the_session_and_marks_the_node_lost(api, fleet):
    reg = api.register(api.create_join_token(fleet))
    api.heartbeat(reg["session_token"])
    resp = api.post("/api/v1/agent/deregister", token=reg["session_token"], agent=True)
    assert resp.status_code == 204
    api.heartbeat(reg["session_token"], expect=401)
    node = api.node(reg["node_id"])
    assert node["status"] == "lost" and "deregistered" in node["status_reason"]


def test_a_revoked_node_registered_into_another_fleet_moves_there(api, fleet):
    api.create_fleet("gpu-b")
    reg = api.register(api.create_join_token(fleet))
    api.post(f"/api/v1/nodes/{reg['node_id']}/revoke")
    again = api.register(api.create_join_token("gpu-b"))
    assert again["node_id"] == reg["node_id"] and again["fleet"] == "gpu-b"
    assert api.node(reg["node_id"])["fleet"] == "gpu-b"


@pytest.mark.parametrize("silent_seconds", [0, 3600])
def test_a_join_token_of_another_fleet_cannot_take_over_a_node(api, fleet, clock, silent_seconds):
    api.create_fleet("other")
    reg = api.register(api.create_join_token(fleet), hostname="real-host", address="10.0.0.1")
    api.heartbeat(reg["session_token"])
    clock.advance(silent_seconds)  # alive, or long silent (lost): neither may move without an admin
    other = api.create_join_token("other", max_uses=1)
    resp = api.post(
        "/api/v1/agent/register",
        {
            "hostname": "intruder",
            "machine_id": "machine-1",
            "agent_version": "x",
            "address": "10.6.6.6",
            "resources": {"cpu_count": 1, "memory_bytes": 1},
            "gpus": [],
        },
        token=other,
        agent=True,
    )
    err = resp.get_json()["error"]
    assert (
        resp.status_code == 409
        and err["code"] == "conflict"
        and err["details"]["reason"] == "other_fleet"
    )
    node = api.node(reg["node_id"])
    assert (node["fleet"], node["hostname"], node["address"], len(node["gpus"])) == (
        fleet,
        "real-host",
        "10.0.0.1",
        2,
    )
    api.heartbeat(reg["session_token"])  # the real host's session still works
    assert (
        api.get("/api/v1/fleets/other/join-tokens").get_json()["items"][0]["uses"] == 0
    )  # not spent


def test_a_join_token_cannot_re_enrol_a_live_node_of_its_own_fleet_until_it_falls_silent(
    api, fleet, clock
):
    join = api.create_join_token(fleet)
    reg = api.register(join)
    api.heartbeat(reg["session_token"])
    clock.advance(10)
    err = api.register(join, hostname="imposter", expect=409)["error"]
    assert err["details"] == {"node_id": reg["node_id"], "reason": "alive"}
    api.heartbeat(reg["session_token"])
    assert api.node(reg["node_id"])["hostname"] == "gpu-host-1"
    clock.advance(31)  # the agent stopped: the host may enrol again (a reinstall)
    assert api.register(join)["node_id"] == reg["node_id"]


def test_every_assignment_fleetd_hands_out_is_one_the_agent_accepts(api, fleet):
    """The Assignment is defined once (fleetwire.assignment): fleetd's assignments of every kind
    pass the agent's own validation, and the API's schema names exactly its fields."""
    import dataclasses

    from fleetd.schemas.jobs import AssignmentSchema
    from fleetwire.assignment import Assignment

    token = api.create_join_token(fleet)
    node_id, session = api.ready_node(token, "host-a", gpu_count=4)
    api.submit(resources={"gpus": 1}, env={"A": "1"}, max_runtime_seconds=60)
    api.submit(resources={"gpus": 0.5, "cpus": 2, "memory_bytes": 1 << 30})
    api.submit(resources={"gpus": 1}, priority_class="spot", bid=2.5)
    created = api.post(
        "/api/v1/instances",
        {
            "name": "web",
            "command": ["sleep", "1d"],
            "resources": {"gpus": 1},
            "ports": [{"port": 8000, "protocol": "http"}],
            "volume_bytes": 1 << 30,
        },
    )
    assert created.status_code == 201, created.get_json()
    reply = api.post(
        "/api/v1/agent/acquire",
        {"wait_seconds": 0, "max_assignments": 64},
        token=session,
        agent=True,
    ).get_json()
    assert len(reply["assignments"]) == 4
    kinds = set()
    for wire in reply["assignments"]:
        parsed = Assignment.from_wire(wire)
        assert parsed.task_id == wire["task_id"] and parsed.gpus == wire["gpus"]
        assert parsed.to_wire() == wire  # built through the same definition: nothing lost or added
        kinds.add((parsed.instance is not None, parsed.priority_class, parsed.cpus is not None))
    assert len(kinds) == 4
    assert set(AssignmentSchema().fields) == {f.name for f in dataclasses.fields(Assignment)}
