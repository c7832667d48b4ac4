"""A user's notification feed: its jobs' ends (succeeded, failed, cancelled) and its team's budget
alerts, oldest first, followed with `after`, paginated, marked read; nobody else's; pruned by the
gc."""

import pytest

from tests.fleetd.api.test_shares import admin, session, user_client  # noqa: F401 - fixtures
from tests.fleetd.api.test_shares import run_job as run_shared_job
from tests.support.http import ApiClient

FEED = "/api/v1/me/notifications"


@pytest.fixture
def alice(admin):
    return user_client(admin, "alice", team="ml")


@pytest.fixture
def bob(admin):
    return user_client(admin, "bob", team="cv")


def run_job(admin, owner, session, name, outcome="succeeded", exit_code=0):
    """A job of `owner`, named `name`, that the node runs and ends with `outcome`."""
    return run_shared_job(admin, owner, session, (), outcome, exit_code, name)


def feed(client, **params):
    resp = client.get(FEED, query_string=params)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def test_a_users_jobs_that_end_appear_in_its_feed_oldest_first(admin, alice, session, clock):
    ok = run_job(admin, alice, session, "train")
    clock.advance(10)
    bad = run_job(admin, alice, session, "eval", outcome="failed", exit_code=2)
    queued = alice.submit(name="later", resources={"gpus": 8})  # never fits: stays queued
    assert len(feed(alice)["items"]) == 2  # a queued job is not news
    alice.post(f"/api/v1/jobs/{queued['id']}/cancel")
    items = feed(alice)["items"]
    assert [(n["kind"], n["subject"]) for n in items] == [
        ("job.succeeded", {"kind": "job", "id": ok["id"], "name": "train"}),
        ("job.failed", {"kind": "job", "id": bad["id"], "name": "eval"}),
        ("job.cancelled", {"kind": "job", "id": queued["id"], "name": "later"}),
    ]
    assert items[0]["text"] == "job train succeeded: every rank succeeded"
    assert items[1]["text"].startswith("job eval failed: rank 0 failed")
    assert items[0]["at"] == "2026-01-01T12:00:00.000Z"
    assert items[1]["at"] == "2026-01-01T12:00:10.000Z"
    assert [n["read"] for n in items] == [False, False, False]
    assert items[0]["id"] < items[1]["id"] < items[2]["id"]


def test_a_running_or_requeued_job_notifies_nobody(admin, alice, session):
    alice.submit(name="train", retry={"max_attempts": 2, "on": ["failed"]})
    assignment = admin.start_task(session)
    admin.task_call(session, assignment, "finish", outcome="failed", exit_code=1)  # retried
    assert feed(alice)["items"] == []


def test_every_token_of_a_user_reads_one_feed_and_other_users_see_none_of_it(
    admin, alice, bob, session
):
    run_job(admin, alice, session, "train")
    laptop = user_client(admin, "alice", name="alice laptop")
    assert [n["subject"]["name"] for n in feed(laptop)["items"]] == ["train"]
    assert feed(bob)["items"] == []
    assert feed(admin)["items"] == []  # the admin's own feed: it ran nothing
    run_job(admin, bob, session, "bobs")
    assert [n["subject"]["name"] for n in feed(bob)["items"]] == ["bobs"]
    assert [n["subject"]["name"] for n in feed(alice)["items"]] == ["train"]


def test_after_and_the_cursor_page_through_the_feed(admin, alice, session):
    for n in range(5):
        run_job(admin, alice, session, f"job-{n}")
    everything = feed(alice)["items"]
    assert len(everything) == 5
    newer = feed(alice, after=everything[2]["id"])["items"]
    assert [n["subject"]["name"] for n in newer] == ["job-3", "job-4"]
    assert feed(alice, after=everything[-1]["id"]) == {"items": [], "next_cursor": None}
    first = feed(alice, limit=2)
    assert [n["subject"]["name"] for n in first["items"]] == ["job-0", "job-1"]
    second = feed(alice, limit=2, cursor=first["next_cursor"])
    assert [n["subject"]["name"] for n in second["items"]] == ["job-2", "job-3"]
    for bad in ({"after": "x"}, {"after": -1}, {"limit": 0}, {"limit": 1001}, {"cursor": "zz"}):
        resp = alice.get(FEED, query_string=bad)
        assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "invalid_request"


def test_marking_read_up_to_an_id_touches_only_the_callers_notifications(
    admin, alice, bob, session
):
    for name in ("a", "b", "c"):
        run_job(admin, alice, session, name)
    run_job(admin, bob, session, "bobs")
    ids = [n["id"] for n in feed(alice)["items"]]
    bobs = feed(bob)["items"][0]["id"]
    resp = alice.post(f"{FEED}/read", {"up_to": ids[1]})
    assert resp.status_code == 200 and resp.get_json() == {"marked": 2}
    assert [n["read"] for n in feed(alice)["items"]] == [True, True, False]
    assert alice.post(f"{FEED}/read", {"up_to": ids[1]}).get_json() == {"marked": 0}
    assert bobs > ids[2]
    assert alice.post(f"{FEED}/read", {"up_to": bobs}).get_json() == {"marked": 1}
    assert feed(bob)["items"][0]["read"] is False  # an id of bob's marks only alice's own
    for body in ({}, {"up_to": "1"}, {"up_to": -1}, {"up_to": 1, "extra": True}):
        resp = alice.post(f"{FEED}/read", body)
        assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "invalid_request"


def test_a_metrics_token_has_no_feed_and_no_token_is_refused(admin):
    metrics = ApiClient(admin.app, admin.create_token("metrics"))
    assert metrics.get(FEED).status_code == 403
    assert admin.get(FEED, token=None).status_code == 401


def test_a_budget_threshold_notifies_the_active_users_of_the_team(
    admin, alice, bob, session, clock
):
    carol = user_client(admin, "carol", team="ml")
    assert admin.put("/api/v1/budgets/ml", {"limit_gpu_hours": 0.001}).status_code == 200
    alice.submit(name="burn", resources={"gpus": 1})
    admin.start_task(session)
    clock.advance(3600)
    admin.run_task("usage")
    alerts = [n for n in feed(alice)["items"] if n["kind"] == "budget.threshold"]
    assert [n["subject"] for n in alerts] == [{"kind": "team", "id": "ml", "name": "ml"}] * 3
    assert [n["text"].rsplit("(", 1)[1] for n in alerts] == [f"past {t} %)" for t in (50, 80, 100)]
    assert [n["kind"] for n in feed(carol)["items"]] == ["budget.threshold"] * 3
    assert feed(bob)["items"] == []  # another team
    admin.run_task("usage")  # each threshold once a month
    assert len(feed(carol)["items"]) == 3


def test_the_gc_forgets_notifications_past_their_retention(admin, alice, session, clock):
    run_job(admin, alice, session, "old")
    clock.advance(30 * 86400 + 1)
    admin.heartbeat(session)
    run_job(admin, alice, session, "recent")
    counts = admin.post("/api/v1/admin/gc", {"dry_run": False}).get_json()
    assert counts["notifications"] == 1
    assert [n["subject"]["name"] for n in feed(alice)["items"]] == ["recent"]
