"""Sign-in against a real OpenID provider (panva's oidc-provider under Node.js): the device flow a
CLI uses, an ID token exchanged for a session, binding rules applied at sign-in and at every
refresh, and every forged or misdirected token refused with 401 and nothing stored."""

import base64
import json

import pytest

from tests.conftest import admin_client
from tests.support.http import ApiClient
from tests.support.oidc_provider import LAB_RULES as RULES
from tests.support.oidc_provider import approve_device, lab_provider  # noqa: F401 - a fixture

JOB = {"name": "train", "command": ["true"], "resources": {"gpus": 0}}


@pytest.fixture
def admin(app, clock, provider):
    return provider.configure_lab(admin_client(app, clock))


def refresh(client, refresh_token):
    return client.post("/api/v1/auth/refresh", {"refresh_token": refresh_token})


def device_sign_in(client, login):
    """fleetd login's way: start, poll once (pending), the person approves, poll again."""
    started = client.post("/api/v1/auth/device", {"provider": "lab"})
    assert started.status_code == 200, started.get_json()
    code = started.get_json()["device_code"]
    pending = client.post("/api/v1/auth/device/token", {"device_code": code})
    assert (
        pending.status_code == 428
        and pending.get_json()["error"]["code"] == "authorization_pending"
    )
    approve_device(started.get_json()["verification_uri_complete"], login)
    return client.post("/api/v1/auth/device/token", {"device_code": code}), code


def test_a_device_sign_in_binds_the_user_and_a_refresh_follows_its_groups(admin, provider):
    anonymous = ApiClient(admin.app)
    signed_in, code = device_sign_in(anonymous, "alice")
    assert signed_in.status_code == 200, signed_in.get_json()
    session = signed_in.get_json()
    assert session["token"].startswith("fls_") and session["refresh_token"].startswith("flr_")
    assert (session["user"]["login"], session["user"]["role"], session["user"]["source"]) == (
        "alice",
        "member",
        "oidc",
    )
    alice = ApiClient(admin.app, session["token"])
    me = alice.get("/api/v1/auth/whoami").get_json()
    assert (me["principal"], me["auth"], me["team"]) == ("user:alice", "session", "ml")
    assert (
        me["projects"] == [{"key": "vision", "role": "member"}]
        and me["default_project"] == "vision"
    )
    assert me["user"] == {
        "login": "alice",
        "display_name": "Alice Liddell",
        "email": "alice@lab.example",
    }
    job = alice.post("/api/v1/jobs", JOB).get_json()
    assert (job["project"], job["team"], job["user"]) == ("vision", "ml", "alice")
    # A device code signs in once; its reuse makes the provider revoke what it gave, so the
    # session made with it cannot be refreshed either.
    replayed = anonymous.post("/api/v1/auth/device/token", {"device_code": code})
    assert replayed.status_code == 400
    revoked = refresh(anonymous, session["refresh_token"])
    assert (
        revoked.status_code == 401
        and "refused to refresh" in revoked.get_json()["error"]["message"]
    )

    signed_in, _ = device_sign_in(anonymous, "alice")
    session = signed_in.get_json()
    alice = ApiClient(admin.app, session["token"])
    renewed = refresh(anonymous, session["refresh_token"])
    assert renewed.status_code == 200, renewed.get_json()
    # The old session token ended with the refresh.
    assert alice.get("/api/v1/whoami").status_code == 401
    assert refresh(anonymous, session["refresh_token"]).status_code == 401
    alice = ApiClient(admin.app, renewed.get_json()["token"])
    assert alice.get("/api/v1/whoami").status_code == 200

    provider.set_account("alice", groups=["ml-vision", "ml-admins"])  # promoted in the provider
    renewed = refresh(anonymous, renewed.get_json()["refresh_token"])
    assert renewed.get_json()["user"]["role"] == "admin"
    provider.set_account("alice", groups=[])  # left the lab's groups
    refused = refresh(anonymous, renewed.get_json()["refresh_token"])
    assert (
        refused.status_code == 403 and "no binding rule" in refused.get_json()["error"]["message"]
    )
    assert (
        ApiClient(admin.app, renewed.get_json()["token"]).get("/api/v1/whoami").status_code == 401
    )


def test_a_person_no_rule_binds_gets_no_access_and_no_user(admin):
    signed_in, _ = device_sign_in(ApiClient(admin.app), "bob")
    assert (
        signed_in.status_code == 403
        and "no binding rule gives bob access" in signed_in.get_json()["error"]["message"]
    )
    assert admin.get("/api/v1/users/bob").status_code == 404


def _forged(token, header=None, claims=None, signature=None):
    head, body, sig = token.split(".")

    def encode(value):
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    def decode(segment):
        return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))

    head = encode({**decode(head), **header}) if header else head
    body = encode({**decode(body), **claims}) if claims else body
    return f"{head}.{body}.{signature if signature is not None else sig}"


def test_an_id_token_signs_in_and_forged_or_misdirected_ones_get_401(admin, provider):
    anonymous = ApiClient(admin.app)
    id_token = provider.token_for("alice")["id_token"]
    other_app = provider.token_for("alice", client_id="other-app", client_secret="other-secret")[
        "id_token"
    ]
    cases = {
        "another client's token (audience)": (other_app, "aud"),
        "a changed claim (signature)": (_forged(id_token, claims={"sub": "bob"}), "signature"),
        "alg none": (_forged(id_token, header={"alg": "none"}, signature=""), "algorithm"),
        "an HMAC algorithm": (_forged(id_token, header={"alg": "HS256"}), "algorithm"),
        "not a JWT": ("abc", "not a signed JWT"),
    }
    for name, (token, says) in cases.items():
        resp = anonymous.post("/api/v1/auth/login", {"provider": "lab", "id_token": token})
        assert resp.status_code == 401, (name, resp.get_json())
        assert says in resp.get_json()["error"]["message"], (name, resp.get_json())
    assert admin.get("/api/v1/users/alice").status_code == 404  # nothing was stored
    assert (
        anonymous.post("/api/v1/auth/login", {"provider": "lab", "access_token": "x"}).status_code
        == 400
    )

    signed_in = anonymous.post("/api/v1/auth/login", {"provider": "lab", "id_token": id_token})
    assert signed_in.status_code == 200, signed_in.get_json()
    session = signed_in.get_json()
    alice = ApiClient(admin.app, session["token"])
    assert alice.post("/api/v1/auth/logout").status_code == 204
    assert alice.get("/api/v1/whoami").status_code == 401
    assert refresh(anonymous, session["refresh_token"]).status_code == 401

    again = ApiClient(
        admin.app,
        anonymous.post("/api/v1/auth/login", {"provider": "lab", "id_token": id_token}).get_json()[
            "token"
        ],
    )
    assert admin.patch("/api/v1/users/alice", {"active": False}).status_code == 200
    assert (
        again.get("/api/v1/whoami").status_code == 401
    )  # a deactivated user's session ends at once
    refused = anonymous.post("/api/v1/auth/login", {"provider": "lab", "id_token": id_token})
    assert refused.status_code == 401 and "deactivated" in refused.get_json()["error"]["message"]


def test_a_provider_that_is_down_keeps_sessions_but_refuses_new_sign_ins(admin, provider):
    anonymous = ApiClient(admin.app)
    id_token = provider.token_for("alice")["id_token"]
    session = anonymous.post(
        "/api/v1/auth/login", {"provider": "lab", "id_token": id_token}
    ).get_json()
    provider.kill()
    assert ApiClient(admin.app, session["token"]).get("/api/v1/whoami").status_code == 200
    started = anonymous.post("/api/v1/auth/device", {"provider": "lab"})
    assert (
        started.status_code == 503 and started.get_json()["error"]["code"] == "provider_unavailable"
    )
    assert "unreachable" in started.get_json()["error"]["message"]
    listed = admin.get("/api/v1/auth/providers").get_json()["items"]
    assert listed[0]["has_client_secret"] is True and "client_secret" not in listed[0]


def test_a_workload_jwt_of_a_configured_issuer_is_a_bearer_mapped_by_the_rules(admin, provider):
    body = {"kind": "jwt", "issuer": provider.issuer, "audience": "fleetd"}
    assert admin.put("/api/v1/auth/providers/ci", body).status_code == 200
    rule = {"provider": "ci", "claim": "preferred_username", "equals": "alice", "role": "member"}
    rule["projects"] = [{"project": "vision", "role": "member"}]
    assert admin.put("/api/v1/auth/bindings", RULES + [rule]).status_code == 200
    workload = ApiClient(admin.app, provider.token_for("alice")["id_token"])
    me = workload.get("/api/v1/whoami").get_json()
    assert (me["principal"], me["auth"], me["projects"]) == (
        "user:alice",
        "jwt",
        [{"key": "vision", "role": "member"}],
    )
    assert workload.post("/api/v1/jobs", JOB).get_json()["project"] == "vision"
    assert admin.get("/api/v1/users/alice").get_json()["source"] == "jwt"
    other = provider.token_for("bob", client_id="other-app", client_secret="other-secret")
    refused = ApiClient(admin.app, other["id_token"]).get("/api/v1/whoami")
    assert refused.status_code == 401 and "aud" in refused.get_json()["error"]["message"]
    unbound = ApiClient(admin.app, provider.token_for("bob")["id_token"]).get("/api/v1/whoami")
    assert unbound.status_code == 403  # bob's token verifies, but no rule gives him a role
    assert admin.delete("/api/v1/auth/providers/ci").status_code == 204
    gone = workload.get("/api/v1/whoami")
    assert (
        gone.status_code == 401
        and "no configured jwt provider" in gone.get_json()["error"]["message"]
    )
