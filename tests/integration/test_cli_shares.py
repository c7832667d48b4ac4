"""`fleetd job share`, `fleetd job unshare` and `fleetd notifications` against a real `fleetd
serve`."""

import json

import pytest
import requests

from tests.integration.test_cli import run  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def test_share_a_job_read_the_link_without_a_token_and_revoke_it(run):
    made = run("token", "create", "--name", "alice", "--role", "member", "--user", "alice")
    alice = made.stdout.strip().splitlines()[-1]
    job = json.loads(run("job", "submit", "--json", "--name", "train", "--", "true").stdout)
    shared = run("job", "share", "train", "--expires-in", "1h")
    url = shared.stdout.strip()
    assert url.startswith(f"{run.url}/api/share/") and "expires" in shared.stderr
    seen = requests.get(url, timeout=10)  # no token
    assert seen.status_code == 200 and seen.json()["id"] == job["id"]
    refused = run("job", "share", job["id"], FLEETD_TOKEN=alice, expect=1)
    assert "not_found" in refused.stderr  # another owner's job
    run("job", "unshare", url)
    assert requests.get(url, timeout=10).status_code == 404
    run("job", "unshare", url)  # again: harmless


def test_notifications_list_a_cancelled_job_and_mark_it_read(run):
    job = json.loads(
        run("job", "submit", "--json", "--name", "big", "--gpus", "8", "--", "true").stdout
    )
    run("job", "cancel", job["id"])
    listed = json.loads(run("notifications", "--json", "--mark-read").stdout)
    assert [(n["kind"], n["subject"]["id"]) for n in listed] == [("job.cancelled", job["id"])]
    assert json.loads(run("notifications", "--json", "--unread").stdout) == []
    assert "job big cancelled" in run("notifications").stdout
    assert json.loads(run("notifications", "--json", "--after", str(listed[0]["id"])).stdout) == []
