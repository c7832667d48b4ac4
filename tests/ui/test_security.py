"""UI sign-in, the session cookie, CSRF, and roles that match the API's exactly."""

import base64
import json
import os
import stat

import pytest

from fleetd.ui import roles
from fleetd.ui.security import load_secret_key
from tests.ui.conftest import UiClient, enrol


def _cookie(resp):
    return next(h for h in resp.headers.getlist("Set-Cookie") if h.startswith("fleetd_ui="))


def _session_payload(cookie_header):
    value = cookie_header.split(";", 1)[0].split("=", 1)[1]
    payload = value.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


# ---------------------------------------------------------------- sign-in and the cookie


def test_sign_in_sets_an_httponly_samesite_cookie_that_holds_a_session_id_not_the_token(ui, api):
    resp = ui.login(api.token)
    assert resp.headers["Location"] == "/ui/"
    cookie = _cookie(resp)
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/ui" in cookie
    assert "Secure" not in cookie  # plain HTTP here
    payload = _session_payload(cookie)
    assert len(payload["sid"]) >= 43 and set(payload) <= {"sid", "csrf", "_permanent"}
    assert api.token not in json.dumps(payload) and api.token.split(".")[1] not in cookie
    assert api.token[4:24] not in cookie  # not even the token's id
    assert "Overview" in ui.text("/ui/")


def test_cookie_is_secure_when_the_request_came_over_https(app, api):
    client = UiClient(app, base_url="https://fleetd.example")
    assert "Secure" in _cookie(client.login(api.token))
    proxied = UiClient(app)
    proxied.get("/ui/login")
    resp = proxied.post("/ui/login", {"token": api.token}, headers={"X-Forwarded-Proto": "https"})
    assert "Secure" in _cookie(resp)


@pytest.mark.parametrize(
    "token, message",
    [
        ("garbage", "malformed or unknown token"),
        (
            "fla_00000000000000000000.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "malformed or unknown token",
        ),
        ("", "paste an API token"),
    ],
)
def test_sign_in_is_refused_with_a_bad_token(ui, token, message):
    resp = ui.login(token, expect=401)
    body = resp.get_data(as_text=True)
    assert "Sign-in refused" in body and message in body
    assert ui.get("/ui/").status_code == 302  # still signed out


def test_sign_in_is_refused_for_node_and_join_tokens(ui, api):
    api.create_fleet("gpu-a")
    join = api.create_join_token("gpu-a")
    assert "not a node or join token" in ui.login(join, expect=400).get_data(as_text=True)
    session = api.register(api.create_join_token("gpu-a"))["session_token"]
    assert "not a node or join token" in ui.login(session, expect=400).get_data(as_text=True)


def test_revoked_token_ends_its_session_at_once(app, api, signed_in):
    client = UiClient(app)
    token = api.create_token("admin", name="ops")
    client.login(token)
    assert client.get("/ui/nodes").status_code == 200
    token_id = token[4:24]
    assert api.delete(f"/api/v1/tokens/{token_id}").status_code == 204
    resp = client.get("/ui/nodes")
    assert resp.status_code == 302 and resp.headers["Location"].startswith("/ui/login")


def test_sign_out_ends_the_session(admin_ui):
    admin_ui.text("/ui/")
    assert admin_ui.post("/ui/logout").status_code == 302
    assert admin_ui.get("/ui/").status_code == 302


def test_a_copy_of_the_cookie_taken_before_sign_out_signs_no_one_in(app, api):
    browser = UiClient(app)
    cookie = _cookie(browser.login(api.token)).split(";", 1)[0].split("=", 1)[1]
    thief = app.test_client()  # a copy of the cookie, replayed later from elsewhere
    thief.set_cookie("fleetd_ui", cookie, path="/ui")
    assert thief.get("/ui/nodes").status_code == 200
    browser.text("/ui/")
    assert browser.post("/ui/logout").status_code == 302
    resp = thief.get("/ui/nodes")
    assert resp.status_code == 302 and resp.headers["Location"].startswith("/ui/login")
    # Signing out of one browser leaves the token's other sessions alone.
    other = UiClient(app)
    other.login(api.token)
    assert other.get("/ui/nodes").status_code == 200


def test_expired_sessions_end_and_are_cleaned_up(app, api, clock):
    browser = UiClient(app)
    browser.login(api.token)
    clock.advance(12 * 3600 + 1)
    resp = browser.get("/ui/nodes")
    assert resp.status_code == 302
    assert api.run_task("token_cleanup")["ui_sessions"] == 1


def test_sign_in_redirects_only_inside_the_ui(ui, api):
    ui.get("/ui/login?next=//evil.example/x")
    resp = ui.post("/ui/login", {"token": api.token, "next": "//evil.example/x"})
    assert resp.headers["Location"] == "/ui/"
    ui2 = UiClient(ui.http.application)
    ui2.get("/ui/login")
    resp = ui2.post("/ui/login", {"token": api.token, "next": "/ui/nodes?status=ready"})
    assert resp.headers["Location"] == "/ui/nodes?status=ready"


def test_failed_sign_ins_are_rate_limited_like_bearer_tokens(make_app, clock):
    app = make_app(auth_failure_limit=3)
    client = UiClient(app)
    for _ in range(3):
        client.login("fla_nope", expect=401)
    resp = client.login("fla_nope", expect=429)
    assert "too many failed authentications" in resp.get_data(as_text=True)


def test_secret_key_is_created_once_per_data_dir_with_mode_0600(tmp_path):
    first = load_secret_key(str(tmp_path / "d"))
    assert load_secret_key(str(tmp_path / "d")) == first and len(first) == 64
    assert stat.S_IMODE(os.stat(tmp_path / "d" / "ui-secret").st_mode) == 0o600
    assert load_secret_key(str(tmp_path / "other")) != first


def test_session_survives_a_restart_of_fleetd(make_app, api):
    client = UiClient(make_app())
    client.login(api.token)
    cookie = client.http.get_cookie("fleetd_ui", path="/ui")
    again = UiClient(make_app())
    again.http.set_cookie("fleetd_ui", cookie.value, path="/ui")
    assert again.get("/ui/").status_code == 200


# ---------------------------------------------------------------- CSRF


def test_post_without_the_csrf_token_is_refused_and_changes_nothing(admin_ui, api):
    node_id, _ = enrol(api)
    resp = admin_ui.post(
        f"/ui/nodes/{node_id}/drain",
        {"reason": "bios", "deadline_minutes": "5", "confirm": "yes"},
        csrf=False,
    )
    assert resp.status_code == 400 and "did not come from this site" in resp.get_data(as_text=True)
    assert api.node(node_id)["status"] == "ready"
    resp = admin_ui.post(
        f"/ui/nodes/{node_id}/drain",
        {"reason": "bios", "confirm": "yes", "csrf_token": "forged"},
        csrf=False,
    )
    assert resp.status_code == 400 and api.node(node_id)["status"] == "ready"


def test_csrf_token_of_another_session_is_refused(app, api):
    node_id, _ = enrol(api)
    attacker, victim = UiClient(app), UiClient(app)
    attacker.login(api.token)
    victim.login(api.token)
    victim.get("/ui/")
    resp = victim.post(
        f"/ui/nodes/{node_id}/cordon", {"confirm": "yes", "csrf_token": attacker.csrf}, csrf=False
    )
    assert resp.status_code == 400 and api.node(node_id)["status"] == "ready"


def test_sign_in_form_needs_its_csrf_token_too(ui, api):
    resp = ui.post("/ui/login", {"token": api.token}, csrf=False)
    assert resp.status_code == 400
    assert ui.get("/ui/").status_code == 302


def test_sign_out_needs_the_csrf_token(admin_ui):
    assert admin_ui.post("/ui/logout", csrf=False).status_code == 400
    assert admin_ui.get("/ui/").status_code == 200


# ---------------------------------------------------------------- roles


ADMIN_PAGES = ["/ui/join-tokens", "/ui/api-tokens", "/ui/maintenance", "/ui/users", "/ui/sign-in"]
SUBMITTER_PAGES = ["/ui/nodes", "/ui/jobs", "/ui/gpu-types"]


def test_submitter_cannot_see_admin_pages_or_do_admin_actions(signed_in, api):
    node_id, _ = enrol(api)
    client = signed_in("submitter")
    for path in ADMIN_PAGES:
        resp = client.get(path)
        assert resp.status_code == 403, path
        assert "may not open this page" in resp.get_data(as_text=True)
    for path in SUBMITTER_PAGES + ["/ui/", f"/ui/nodes/{node_id}"]:
        assert client.get(path).status_code == 200, path
    page = client.text(f"/ui/nodes/{node_id}")
    assert "Drain…" not in page and "Revoke…" not in page
    nav = client.text("/ui/")
    assert "API tokens" not in nav and "Join tokens" not in nav and "Maintenance" not in nav
    for action in ("cordon", "drain", "undrain", "revoke"):
        resp = client.post(f"/ui/nodes/{node_id}/{action}", {"reason": "x", "confirm": "yes"})
        assert resp.status_code == 403, action
    assert client.post("/ui/join-tokens/create", {"fleet": "gpu-a"}).status_code == 403
    assert client.post("/ui/api-tokens/create", {"name": "x", "role": "admin"}).status_code == 403
    assert client.post("/ui/maintenance/liveness_sweep/run").status_code == 403
    assert (
        client.post("/ui/gpu-types/set", {"model": "X", "price_per_hour": "1"}).status_code == 403
    )
    assert api.node(node_id)["status"] == "ready"
    assert [t["name"] for t in api.get("/api/v1/tokens").get_json()["items"]] == [
        "admin",
        "submitter-token",
    ]


def test_metrics_role_sees_only_the_overview(signed_in, api):
    node_id, _ = enrol(api)
    client = signed_in("metrics")
    assert "gpu-total" in client.text("/ui/")
    for path in ADMIN_PAGES + SUBMITTER_PAGES + [f"/ui/nodes/{node_id}", "/ui/jobs/x"]:
        assert client.get(path).status_code == 403, path
    nav = client.text("/ui/")
    assert ">Nodes<" not in nav and ">Jobs<" not in nav


def test_submitter_sees_and_cancels_only_its_own_jobs(signed_in, api, app):
    enrol(api)
    submitter_token = api.create_token("submitter", name="alice")
    other = api.create_token("submitter", name="bob")
    mine = api.submit(name="mine", resources={"gpus": 8})
    from tests.conftest import ApiClient

    alice_api, bob_api = ApiClient(app, submitter_token), ApiClient(app, other)
    alice_job = alice_api.submit(name="alice-job", resources={"gpus": 8})
    bob_job = bob_api.submit(name="bob-job", resources={"gpus": 8})
    client = UiClient(app)
    client.login(submitter_token)
    page = client.text("/ui/jobs")
    assert "alice-job" in page and "bob-job" not in page and mine["id"] not in page
    assert client.get(f"/ui/jobs/{bob_job['id']}").status_code == 404
    assert client.post(f"/ui/jobs/{bob_job['id']}/cancel", {"confirm": "yes"}).status_code == 404
    assert bob_api.get(f"/api/v1/jobs/{bob_job['id']}").get_json()["state"] == "queued"
    client.get(f"/ui/jobs/{alice_job['id']}")
    assert client.post(f"/ui/jobs/{alice_job['id']}/cancel", {"confirm": "yes"}).status_code == 302
    assert alice_api.get(f"/api/v1/jobs/{alice_job['id']}").get_json()["state"] == "cancelled"


def test_every_ui_page_admits_exactly_the_roles_of_its_api_route(app):
    from fleetd.api import admin, auth, cluster, fleets, jobs, nodes, people, tokens
    from fleetd.auth import allowed_roles

    def api_roles(view, method):
        # What the API admits: the roles it names, with what they imply (a member, an operator or
        # a viewer reads what a submitter reads).
        return frozenset(allowed_roles(getattr(view, method).required_roles, method.upper()))

    expected = {
        "ui.overview": api_roles(cluster.ClusterStatus, "get"),
        "ui.node_list": api_roles(nodes.Nodes, "get"),
        "ui.node_page": api_roles(nodes.NodeById, "get"),
        "ui.job_list": api_roles(jobs.Jobs, "get"),
        "ui.job_page": api_roles(jobs.JobById, "get"),
        "ui.job_log": api_roles(jobs.JobLogs, "get"),
        "ui.join_tokens": api_roles(fleets.FleetJoinTokens, "get"),
        "ui.join_token_create": api_roles(fleets.FleetJoinTokens, "post"),
        "ui.join_token_revoke": api_roles(fleets.JoinTokenById, "delete"),
        "ui.api_tokens": api_roles(tokens.Tokens, "get"),
        "ui.api_token_create": api_roles(tokens.Tokens, "post"),
        "ui.api_token_revoke": api_roles(tokens.TokenById, "delete"),
        "ui.maintenance": api_roles(admin.BackgroundTasks, "get"),
        "ui.maintenance_run": api_roles(admin.BackgroundTaskRun, "post"),
        "ui.gpu_types": api_roles(cluster.GpuTypes, "get"),
        "ui.gpu_type_set": api_roles(cluster.GpuTypeByModel, "put"),
        "ui.profile": api_roles(people.Whoami, "get"),
        "ui.user_list": api_roles(people.Users, "get"),
        "ui.user_page": api_roles(people.Users, "get"),
        "ui.user_update": api_roles(people.UserByLogin, "patch"),
        "ui.user_active": api_roles(people.UserByLogin, "patch"),
        "ui.user_delete": api_roles(people.UserByLogin, "delete"),
        "ui.project_list": api_roles(people.Projects, "get"),
        "ui.project_create": api_roles(people.Projects, "post"),
        "ui.project_page": api_roles(people.ProjectByKey, "get"),
        "ui.project_update": api_roles(people.ProjectByKey, "patch"),
        "ui.project_delete": api_roles(people.ProjectByKey, "delete"),
        "ui.member_set": api_roles(people.Member, "put"),
        "ui.member_remove": api_roles(people.Member, "delete"),
        "ui.service_account_create": api_roles(people.ServiceAccounts, "post"),
        "ui.sign_in_settings": api_roles(auth.Providers, "get") & api_roles(auth.Bindings, "get"),
        "ui.provider_page": api_roles(auth.ProviderByName, "get"),
        "ui.provider_set": api_roles(auth.ProviderByName, "put"),
        "ui.provider_delete": api_roles(auth.ProviderByName, "delete"),
        "ui.bindings_set": api_roles(auth.Bindings, "put"),
    }
    for endpoint, allowed in expected.items():
        assert app.view_functions[endpoint].required_roles == allowed, endpoint
    assert roles.NODE_ACTIONS["drain"] == api_roles(nodes.NodeDrain, "post")
    assert roles.JOB_CANCEL == api_roles(jobs.JobCancel, "post")
    assert roles.SIMULATE == api_roles(cluster.SimulateSchedule, "post")
    # A user's roles open what the API opens to them: a member lists jobs, a viewer nodes.
    assert "member" in roles.JOBS and "viewer" in roles.NODES and "viewer" not in roles.JOB_SUBMIT


def test_api_still_needs_a_bearer_token_and_ignores_the_ui_session(admin_ui):
    resp = admin_ui.http.get("/api/v1/nodes")
    assert resp.status_code == 401 and resp.get_json()["error"]["code"] == "unauthorized"
