"""Users, projects, members and service accounts through the API: a user's tokens are one owner;
work lands in a project (given, or the user's default) and its team; project roles decide who reads
and changes a project's work; deactivating a user ends its tokens at once."""

import pytest

from tests.conftest import admin_client
from tests.support.http import ApiClient

JOB = {"name": "train", "command": ["true"], "resources": {"gpus": 0}}


@pytest.fixture
def admin(app, clock):
    return admin_client(app, clock)


def user_client(admin, name, login, role="member", team=None):
    """An ApiClient holding a new token of the user `login` (made with its first token)."""
    resp = admin.post("/api/v1/tokens", {"name": name, "role": role, "user": login, "team": team})
    assert resp.status_code == 201, resp.get_json()
    assert resp.get_json()["user_id"]
    return ApiClient(admin.app, resp.get_json()["token"])


def test_the_tokens_of_a_user_are_one_owner(admin):
    laptop = user_client(admin, "alice laptop", "alice")
    ci = user_client(admin, "alice ci", "alice")
    job = laptop.post("/api/v1/jobs", JOB).get_json()
    assert (job["project"], job["user"], job["owner"]) == ("default", "alice", "alice laptop")
    assert [j["id"] for j in ci.get("/api/v1/jobs").get_json()["items"]] == [job["id"]]
    assert ci.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
    events = admin.get(f"/api/v1/jobs/{job['id']}/events").get_json()["items"]
    assert [e["actor"] for e in events][:1] == ["user:alice"]
    me = ci.get("/api/v1/auth/whoami").get_json()
    assert (
        me["principal"] == "user:alice" and me["user"]["login"] == "alice" and me["auth"] == "token"
    )
    assert (
        me["projects"] == [{"key": "default", "role": "member"}]
        and me["default_project"] == "default"
    )
    assert (
        me["use"]["active_jobs"] == 0
    )  # the cancelled job, counted for the user whichever token asks
    assert ci.get("/api/v1/whoami").get_json() == me
    # Its profile lists the user's live tokens, never their secrets.
    assert sorted(t["name"] for t in me["tokens"]) == ["alice ci", "alice laptop"]
    assert all(
        set(t) == {"id", "name", "role", "created_at", "expires_at", "last_used_at"}
        for t in me["tokens"]
    )
    assert laptop.get("/api/v1/users/alice").get_json()["source"] == "token"
    assert laptop.get("/api/v1/users").status_code == 403


def test_work_lands_in_its_project_and_team_and_project_roles_decide_who_reads_and_changes_it(
    admin,
):
    alice = user_client(admin, "alice", "alice")
    bob = user_client(admin, "bob", "bob")
    assert (
        admin.post(
            "/api/v1/projects", {"key": "vision", "display_name": "Vision", "team": "cv"}
        ).status_code
        == 201
    )
    assert admin.post("/api/v1/projects", {"key": "vision"}).status_code == 409
    refused = alice.post("/api/v1/jobs", dict(JOB, project="vision"))
    assert refused.status_code == 403 and "not a member" in refused.get_json()["error"]["message"]
    unknown = alice.post("/api/v1/jobs", dict(JOB, project="nope"))
    assert (
        unknown.status_code == 400 and "no project 'nope'" in unknown.get_json()["error"]["message"]
    )
    assert admin.put("/api/v1/projects/vision/members/alice", {"role": "member"}).status_code == 200
    job = alice.post("/api/v1/jobs", dict(JOB, project="vision")).get_json()
    assert (job["project"], job["team"], job["user"]) == ("vision", "cv", "alice")
    assert alice.post("/api/v1/jobs", dict(JOB, project="vision", team="other")).status_code == 400
    assert bob.get(f"/api/v1/jobs/{job['id']}").status_code == 404
    assert bob.get("/api/v1/projects/vision").status_code == 404
    admin.put("/api/v1/projects/vision/members/bob", {"role": "viewer"})
    assert bob.get(f"/api/v1/jobs/{job['id']}").status_code == 200
    assert [j["id"] for j in bob.get("/api/v1/jobs").get_json()["items"]] == [job["id"]]
    assert bob.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 403
    assert bob.put("/api/v1/projects/vision/members/bob", {"role": "admin"}).status_code == 403
    assert admin.delete("/api/v1/projects/vision").status_code == 409  # it holds a queued job
    admin.put("/api/v1/projects/vision/members/bob", {"role": "admin"})
    assert bob.post(f"/api/v1/jobs/{job['id']}/cancel").get_json()["state"] == "cancelled"
    members = admin.get("/api/v1/projects/vision/members").get_json()["items"]
    assert [(m["login"], m["role"]) for m in members] == [("alice", "member"), ("bob", "admin")]
    assert [p["key"] for p in alice.get("/api/v1/projects").get_json()["items"]] == [
        "default",
        "vision",
    ]
    assert alice.patch("/api/v1/users/alice", {"default_project": "vision"}).status_code == 403
    assert (
        admin.patch("/api/v1/users/alice", {"default_project": "vision"}).get_json()[
            "default_project"
        ]
        == "vision"
    )
    assert alice.post("/api/v1/jobs", JOB).get_json()["project"] == "vision"


def test_a_service_account_submits_to_its_project_only_and_dies_with_it(admin):
    alice = user_client(admin, "alice", "alice")
    admin.post("/api/v1/projects", {"key": "vision", "team": "cv"})
    admin.put("/api/v1/projects/vision/members/alice", {"role": "admin"})
    made = alice.post(
        "/api/v1/projects/vision/service-accounts",
        {"name": "vision ci", "expires_in_seconds": 3600},
    )
    assert (
        made.status_code == 201
        and made.get_json()["token"].startswith("fla_")
        and made.get_json()["expires_at"]
    )
    ci = ApiClient(admin.app, made.get_json()["token"])
    job = ci.post("/api/v1/jobs", JOB).get_json()
    assert (job["project"], job["team"], job["user"]) == ("vision", "cv", None)
    assert ci.post("/api/v1/jobs", dict(JOB, project="default")).status_code == 403
    assert ci.get("/api/v1/whoami").get_json()["principal"] == "token:vision ci"
    listed = alice.get("/api/v1/projects/vision/service-accounts").get_json()["items"]
    assert [a["name"] for a in listed] == ["vision ci"] and "token" not in listed[0]
    assert (
        alice.get(f"/api/v1/jobs/{job['id']}").status_code == 200
    )  # the project admin reads the project's work
    alice.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert admin.delete("/api/v1/projects/vision").status_code == 204
    assert admin.delete("/api/v1/projects/default").status_code == 409  # tokens' work goes there
    assert ci.get("/api/v1/whoami").status_code == 401


def test_deactivating_a_user_ends_its_tokens_at_once_and_roles_limit_what_it_may(admin):
    alice = user_client(admin, "alice", "alice")
    viewer = user_client(admin, "vera", "vera", role="viewer")
    operator = user_client(admin, "otto", "otto", role="operator")
    job = alice.post("/api/v1/jobs", JOB).get_json()
    assert (
        viewer.get(f"/api/v1/jobs/{job['id']}").status_code == 200
    )  # a viewer reads what members read
    assert viewer.post("/api/v1/jobs", JOB).status_code == 403
    assert (
        operator.get("/api/v1/nodes").status_code == 200
        and operator.get("/api/v1/tokens").status_code == 403
    )
    gone = admin.patch("/api/v1/users/alice", {"active": False}).get_json()
    assert gone["active"] is False and gone["deactivated_at"]
    assert alice.get("/api/v1/whoami").status_code == 401
    assert admin.patch("/api/v1/users/alice", {"active": True}).get_json()["active"] is True
    assert (
        alice.get("/api/v1/whoami").status_code == 401
    )  # its tokens stay revoked: a new one is made
    assert (
        user_client(admin, "alice again", "alice").get("/api/v1/whoami").get_json()["principal"]
        == "user:alice"
    )
    assert admin.delete("/api/v1/users/vera").status_code == 204
    assert admin.get("/api/v1/users/vera").get_json()["active"] is False
    assert [u["login"] for u in admin.get("/api/v1/users?active=true").get_json()["items"]] == [
        "alice",
        "otto",
    ]
    assert (
        admin.post("/api/v1/tokens", {"name": "v2", "role": "viewer", "user": "vera"}).status_code
        == 409
    )


def test_cluster_status_names_the_project_and_user_of_each_running_job(admin):
    alice = user_client(admin, "alice laptop", "alice")
    admin.post("/api/v1/projects", {"key": "vision", "display_name": "Vision lab", "team": "cv"})
    admin.put("/api/v1/projects/vision/members/alice", {"role": "member"})
    admin.create_fleet("gpu-a")
    _, session = admin.ready_node(admin.create_join_token("gpu-a"), "host-1")
    job = alice.post("/api/v1/jobs", dict(JOB, project="vision", resources={"gpus": 1})).get_json()
    admin.run_task("scheduling")
    admin.start_task(session)
    rows = alice.get("/api/v1/cluster/status").get_json()["active_jobs"]
    assert [(r["id"], r["project_key"], r["project"], r["project_display_name"]) for r in rows] == [
        (job["id"], "vision", "vision", "Vision lab")
    ]
    assert (rows[0]["owner"], rows[0]["username"], rows[0]["user_display_name"]) == (
        "alice laptop",
        "alice",
        "alice",
    )
    viewer = user_client(admin, "vera", "vera", role="viewer")
    assert [r["id"] for r in viewer.get("/api/v1/cluster/status").get_json()["active_jobs"]] == [
        job["id"]
    ]
    bob = user_client(admin, "bob", "bob")
    seen = bob.get("/api/v1/cluster/status").get_json()
    assert seen["active_jobs"] == [] and seen["other_active_jobs"]["count"] == 1
