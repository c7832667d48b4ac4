"""Authentication and authorization: the role table of docs/api.md on every route, token storage,
rate limits."""

import re
import sqlite3

import pytest

from tests.conftest import ApiClient, admin_client

PUBLIC = "public"
SIGN_IN = "sign-in"  # no bearer: the credential is in the body, so an empty body is a 400
LINK = "link"  # no bearer: the credential is the path's token, so an unknown one is a 404
ANY = {"admin", "operator", "submitter", "metrics", "node", "join"}
A = {"admin"}
AS = {"admin", "submitter"}  # (an operator and a viewer read what a submitter reads)
AO = {"admin", "operator"}  # node maintenance and rollouts

# docs/api.md's role table for every route fleetd serves. A route missing here fails the test.
ROLE_TABLE = {
    ("GET", "/api/v1/health"): PUBLIC,
    ("GET", "/api/v1/whoami"): ANY,
    ("GET", "/api/v1/auth/whoami"): ANY,
    ("GET", "/api/v1/auth/providers"): A,
    ("GET", "/api/v1/auth/providers/{name}"): A,
    ("PUT", "/api/v1/auth/providers/{name}"): A,
    ("DELETE", "/api/v1/auth/providers/{name}"): A,
    ("GET", "/api/v1/auth/bindings"): A,
    ("PUT", "/api/v1/auth/bindings"): A,
    ("POST", "/api/v1/auth/device"): SIGN_IN,
    ("POST", "/api/v1/auth/device/token"): SIGN_IN,
    ("POST", "/api/v1/auth/login"): SIGN_IN,
    ("GET", "/api/v1/auth/login/{provider}"): SIGN_IN,  # a browser's: 400 page, no such provider
    ("GET", "/api/v1/auth/callback/{provider}"): SIGN_IN,  # 400 page: no sign-in under way
    ("POST", "/api/v1/auth/refresh"): SIGN_IN,
    ("POST", "/api/v1/auth/logout"): AS | AO,
    ("GET", "/api/v1/users"): A,
    ("GET", "/api/v1/users/{login}"): AS,
    ("PATCH", "/api/v1/users/{login}"): A,
    ("DELETE", "/api/v1/users/{login}"): A,
    ("GET", "/api/v1/projects"): AS,
    ("POST", "/api/v1/projects"): A,
    ("GET", "/api/v1/projects/{key}"): AS,
    ("PATCH", "/api/v1/projects/{key}"): A,
    ("DELETE", "/api/v1/projects/{key}"): A,
    ("GET", "/api/v1/projects/{key}/members"): AS,
    ("PUT", "/api/v1/projects/{key}/members/{login}"): AS,
    ("DELETE", "/api/v1/projects/{key}/members/{login}"): AS,
    ("GET", "/api/v1/projects/{key}/service-accounts"): AS,
    ("POST", "/api/v1/projects/{key}/service-accounts"): AS,
    ("GET", "/api/v1/tokens"): A,
    ("POST", "/api/v1/tokens"): A,
    ("PATCH", "/api/v1/tokens/{token_id}"): A,
    ("DELETE", "/api/v1/tokens/{token_id}"): A,
    ("GET", "/api/v1/tokens/{token_id}/events"): A,
    ("GET", "/api/v1/fleets"): AS,
    ("POST", "/api/v1/fleets"): A,
    ("GET", "/api/v1/fleets/{name}"): AS,
    ("PATCH", "/api/v1/fleets/{name}"): A,
    ("DELETE", "/api/v1/fleets/{name}"): A,
    ("GET", "/api/v1/fleets/{name}/join-tokens"): A,
    ("POST", "/api/v1/fleets/{name}/join-tokens"): A,
    ("GET", "/api/v1/fleets/{name}/terraform-state"): A,
    ("DELETE", "/api/v1/join-tokens/{token_id}"): A,
    ("GET", "/api/v1/nodes"): AS,
    ("GET", "/api/v1/nodes/{node_id}"): AS,
    ("DELETE", "/api/v1/nodes/{node_id}"): A,
    ("POST", "/api/v1/nodes/{node_id}/cordon"): AO,
    ("POST", "/api/v1/nodes/{node_id}/uncordon"): AO,
    ("POST", "/api/v1/nodes/{node_id}/drain"): AO,
    ("POST", "/api/v1/nodes/{node_id}/undrain"): AO,
    ("POST", "/api/v1/nodes/{node_id}/revoke"): A,
    ("PATCH", "/api/v1/nodes/{node_id}"): AO,
    ("POST", "/api/v1/nodes/{node_id}/upgrade"): AO,
    ("POST", "/api/v1/nodes/{node_id}/upgrade/end"): AO,
    ("GET", "/api/v1/nodes/{node_id}/validation"): AS,
    ("POST", "/api/v1/nodes/{node_id}/validate"): AO,
    ("POST", "/api/v1/agent/validations/{validation_id}"): {"node"},
    ("GET", "/api/v1/gpus"): AS,
    ("DELETE", "/api/v1/gpus/{serial}/rma"): AO,
    ("DELETE", "/api/v1/gpus/{serial}/mig-block"): AO,
    ("GET", "/api/v1/gpus/{serial}"): AS,
    ("POST", "/api/v1/gpus/{serial}/rma"): A,
    ("GET", "/api/v1/rollouts"): AO,
    ("POST", "/api/v1/rollouts"): AO,
    ("GET", "/api/v1/rollouts/{rollout_id}"): AO,
    ("PATCH", "/api/v1/rollouts/{rollout_id}/nodes/{node_id}"): AO,
    ("POST", "/api/v1/rollouts/{rollout_id}/pause"): AO,
    ("POST", "/api/v1/rollouts/{rollout_id}/resume"): AO,
    ("POST", "/api/v1/rollouts/{rollout_id}/abort"): AO,
    ("POST", "/api/v1/rollouts/{rollout_id}/retry"): AO,
    ("GET", "/api/v1/nodes/{node_id}/events"): AS,
    ("POST", "/api/v1/nodes/{node_id}/events"): A,
    ("POST", "/api/v1/agent/register"): {"join"},
    ("POST", "/api/v1/agent/heartbeat"): {"node"},
    ("POST", "/api/v1/agent/deregister"): {"node"},
    ("GET", "/api/v1/jobs"): AS,
    ("POST", "/api/v1/jobs"): AS,
    ("GET", "/api/v1/jobs/{job_id}"): AS,
    ("POST", "/api/v1/jobs/{job_id}/cancel"): AS,
    ("GET", "/api/v1/jobs/{job_id}/result"): AS,
    ("GET", "/api/v1/jobs/{job_id}/logs"): AS,
    ("GET", "/api/v1/jobs/{job_id}/output"): AS,
    ("GET", "/api/v1/jobs/{job_id}/output/info"): AS,
    ("GET", "/api/v1/jobs/{job_id}/events"): AS,
    ("POST", "/api/v1/jobs/{job_id}/share"): AS,
    ("DELETE", "/api/v1/shares/{token}"): AS,
    ("GET", "/api/share/{token}"): LINK,
    ("GET", "/api/v1/me/notifications"): AS,
    ("POST", "/api/v1/me/notifications/read"): AS | AO,
    ("GET", "/api/v1/instances"): AS,
    ("POST", "/api/v1/instances"): AS,
    ("GET", "/api/v1/instances/{instance_id}"): AS,
    ("DELETE", "/api/v1/instances/{instance_id}"): AS,
    ("POST", "/api/v1/instances/{instance_id}/stop"): AS,
    ("POST", "/api/v1/instances/{instance_id}/resume"): AS,
    ("GET", "/api/v1/instances/{instance_id}/connection"): AS,
    (
        "POST",
        "/api/assign-host-port",
    ): AS,  # seed 000's route: the host port of an instance's declared port
    ("GET", "/api/v1/instances/{instance_id}/logs"): AS,
    ("GET", "/api/v1/instances/{instance_id}/output"): AS,
    ("GET", "/api/v1/instances/{instance_id}/output/info"): AS,
    ("GET", "/api/v1/instances/{instance_id}/events"): AS,
    ("PUT", "/api/v1/artifacts"): AS,
    ("GET", "/api/v1/artifacts/{sha256}"): AS | {"node"},
    ("POST", "/api/v1/agent/acquire"): {"node"},
    ("POST", "/api/v1/agent/tasks/{task_id}/start"): {"node"},
    ("POST", "/api/v1/agent/tasks/{task_id}/restart"): {"node"},
    ("POST", "/api/v1/agent/tasks/{task_id}/rendezvous"): {"node"},
    ("GET", "/api/v1/agent/tasks/{task_id}/rendezvous"): {"node"},
    ("POST", "/api/v1/agent/tasks/{task_id}/logs"): {"node"},
    ("PUT", "/api/v1/agent/tasks/{task_id}/output/{first_line}"): {"node"},
    ("POST", "/api/v1/agent/tasks/{task_id}/finish"): {"node"},
    ("POST", "/api/v1/agent/finish"): {"node"},
    ("GET", "/api/v1/cluster/status"): AS | {"metrics"},
    ("GET", "/api/v1/cluster/allocation"): A,
    ("POST", "/api/v1/cluster/simulate-schedule"): AS,
    ("GET", "/api/v1/gpu-types"): AS,
    ("GET", "/api/v1/gpu-types/{model}"): AS,
    ("GET", "/api/v1/config"): A,
    ("PUT", "/api/v1/gpu-types/{model}"): A,
    ("DELETE", "/api/v1/gpu-types/{model}"): A,
    ("GET", "/api/v1/usage"): AS,
    ("GET", "/api/v1/usage/idle"): A,
    ("GET", "/api/v1/budgets"): A,
    ("GET", "/api/v1/budgets/project/{key}"): AS,
    ("PUT", "/api/v1/budgets/project/{key}"): A,
    ("DELETE", "/api/v1/budgets/project/{key}"): A,
    ("GET", "/api/v1/budgets/{team}"): AS,
    ("PUT", "/api/v1/budgets/{team}"): A,
    ("DELETE", "/api/v1/budgets/{team}"): A,
    ("GET", "/api/v1/prices/storage"): AS,
    ("PUT", "/api/v1/prices/storage"): A,
    ("GET", "/api/v1/quotas"): A,
    ("PUT", "/api/v1/quotas/{team}"): A,
    ("DELETE", "/api/v1/quotas/{team}"): A,
    ("GET", "/metrics"): AS | {"metrics"},
    ("GET", "/api/v1/metrics/history"): AS | {"metrics"},
    ("POST", "/api/v1/admin/gc"): A,
    ("GET", "/api/v1/admin/tasks"): A,
    ("POST", "/api/v1/admin/tasks/{name}/run"): A,
    ("GET", "/api/v1/webhooks"): A,
    ("POST", "/api/v1/webhooks"): A,
    ("DELETE", "/api/v1/webhooks/{webhook_id}"): A,
    ("GET", "/api/v1/webhooks/{webhook_id}/deliveries"): A,
}


def openapi_routes(api):
    spec = api.get("/api/openapi.json", token=None).get_json()
    for path, item in spec["paths"].items():
        for method in item:
            if method in ("get", "post", "put", "patch", "delete"):
                yield method.upper(), path


def test_openapi_describes_exactly_the_routes_of_the_role_table(api):
    assert set(openapi_routes(api)) == set(ROLE_TABLE)


@pytest.mark.sweep  # every route as eight principals: full tier only (test.sh --fast skips it)
def test_every_route_enforces_the_role_table_of_api_md(api):
    api.create_fleet("gpu-a")
    join = api.create_join_token("gpu-a")
    tokens = {
        role: api.create_token(role) for role in ("admin", "operator", "submitter", "metrics")
    }
    revoked = api.create_token("admin", name="to-revoke")
    revoked_id = re.match(r"fla_([0-9a-f]+)\.", revoked).group(1)
    assert api.delete(f"/api/v1/tokens/{revoked_id}").status_code == 204
    machine = iter(range(10_000))

    def principals():
        yield "none", None
        yield "revoked", revoked
        yield "join", join
        yield from tokens.items()
        # A fresh node per call: deregister ends a session.
        yield "node", api.register(join, machine_id=f"matrix-{next(machine)}")["session_token"]

    checked = 0
    for method, path in sorted(ROLE_TABLE):
        url = re.sub(r"\{[a-z_]+\}", "does-not-exist", path)
        allowed = ROLE_TABLE[(method, path)]
        for who, token in principals():
            body = {} if method in ("POST", "PATCH", "PUT") else None
            resp = api.call(
                method, url, token=token, agent=path.startswith("/api/v1/agent/"), json=body
            )
            status = resp.status_code
            context = f"{method} {path} as {who}: {status} {resp.get_data(as_text=True)[:200]}"
            assert status < 500, context
            if allowed == PUBLIC:
                assert status == 200, context
            elif allowed == SIGN_IN:
                assert status == 400, context
            elif allowed == LINK:
                assert status == 404 and resp.get_json()["error"]["code"] == "not_found", context
            elif who in ("none", "revoked"):
                assert status == 401 and resp.get_json()["error"]["code"] == "unauthorized", context
            elif who in allowed or (
                who == "operator" and method == "GET" and "submitter" in allowed
            ):
                assert status not in (401, 403), context
            else:
                assert status == 403 and resp.get_json()["error"]["code"] == "forbidden", context
            checked += 1
    assert checked == len(ROLE_TABLE) * 8


def test_whoami_names_the_principal_and_role(api):
    submitter = api.create_token("submitter", name="ci-bot")
    body = api.get("/api/v1/whoami", token=submitter).get_json()
    assert body["principal"] == "token:ci-bot" and body["role"] == "submitter"


def test_tokens_have_the_documented_prefixes_and_are_shown_once(api):
    created = api.post("/api/v1/tokens", {"name": "x", "role": "metrics"}).get_json()
    assert re.fullmatch(r"fla_[0-9a-f]{20}\.[A-Za-z0-9_-]{43}", created["token"])
    listed = api.get("/api/v1/tokens").get_json()["items"]
    assert listed and all("token" not in t and "token_hash" not in t for t in listed)
    api.create_fleet()
    jt = api.post("/api/v1/fleets/gpu-a/join-tokens", {}).get_json()
    assert re.fullmatch(r"flj_[0-9a-f]{20}\.[A-Za-z0-9_-]{43}", jt["token"])
    # The secret goes in the environment, never in argv (where `ps` and shell history would show
    # it).
    assert (
        jt["join_command"]
        == f"FLEET_AGENT_JOIN_TOKEN={jt['token']} fleet-agent join --server http://localhost"
    )
    assert all(
        "token" not in t for t in api.get("/api/v1/fleets/gpu-a/join-tokens").get_json()["items"]
    )
    session = api.register(jt["token"])["session_token"]
    assert re.fullmatch(r"fln_[0-9a-f]{20}\.[A-Za-z0-9_-]{43}", session)


def test_database_never_contains_a_token_secret_in_clear(api, app):
    api.create_fleet()
    secrets = [api.create_token("submitter"), api.create_join_token()]
    secrets.append(api.register(secrets[1])["session_token"])
    secrets.append(api.token)
    path = app.extensions["fleetd"].settings.database_url.removeprefix("sqlite:///")
    con = sqlite3.connect(path)
    try:
        dump = "\n".join(con.iterdump())
    finally:
        con.close()
    assert "INSERT INTO" in dump
    for secret in secrets:
        # Neither the whole token nor its secret part may appear anywhere.
        assert secret not in dump
        assert secret.split(".", 1)[1] not in dump


def test_revoked_token_stops_working_at_once(api):
    token = api.create_token("submitter")
    token_id = token[4:24]
    assert api.get("/api/v1/fleets", token=token).status_code == 200
    assert api.delete(f"/api/v1/tokens/{token_id}").status_code == 204
    resp = api.get("/api/v1/fleets", token=token)
    assert resp.status_code == 401 and resp.get_json()["error"]["message"] == "token revoked"


def test_expired_token_is_refused(api, clock):
    token = api.post(
        "/api/v1/tokens", {"name": "short", "role": "admin", "expires_in_seconds": 60}
    ).get_json()["token"]
    assert api.get("/api/v1/whoami", token=token).status_code == 200
    clock.advance(61)
    assert api.get("/api/v1/whoami", token=token).status_code == 401


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer",
        "Bearer ",
        "Basic abc",
        "Bearer fla_nothex.x",
        "Bearer " + "fla_" + "0" * 20 + "." + "A" * 43,
    ],
)
def test_malformed_or_unknown_credentials_get_401_in_the_envelope(api, header):
    resp = api.http.get("/api/v1/whoami", headers={"Authorization": header} if header else {})
    assert resp.status_code == 401
    assert resp.get_json()["error"]["code"] == "unauthorized"
    assert resp.headers["WWW-Authenticate"] == "Bearer"


def test_repeated_failed_authentication_from_one_address_is_rate_limited(make_app, clock):
    app = make_app(auth_failure_limit=5, auth_failure_window_seconds=60)
    api = ApiClient(app)
    bad = "fla_" + "0" * 20 + "." + "B" * 43
    statuses = [api.get("/api/v1/whoami", token=bad).status_code for _ in range(5)]
    assert statuses == [401] * 5
    resp = api.get("/api/v1/whoami", token=bad)
    assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "rate_limited"
    assert 1 <= int(resp.headers["Retry-After"]) <= 60
    # Another client address is not affected.
    other = api.http.get(
        "/api/v1/whoami",
        headers={"Authorization": f"Bearer {bad}"},
        environ_base={"REMOTE_ADDR": "127.0.0.2"},
    )
    assert other.status_code == 401
    clock.advance(61)
    assert api.get("/api/v1/whoami", token=bad).status_code == 401


def test_valid_credentials_are_never_refused_by_the_failure_limiter(make_app, clock):
    app = make_app(auth_failure_limit=5, auth_failure_window_seconds=60)
    api = admin_client(app, clock)
    api.create_fleet()
    session = api.register(api.create_join_token())["session_token"]
    bad = "fla_" + "0" * 20 + "." + "B" * 43
    statuses = [api.get("/api/v1/whoami", token=bad).status_code for _ in range(30)]
    assert statuses == [401] * 5 + [429] * 25
    # The same address keeps working for every holder of a valid credential.
    assert api.get("/api/v1/whoami").status_code == 200
    assert api.heartbeat(session)["status"] == "ready"
    assert api.get("/api/v1/whoami", token=bad).status_code == 429


def test_hosts_retrying_a_spent_join_token_do_not_lock_out_their_neighbours(make_app, clock):
    app = make_app(auth_failure_limit=20, auth_failure_window_seconds=60)
    api = admin_client(app, clock)
    api.create_fleet()
    spent = api.create_join_token(max_uses=1)
    api.register(spent, machine_id="first")
    for n in range(25):
        api.register(spent, machine_id=f"late-{n}", expect=401 if n < 20 else 429)
    fresh = api.create_join_token()
    assert api.register(fresh, machine_id="neighbour")["session_token"].startswith("fln_")


def test_the_global_failure_cap_limits_failures_spread_over_many_addresses(make_app, clock):
    app = make_app(
        auth_failure_limit=5, auth_failure_global_limit=10, auth_failure_window_seconds=60
    )
    api = admin_client(app, clock)
    bad = {"Authorization": "Bearer fla_" + "0" * 20 + "." + "B" * 43}
    statuses = [
        api.http.get(
            "/api/v1/whoami", headers=bad, environ_base={"REMOTE_ADDR": f"10.0.0.{n}"}
        ).status_code
        for n in range(12)
    ]
    assert statuses == [401] * 10 + [429] * 2
    assert api.get("/api/v1/whoami").status_code == 200


def test_x_forwarded_for_names_the_client_only_behind_a_trusted_proxy(make_app, clock):
    app = make_app(
        auth_failure_limit=2,
        auth_failure_window_seconds=60,
        trusted_proxies="127.0.0.0/8, 10.9.0.0/16",
    )
    api = ApiClient(app)
    bad = "Bearer fla_" + "0" * 20 + "." + "B" * 43

    def attempt(forwarded, remote="127.0.0.1"):
        return api.http.get(
            "/api/v1/whoami",
            headers={"Authorization": bad, "X-Forwarded-For": forwarded},
            environ_base={"REMOTE_ADDR": remote},
        ).status_code

    # Through two trusted proxies: the client is the nearest untrusted hop, whatever it claims
    # before.
    assert [attempt("6.6.6.6, 192.0.2.7, 10.9.0.3") for _ in range(3)] == [401, 401, 429]
    assert attempt("192.0.2.8, 10.9.0.3") == 401  # another client behind the same proxies
    # From an untrusted peer the header is ignored: the peer itself is the client.
    assert [attempt(f"192.0.2.{n}", remote="203.0.113.5") for n in range(20, 23)] == [401, 401, 429]


def test_a_trusted_proxy_list_that_is_not_addresses_is_refused(make_settings):
    with pytest.raises(ValueError, match="trusted_proxies"):
        make_settings(trusted_proxies="10.0.0.0/8, proxy.example")


def test_agent_routes_check_the_token_before_the_protocol_header(api):
    resp = api.http.post("/api/v1/agent/heartbeat", json={"tasks": []})
    assert resp.status_code == 401 and resp.get_json()["error"]["code"] == "unauthorized"
    api.create_fleet()
    session = api.register(api.create_join_token())["session_token"]
    resp = api.post("/api/v1/agent/heartbeat", {"tasks": []}, token=session)
    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "protocol_mismatch"


def test_a_forbidden_answer_names_the_roles_that_may(api):
    submitter = api.create_token("submitter", "sub")
    err = api.post("/api/v1/fleets", {"name": "x"}, token=submitter).get_json()["error"]
    assert err["code"] == "forbidden" and err["details"] == {
        "role": "submitter",
        "required_roles": ["admin"],
    }
