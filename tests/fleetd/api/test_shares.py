"""Share links to a job: its owner (or an admin) makes one, anyone holding it reads the job's
state, outcome and output tail without a token, and nothing else; revoked, expired and unknown
links are one 404; the token is kept only hashed."""

import sqlite3

import pytest

from fleetd.credentials import hash_token
from fleetd.server import scrub_secrets
from fleetd.services.workloads.shares import TAIL_BYTES, TAIL_LINES
from tests.conftest import admin_client
from tests.support.http import ApiClient

SECRET_ENV = {"HF_TOKEN": "hf_do-not-leak"}


@pytest.fixture
def admin(app, clock):
    return admin_client(app, clock)


@pytest.fixture
def session(admin):
    """The session token of a ready node with two GPUs."""
    admin.create_fleet("gpu-a")
    return admin.ready_node(admin.create_join_token("gpu-a"), "n1")[1]


def user_client(admin, login, role="member", team=None, name=None):
    """An ApiClient holding a new token (named `name`, else the login) of the user `login`."""
    body = {"name": name or login, "role": role, "user": login, "team": team}
    resp = admin.post("/api/v1/tokens", body)
    assert resp.status_code == 201, resp.get_json()
    return ApiClient(admin.app, resp.get_json()["token"])


@pytest.fixture
def alice(admin):
    return user_client(admin, "alice")


@pytest.fixture
def bob(admin):
    return user_client(admin, "bob")


def run_job(admin, owner, session, lines=(), outcome="succeeded", exit_code=0, name="train"):
    """A job of `owner` that the node runs, writes `lines` and ends with `outcome`."""
    job = owner.submit(name=name, env=SECRET_ENV)
    assignment = admin.start_task(session)
    for start in range(0, len(lines), 1000):
        admin.task_call(session, assignment, "logs", lines=list(lines[start : start + 1000]))
    admin.task_call(session, assignment, "finish", outcome=outcome, exit_code=exit_code)
    return job


def share(client, job_id, expect=201, **body):
    resp = client.post(f"/api/v1/jobs/{job_id}/share", body)
    assert resp.status_code == expect, resp.get_json()
    return resp.get_json()


def test_the_owner_shares_a_job_that_anyone_with_the_link_reads_without_a_token(
    admin, alice, session
):
    job = run_job(admin, alice, session, [["stdout", "epoch 1"], ["stderr", "loss 0.1"]])
    made = share(alice, job["id"])
    assert set(made) == {"token", "url", "expires_at"} and made["expires_at"] is None
    assert made["url"] == f"http://localhost/api/share/{made['token']}"
    resp = alice.http.get(f"/api/share/{made['token']}")  # no Authorization header at all
    assert resp.status_code == 200, resp.get_json()
    shown = resp.get_json()
    assert (shown["id"], shown["name"], shown["state"], shown["outcome"]) == (
        job["id"],
        "train",
        "succeeded",
        "succeeded",
    )
    assert shown["exit_code"] == 0
    assert shown["tasks"] == [{"rank": 0, "state": "succeeded", "exit_code": 0}]
    assert [(line["stream"], line["text"]) for line in shown["logs"]] == [
        ("stdout", "epoch 1"),
        ("stderr", "loss 0.1"),
    ]
    assert shown["logs_truncated"] is False
    assert shown["submitted_at"] and shown["started_at"] and shown["ended_at"]
    # Only what the link is for: no spec, environment, owner, project or nodes.
    assert set(shown) == {
        "id",
        "name",
        "state",
        "outcome",
        "outcome_reason",
        "exit_code",
        "attempt",
        "submitted_at",
        "started_at",
        "ended_at",
        "tasks",
        "logs",
        "logs_truncated",
        "expires_at",
    }
    text = resp.get_data(as_text=True)
    assert "hf_do-not-leak" not in text and "alice" not in text and "HF_TOKEN" not in text


def test_a_failed_job_shows_its_exit_code_and_reason(admin, alice, session):
    job = run_job(admin, alice, session, outcome="failed", exit_code=3)
    shown = alice.http.get(f"/api/share/{share(alice, job['id'])['token']}").get_json()
    assert (shown["state"], shown["exit_code"]) == ("failed", 3)
    assert "rank 0 failed" in shown["outcome_reason"]


def test_a_running_job_can_be_shared_and_shows_no_exit_code_yet(admin, alice, session):
    job = alice.submit(name="long")
    admin.start_task(session)
    shown = alice.http.get(f"/api/share/{share(alice, job['id'])['token']}").get_json()
    assert (shown["state"], shown["exit_code"], shown["ended_at"]) == ("running", None, None)
    assert shown["tasks"] == [{"rank": 0, "state": "running", "exit_code": None}]


def test_another_member_may_not_share_or_revoke_and_does_not_learn_the_job_exists(
    admin, alice, bob, session
):
    job = run_job(admin, alice, session)
    refused = bob.post(f"/api/v1/jobs/{job['id']}/share", {})
    assert refused.status_code == 404 and refused.get_json()["error"]["code"] == "not_found"
    token = share(alice, job["id"])["token"]
    refused = bob.delete(f"/api/v1/shares/{token}")
    assert refused.status_code == 404
    assert refused.get_json()["error"]["message"] == "share link not found"
    assert alice.http.get(f"/api/share/{token}").status_code == 200  # still works


def test_a_project_viewer_reads_the_job_but_may_not_share_it(admin, alice, bob, session):
    assert admin.post("/api/v1/projects", {"key": "vision", "team": "cv"}).status_code == 201
    admin.put("/api/v1/projects/vision/members/alice", {"role": "member"})
    admin.put("/api/v1/projects/vision/members/bob", {"role": "viewer"})
    job = alice.submit(name="seen", project="vision")
    assert bob.get(f"/api/v1/jobs/{job['id']}").status_code == 200
    refused = bob.post(f"/api/v1/jobs/{job['id']}/share", {})
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "forbidden"
    token = share(alice, job["id"])["token"]
    assert bob.delete(f"/api/v1/shares/{token}").status_code == 403


def test_a_viewer_role_may_not_make_links(admin, alice, session):
    job = run_job(admin, alice, session)
    viewer = user_client(admin, "vera", role="viewer")
    resp = viewer.post(f"/api/v1/jobs/{job['id']}/share", {})
    assert resp.status_code == 403


def test_an_admin_may_share_and_revoke_another_owners_job(admin, alice, session):
    job = run_job(admin, alice, session)
    token = share(admin, job["id"])["token"]
    assert admin.http.get(f"/api/share/{token}").status_code == 200
    alices = share(alice, job["id"])["token"]
    assert admin.delete(f"/api/v1/shares/{alices}").status_code == 204
    assert admin.http.get(f"/api/share/{alices}").status_code == 404
    assert admin.http.get(f"/api/share/{token}").status_code == 200  # one link, not the other


def test_revoked_expired_and_unknown_links_are_one_and_the_same_404(admin, alice, session, clock):
    job = run_job(admin, alice, session)
    revoked = share(alice, job["id"])["token"]
    assert alice.delete(f"/api/v1/shares/{revoked}").status_code == 204
    assert alice.delete(f"/api/v1/shares/{revoked}").status_code == 204  # twice is harmless
    expiring = share(alice, job["id"], expires_in_seconds=60)
    assert expiring["expires_at"] == "2026-01-01T12:01:00.000Z"
    assert alice.http.get(f"/api/share/{expiring['token']}").status_code == 200
    clock.advance(61)
    answers = [
        alice.http.get(f"/api/share/{token}")
        for token in (revoked, expiring["token"], "x" * 43, "y" * 500)
    ]
    assert {r.status_code for r in answers} == {404}
    assert len({r.get_data() for r in answers}) == 1  # nothing tells them apart
    error = answers[0].get_json()["error"]
    assert (error["code"], error["message"]) == ("not_found", "share link not found")
    assert alice.delete(f"/api/v1/shares/{'x' * 43}").status_code == 404


def test_bad_bodies_are_refused_in_the_error_envelope(admin, alice, session):
    job = run_job(admin, alice, session)
    for body in (
        {"expires_in_seconds": 0},
        {"expires_in_seconds": 59},
        {"expires_in_seconds": 366 * 86400 + 1},
        {"expires_in_seconds": "60"},
        {"expires_in_seconds": 1.5},
        {"expires": 60},
    ):
        resp = alice.post(f"/api/v1/jobs/{job['id']}/share", body)
        assert resp.status_code == 400, (body, resp.get_json())
        assert resp.get_json()["error"]["code"] == "invalid_request"
    no_body = alice.call("POST", f"/api/v1/jobs/{job['id']}/share")
    assert no_body.status_code == 201, no_body.get_json()
    assert alice.post("/api/v1/jobs/does-not-exist/share", {}).status_code == 404


def test_the_token_is_stored_only_as_its_hash(admin, alice, session, app):
    job = run_job(admin, alice, session)
    token = share(alice, job["id"])["token"]
    path = app.extensions["fleetd"].settings.database_url.removeprefix("sqlite:///")
    con = sqlite3.connect(path)
    try:
        stored = con.execute("SELECT token_hash FROM share").fetchall()
        dump = "\n".join(con.iterdump())
    finally:
        con.close()
    assert stored == [(hash_token(token),)]
    assert token not in dump


def test_the_output_tail_is_bounded_in_lines_and_bytes(admin, alice, bob, session):
    many = [["stdout", f"line {n}"] for n in range(TAIL_LINES + 50)]
    job = run_job(admin, alice, session, many)
    shown = alice.http.get(f"/api/share/{share(alice, job['id'])['token']}").get_json()
    assert len(shown["logs"]) == TAIL_LINES and shown["logs_truncated"] is True
    assert shown["logs"][-1]["text"] == f"line {TAIL_LINES + 49}"
    assert shown["logs"][0]["text"] == "line 50"

    wide = [["stdout", f"{n:04d}" + "x" * 4000] for n in range(40)]  # 160 KB in all
    job = run_job(admin, bob, session, wide)
    shown = bob.http.get(f"/api/share/{share(bob, job['id'])['token']}").get_json()
    assert sum(len(line["text"].encode()) for line in shown["logs"]) <= TAIL_BYTES
    assert shown["logs_truncated"] is True
    assert shown["logs"][-1]["text"].startswith("0039")
    assert len(shown["logs"]) == TAIL_BYTES // 4004


def test_one_long_last_line_keeps_its_end(admin, alice, session):
    job = run_job(admin, alice, session, [["stdout", "a" * 65536], ["stdout", "b" * 65536]])
    shown = alice.http.get(f"/api/share/{share(alice, job['id'])['token']}").get_json()
    assert [line["text"] for line in shown["logs"]] == ["b" * TAIL_BYTES]
    assert shown["logs_truncated"] is True


def test_making_and_revoking_a_link_are_events_of_the_job(admin, alice, session):
    job = run_job(admin, alice, session)
    token = share(alice, job["id"], expires_in_seconds=3600)["token"]
    alice.delete(f"/api/v1/shares/{token}")
    events = alice.get(f"/api/v1/jobs/{job['id']}/events").get_json()["items"]
    shared = [e for e in events if e["kind"] in ("job.shared", "job.unshared")]
    assert [(e["kind"], e["actor"]) for e in shared] == [
        ("job.shared", "user:alice"),
        ("job.unshared", "user:alice"),
    ]
    assert "until 2026-01-01T13:00:00.000Z" in shared[0]["reason"]
    assert all(token not in e["reason"] for e in events)


def test_the_gc_forgets_ended_links_and_the_links_of_deleted_jobs(admin, alice, session, clock):
    job = run_job(admin, alice, session)
    revoked = share(alice, job["id"])["token"]
    alice.delete(f"/api/v1/shares/{revoked}")
    live = share(alice, job["id"])["token"]
    clock.advance(3600)
    counts = admin.post("/api/v1/admin/gc", {"older_than_seconds": 60, "dry_run": False})
    assert counts.get_json()["shares"] == 1
    assert admin.http.get(f"/api/share/{live}").status_code == 200
    admin.post(
        "/api/v1/admin/gc", {"older_than_seconds": 60, "delete_jobs": True, "dry_run": False}
    )
    assert admin.http.get(f"/api/share/{live}").status_code == 404


@pytest.mark.parametrize(
    "line",
    [
        '"GET /api/share/SECRET HTTP/1.1" 200',
        '"GET /api/share/SECRET?x=1 HTTP/1.1" 404',
        '"DELETE /api/v1/shares/SECRET HTTP/1.1" 204',
    ],
)
def test_access_log_lines_hide_a_share_links_token(line):
    scrubbed = scrub_secrets(line)
    assert "SECRET" not in scrubbed and "/share" in scrubbed and "[redacted]" in scrubbed
