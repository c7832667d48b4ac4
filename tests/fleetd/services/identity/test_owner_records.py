"""What one owner records is its own, against a real `fleetd serve`: artifact names and kinds (the
bytes are stored once), and token names that name one live token (events also carry the token's
id)."""

import hashlib

import pytest
from playhouse.migrations import Runner

from fleetd.credentials import API_PREFIX, hash_token, make_token
from fleetd.db import MIGRATIONS_DIR, open_database
from tests.support.http import Http

WEIGHTS = b"bob's fine-tuned weights"


def _upload(http, token, data, name, kind=""):
    resp = http(
        "PUT",
        "/api/v1/artifacts",
        expect=201,
        token=token,
        data=data,
        headers={"X-Artifact-Name": name, "X-Artifact-Kind": kind},
    )
    return resp.json()


def _token(http, name, role="submitter"):
    return http("POST", "/api/v1/tokens", expect=201, json={"name": name, "role": role}).json()


@pytest.mark.integration  # a real fleetd serve
def test_alice_uploading_bobs_bytes_learns_nothing_of_his_name_or_kind(server, admin):
    http = Http(server.url, admin)
    alice, bob = _token(http, "alice")["token"], _token(http, "bob")["token"]
    mine = _upload(http, bob, WEIGHTS, "merger-plan-q3.safetensors", "model")
    theirs = _upload(http, alice, WEIGHTS, "a.bin")
    sha = hashlib.sha256(WEIGHTS).hexdigest()
    assert mine == {
        "sha256": sha,
        "name": "merger-plan-q3.safetensors",
        "kind": "model",
        "size": len(WEIGHTS),
    }
    assert theirs == {"sha256": sha, "name": "a.bin", "kind": "", "size": len(WEIGHTS)}

    for token, name in ((alice, "a.bin"), (bob, "merger-plan-q3.safetensors"), (admin, sha)):
        resp = http("GET", f"/api/v1/artifacts/{sha}", expect=200, token=token)
        assert resp.content == WEIGHTS and name in resp.headers["Content-Disposition"]
        assert "merger-plan" not in resp.headers["Content-Disposition"] or token == bob
    # Her second upload renames her record only; his stays.
    assert _upload(http, alice, WEIGHTS, "b.bin", "data")["name"] == "b.bin"
    assert _upload(http, bob, WEIGHTS, "merger-plan-q3.safetensors", "model")["kind"] == "model"
    carol = _token(http, "carol")["token"]
    assert http("GET", f"/api/v1/artifacts/{sha}", token=carol).status_code == 404


@pytest.mark.integration  # a real fleetd serve
def test_token_names_are_single_line_text_unique_among_live_tokens(server, admin):
    http = Http(server.url, admin)
    for name in (
        "x\nnode:0123456789abcdef0123",
        "ops\r",
        " ops",
        "ops ",
        "o\tps",
        "ops\u2028node:1",
        "op\u202es",
        "ops\u00a0",
        "\u200bops",
        "x" * 201,
        "",
    ):
        resp = http("POST", "/api/v1/tokens", json={"name": name, "role": "admin"})
        assert resp.status_code == 400, (name, resp.text)
        assert (
            resp.json()["error"]["code"] == "invalid_request"
            and "name" in resp.json()["error"]["details"]["fields"]["json"]
        )
    first = _token(http, "ops", role="admin")
    again = http("POST", "/api/v1/tokens", json={"name": "ops", "role": "submitter"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert [t["name"] for t in http("GET", "/api/v1/tokens", expect=200).json()["items"]].count(
        "ops"
    ) == 1
    http("DELETE", f"/api/v1/tokens/{first['id']}", expect=204)
    assert (
        _token(http, "ops", role="admin")["id"] != first["id"]
    )  # a revoked token's name is free again
    assert _token(http, "o'brien (ci) 日本")["name"] == "o'brien (ci) 日本"


def test_an_expired_tokens_name_is_free_again(api, clock):
    first = api.post(
        "/api/v1/tokens", {"name": "temp", "role": "submitter", "expires_in_seconds": 60}
    )
    assert first.status_code == 201
    assert api.post("/api/v1/tokens", {"name": "temp", "role": "submitter"}).status_code == 409
    clock.advance(61)
    second = api.post("/api/v1/tokens", {"name": "temp", "role": "submitter"})
    assert second.status_code == 201 and second.get_json()["id"] != first.get_json()["id"]


@pytest.mark.integration  # a real fleetd serve
def test_events_name_the_token_that_caused_them_by_id(server, admin):
    http = Http(server.url, admin)
    http("POST", "/api/v1/fleets", expect=201, json={"name": "lab"})
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={}).json()["token"]
    node = http(
        "POST",
        "/api/v1/agent/register",
        expect=201,
        agent_token=join,
        json={
            "hostname": "h",
            "machine_id": "h",
            "agent_version": "0.1.0",
            "address": "10.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**34},
            "gpus": [],
        },
    ).json()
    http(
        "POST",
        "/api/v1/agent/heartbeat",
        expect=200,
        agent_token=node["session_token"],
        json={"tasks": []},
    )

    first = _token(http, "ops", role="admin")
    http("POST", f"/api/v1/nodes/{node['node_id']}/cordon", expect=200, token=first["token"])
    http("DELETE", f"/api/v1/tokens/{first['id']}", expect=204)
    second = _token(http, "ops", role="admin")
    http("POST", f"/api/v1/nodes/{node['node_id']}/uncordon", expect=200, token=second["token"])

    events = http("GET", f"/api/v1/nodes/{node['node_id']}/events", expect=200).json()["items"]
    by_status = {e["to_status"]: e for e in events}
    assert by_status["cordoned"]["actor"] == by_status["ready"]["actor"] == "token:ops"
    assert by_status["cordoned"]["actor_token_id"] == first["id"]
    assert events[-1]["to_status"] == "ready" and events[-1]["actor_token_id"] == second["id"]
    assert all(e["actor_token_id"] is None for e in events if not e["actor"].startswith("token:"))


@pytest.mark.integration  # a real fleetd serve
def test_fleetd_upgrading_an_old_database_renames_ambiguous_tokens_and_shows_why(
    data_dir, server_factory
):
    """A database at migration 0016 with two live tokens named ops and a forged two-line name: the
    first `fleetd serve` upgrades it, and each renamed token's events say what became of it."""
    data_dir.mkdir(parents=True)
    db = open_database(f"sqlite:///{data_dir}/fleetd.db")
    admin_id, admin = make_token(API_PREFIX)
    with db.connection_context():
        Runner(db, MIGRATIONS_DIR, table_name="schema_migration").up("0016_tenant_isolation")
        for token_id, name, secret_hash, created in (
            (admin_id, "admin", hash_token(admin), "00:00"),
            ("t1", "ops", "h1", "00:01"),
            ("t2", "ops", "h2", "00:02"),
            ("t3", "x\nnode:n1", "h3", "00:03"),
        ):
            db.execute_sql(
                "INSERT INTO api_token (id, name, role, token_hash, created_at) VALUES (?, ?, "
                "'admin', ?, ?)",
                (token_id, name, secret_hash, f"2026-01-01 00:{created}"),
            )
    db.close()
    server = server_factory()
    http = Http(server.url, admin)
    names = {t["id"]: t["name"] for t in http("GET", "/api/v1/tokens", expect=200).json()["items"]}
    assert names == {admin_id: "admin", "t1": "ops", "t2": "ops-2", "t3": "x node:n1"}
    [renamed] = http("GET", "/api/v1/tokens/t2/events", expect=200).json()["items"]
    assert (renamed["kind"], renamed["subject"], renamed["actor"]) == (
        "token.renamed",
        "token/t2",
        "fleetd",
    )
    assert (
        "from 'ops' to 'ops-2'" in renamed["reason"]
        and "renamed from 'ops' to 'ops-2'" in server.log
    )
    assert http("GET", "/api/v1/tokens/t1/events", expect=200).json()["items"] == []
    assert http("GET", "/api/v1/tokens/nosuchtoken/events").status_code == 404
