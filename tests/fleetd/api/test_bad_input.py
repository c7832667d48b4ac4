"""Bad input gets 400/404/405/413 in the error envelope, never a 500, and changes nothing."""

import pytest

from fleetd.db import database
from tests.conftest import admin_client


def _error(resp, status, code):
    assert resp.status_code == status, resp.get_data(as_text=True)
    body = resp.get_json()
    assert set(body) == {"error"} and body["error"]["code"] == code and body["error"]["message"]
    return body["error"]


def test_malformed_json_is_invalid_request(api):
    resp = api.call(
        "POST", "/api/v1/fleets", data="{not json", headers={"Content-Type": "application/json"}
    )
    _error(resp, 400, "invalid_request")


@pytest.mark.parametrize(
    "body",
    [
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
    ],
)
def test_invalid_fleet_bodies_are_refused_and_create_nothing(api, body):
    err = _error(api.post("/api/v1/fleets", body), 400, "invalid_request")
    assert "fields" in err["details"]
    assert api.get("/api/v1/fleets").get_json()["items"] == []


@pytest.mark.parametrize(
    "body",
    [
        {"ttl_seconds": "3600"},
        {"ttl_seconds": 1.5},
        {"ttl_seconds": 10},
        {"ttl_seconds": 2**70},
        {"max_uses": 0},
        {"max_uses": True},
        {"max_uses": -1},
    ],
)
def test_invalid_join_token_bodies_are_refused(api, body):
    api.create_fleet()
    _error(api.post("/api/v1/fleets/gpu-a/join-tokens", body), 400, "invalid_request")
    assert api.get("/api/v1/fleets/gpu-a/join-tokens").get_json()["items"] == []


@pytest.mark.parametrize(
    "override",
    [
        {"machine_id": "has spaces"},
        {"resources": {"cpu_count": -1, "memory_bytes": 1}},
        {"resources": {"cpu_count": 1, "memory_bytes": 2**64}},
        {"gpus": [{"uuid": "GPU-1"}]},
        {"gpus": [{"uuid": "GPU-1", "index": 0, "model": "m", "memory_total_bytes": 1}] * 2},
        {"hostname": ""},
        {"extra": True},
    ],
)
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


@pytest.mark.parametrize(
    "query",
    [
        "cursor=!!!",
        "cursor=bm90LWpzb24",
        "cursor=WzFd",
        "limit=0",
        "limit=1001",
        "limit=ten",
        "status=sleeping",
    ],
)
def test_bad_list_parameters_are_invalid_request(api, query):
    _error(api.get(f"/api/v1/nodes?{query}"), 400, "invalid_request")


@pytest.mark.parametrize(
    "method, path",
    [
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
    ],
)
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
    assert created == {
        "name": "gpu-a",
        "description": "rack 1",
        "labels": {"zone": "eu-1"},
        "node_count": 0,
        "gpu_count": 0,
        "created_at": "2026-01-01T12:00:00.000Z",
        "availability": None,
        "health_policy": {
            "cordon_on_gpu_fault": True,
            "drain_after_seconds": 600,
            "uncordon_when_healthy": True,
        },
        "allow_root_tasks": False,
        "require_isolation": False,
        "allowed_images": ["*"],
        "validation": None,
        "task_pids_max": 4096,
        "task_memory_default_bytes": 32 * 1024**3,
        "task_path": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "task_identity": "dynamic",
        "output_cap_bytes": 1 << 30,
        "output_retention_days": 30,
        "network_topology": None,
        "mig": {"mode": "fixed"},
    }
    patched = api.patch("/api/v1/fleets/gpu-a", {"labels": {"zone": "eu-2"}}).get_json()
    assert patched["labels"] == {"zone": "eu-2"} and patched["description"] == "rack 1"
    reg = api.register(api.create_join_token("gpu-a"), gpu_count=8)
    assert api.get("/api/v1/fleets/gpu-a").get_json()["node_count"] == 1
    assert api.get("/api/v1/fleets").get_json()["items"][0]["gpu_count"] == 8
    api.delete(f"/api/v1/nodes/{reg['node_id']}")
    assert api.delete("/api/v1/fleets/gpu-a").status_code == 204
    assert api.get("/api/v1/fleets/gpu-a").status_code == 404


# ------------------------------------------------------------ hostile JSON (audit: defects 1 and 5)


def _raw(api, method, path, body, token=..., agent=False):
    return api.call(
        method,
        path,
        data=body,
        token=token,
        agent=agent,
        headers={"Content-Type": "application/json"},
    )


@pytest.mark.parametrize("gpus", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_non_finite_numbers_are_refused_everywhere_a_job_spec_goes(api, gpus):
    api.create_fleet()
    submitter = api.create_token("submitter")
    body = '{"name": "x", "command": ["true"], "resources": {"gpus": ' + gpus + "}}"
    for path in ("/api/v1/jobs", "/api/v1/cluster/simulate-schedule"):
        err = _error(_raw(api, "POST", path, body, token=submitter), 400, "invalid_request")
        assert "json" in err["details"]["fields"]
    assert api.get("/api/v1/jobs").get_json()["items"] == []


@pytest.mark.parametrize(
    "body",
    [
        # An unpaired surrogate: no database can encode it.
        '{"name": "ok", "description": "\\ud800"}',
        '{"name": "ok", "description": "\\udc00 low"}',
        '{"name": "ok", "description": "nul \\u0000"}',
        '{"name": "ok", "labels": {"k\\u0000": "v"}}',
        '{"name": "ok", "labels": {"zone": '
        + "[" * 1000
        + "]" * 1000
        + "}}",  # RecursionError before
        '{"name": "ok", "labels": {"zone": ' + "[" * 40 + "]" * 40 + "}}",
        '{"name": "ok", "x": '
        + "9" * 5000
        + "}",  # over Python's int digit limit: ValueError before
        '{"name": "ok", "x": ' + "9" * 30 + "}",
        b'{"name": "ok", "description": "\xed\xa0\x80"}',  # a surrogate encoded in the UTF-8 itself
        b'{"name": "ok", "description": "\xff"}',
    ],
)
def test_hostile_json_is_a_400_in_the_envelope_and_stores_nothing(api, body):
    _error(_raw(api, "POST", "/api/v1/fleets", body), 400, "invalid_request")
    assert api.get("/api/v1/fleets").get_json()["items"] == []


def test_hostile_json_on_registration_is_refused_without_using_the_join_token(api):
    api.create_fleet()
    join = api.create_join_token(max_uses=1)
    deep = (
        '{"hostname": "h", "machine_id": "m", "agent_version": "1", "address": "a", "labels": '
        + '{"a": ' * 1000
        + "1"
        + "}" * 1000
        + ', "resources": {"cpu_count": 1, "memory_bytes": 1}, "gpus": []}'
    )
    _error(
        _raw(api, "POST", "/api/v1/agent/register", deep, token=join, agent=True),
        400,
        "invalid_request",
    )
    api.register(join)  # still unused


def test_valid_unicode_escapes_still_pass(api):
    resp = _raw(
        api, "POST", "/api/v1/fleets", '{"name": "ok", "description": "caf\\u00e9 \\ud83d\\ude80"}'
    )
    assert resp.status_code == 201 and resp.get_json()["description"] == "café 🚀"


def test_gc_cutoffs_beyond_any_date_are_refused(api):
    for seconds in (2**63 - 1, 10**12):
        err = _error(
            api.post("/api/v1/admin/gc", {"older_than_seconds": seconds}), 400, "invalid_request"
        )
        assert "older_than_seconds" in err["details"]["fields"]["json"]
    assert (
        api.post("/api/v1/admin/gc", {"older_than_seconds": 100 * 365 * 86400}).status_code == 200
    )


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/gpu-types/H100%00x",
        "/api/v1/quotas/team%00a",
        "/api/v1/fleets/a%00b",
        "/api/v1/jobs?owner=a%00b",
    ],
)
def test_nul_in_a_path_or_query_is_refused(api, path):
    method = "PUT" if "gpu-types" in path or "quotas" in path else "GET"
    body = {"priority_class": "any", "max_gpus": 1} if "quotas" in path else {}
    _error(api.call(method, path, json=body), 400, "invalid_request")
    assert api.get("/api/v1/gpu-types").get_json()["items"] == []
    assert api.get("/api/v1/quotas").get_json()["items"] == []


def test_a_job_the_scheduler_cannot_evaluate_is_set_aside_and_the_others_still_run(api, clock):
    from fleetd.models import Job, Task, new_id

    api.create_fleet()
    reg = api.register(api.create_join_token())
    api.heartbeat(reg["session_token"])
    api.post(f"/api/v1/nodes/{reg['node_id']}/cordon")  # nothing places until both jobs are queued
    good = api.submit(name="good", resources={"gpus": 1})
    with database.connection_context():  # what the API let through before: a NaN in a stored spec
        row = Job.get_by_id(good["id"])
        bad = Job.create(
            **{
                **row.__data__,
                "id": "0" + new_id()[1:],
                "name": "bad",
                "spec": {**row.spec, "resources": {**row.spec["resources"], "gpus": float("nan")}},
            }
        )
        Task.create(id=new_id(), job=bad.id, rank=0, state="pending", gpus=[])
    api.post(f"/api/v1/nodes/{reg['node_id']}/uncordon")  # the bad job sorts first
    api.run_task("scheduling")
    assert api.get(f"/api/v1/jobs/{good['id']}").get_json()["state"] == "running"
    stuck = api.get(f"/api/v1/jobs/{bad.id}").get_json()
    assert stuck["state"] == "queued" and stuck["pending_reason"].startswith(
        "set aside: fleetd cannot evaluate"
    )


def test_answers_carrying_a_new_secret_are_not_stored_by_caches(api):
    api.create_fleet()
    answers = [
        api.post("/api/v1/tokens", {"name": "ci", "role": "submitter"}),
        api.post("/api/v1/fleets/gpu-a/join-tokens", {}),
    ]
    join = answers[-1].get_json()["token"]
    answers.append(
        api.post(
            "/api/v1/agent/register",
            {
                "hostname": "h",
                "machine_id": "m",
                "agent_version": "1",
                "address": "a",
                "resources": {"cpu_count": 1, "memory_bytes": 1},
                "gpus": [],
            },
            token=join,
            agent=True,
        )
    )
    for resp in answers:
        assert resp.status_code == 201 and resp.headers["Cache-Control"] == "no-store"


def test_the_api_docs_page_has_a_strict_csp_and_no_inline_script(api):
    resp = api.http.get("/api/docs")
    assert resp.status_code == 200
    csp = resp.headers["Content-Security-Policy"]
    assert "script-src 'self';" in csp and "frame-ancestors 'none'" in csp
    assert resp.headers["X-Frame-Options"] == "DENY"
    page = resp.get_data(as_text=True)
    assert "<script>" not in page and '<script src="/api/docs/start.js">' in page
    for path in (
        "/api/docs/start.js",
        "/api/docs/assets/swagger-ui-bundle.js",
        "/api/openapi.json",
    ):
        assert api.http.get(path).status_code == 200


def test_routes_whose_body_is_all_optional_say_so_and_take_none(api):
    spec = api.http.get("/api/openapi.json").get_json()["paths"]
    api.create_fleet()
    for path, method, url, status in [
        ("/api/v1/fleets/{name}", "patch", "/api/v1/fleets/gpu-a", 200),
        ("/api/v1/fleets/{name}/join-tokens", "post", "/api/v1/fleets/gpu-a/join-tokens", 201),
        ("/api/v1/gpu-types/{model}", "put", "/api/v1/gpu-types/H100", 200),
        ("/api/v1/admin/gc", "post", "/api/v1/admin/gc", 200),
    ]:
        assert spec[path][method]["requestBody"]["required"] is False
        if "gpu-types" in url:
            continue  # needs a node with that model; the body is what is checked here
        assert api.call(method.upper(), url).status_code == status
    assert spec["/api/v1/fleets"]["post"]["requestBody"]["required"] is True


@pytest.mark.parametrize("value", [0, 1, "true", "yes", None])
def test_booleans_are_json_true_or_false_only(api, value):
    err = _error(api.post("/api/v1/admin/gc", {"dry_run": value}), 400, "invalid_request")
    assert "dry_run" in err["details"]["fields"]["json"]


def test_availability_is_described_by_its_shape_and_checked_by_it(api):
    schemas = api.http.get("/api/openapi.json").get_json()["components"]["schemas"]
    assert schemas["Availability"]["required"] == ["windows"]
    assert schemas["Window"]["additionalProperties"] is False
    window = {
        "timezone": "Europe/Paris",
        "windows": [{"start": "20:00", "end": "08:00", "days": ["mon"]}],
    }
    assert api.post("/api/v1/fleets", {"name": "ok", "availability": window}).status_code == 201
    for bad in (
        {"windows": []},
        {"windows": [{"start": "25:00", "end": "08:00"}]},
        {"timezone": "Mars/Olympus", "windows": [{"start": "20:00", "end": "08:00"}]},
        {"windows": [{"start": "20:00", "end": "08:00", "extra": 1}]},
    ):
        err = _error(api.patch("/api/v1/fleets/ok", {"availability": bad}), 400, "invalid_request")
        assert "availability" in err["details"]["fields"]["json"]


def test_a_body_that_is_not_json_is_refused_even_where_the_body_is_optional(api):
    resp = api.call("POST", "/api/v1/admin/gc", data=b"\x00\xff")  # no Content-Type
    assert _error(resp, 400, "invalid_request")["message"].startswith("the body must be JSON")
    resp = api.call(
        "POST",
        "/api/v1/admin/gc",
        data=b"dry_run=false",
        content_type="application/x-www-form-urlencoded",
    )
    _error(resp, 400, "invalid_request")
    assert api.call("POST", "/api/v1/admin/gc").status_code == 200  # no body at all: the defaults
    # Whitespace alone is no JSON document either, and creates nothing.
    api.create_fleet("gpu-a")
    resp = api.call(
        "POST", "/api/v1/fleets/gpu-a/join-tokens", data=b"\t", content_type="application/json"
    )
    assert _error(resp, 400, "invalid_request")["message"].startswith("the body is not valid JSON")
    assert api.get("/api/v1/fleets/gpu-a/join-tokens").get_json()["items"] == []


def test_a_nullable_nested_object_is_that_shape_or_null_in_the_document(api):
    schemas = api.http.get("/api/openapi.json").get_json()["components"]["schemas"]
    for schema, field in (("JobSpec", "retry"), ("FleetCreate", "availability")):
        branches = schemas[schema]["properties"][field]["anyOf"]
        assert {"type": "object", "nullable": True, "enum": [None]} in branches
        assert {"type": "object", "nullable": True} not in branches


@pytest.mark.parametrize(
    "path, text, key",
    [
        ("/api/v1/fleets", '{"name": "gpu-a", "name": "gpu-b"}', "name"),
        (
            "/api/v1/jobs",
            '{"name": "j", "command": ["true"], "resources": {"gpus": 0, "gpus": 8}}',
            "gpus",
        ),
        ("/api/v1/tokens", '{"name": "ci", "role": "submitter", "role": "admin"}', "role"),
    ],
)
def test_a_key_given_twice_in_one_object_is_refused_naming_the_key(api, path, text, key):
    resp = api.call("POST", path, data=text, headers={"Content-Type": "application/json"})
    err = _error(resp, 400, "invalid_request")
    assert repr(key) in err["message"] and "more than once" in err["message"], err
    assert api.get("/api/v1/fleets").get_json()["items"] == []
    assert api.get("/api/v1/jobs").get_json()["items"] == []
    assert [t["name"] for t in api.get("/api/v1/tokens").get_json()["items"]] == ["admin"]


def test_equal_keys_in_different_objects_are_fine(api):
    text = '{"name": "gpu-a", "labels": {"name": "x"}}'
    resp = api.call(
        "POST", "/api/v1/fleets", data=text, headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 201, resp.get_json()
