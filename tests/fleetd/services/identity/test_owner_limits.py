"""Per-owner limits on a real `fleetd serve`: what an admin sets on a token (and the settings'
defaults) refuses jobs, instances, specs and artifact bytes past them with 409 limit_exceeded before
anything is stored (the database is read beside the server to see that it did not grow), concurrent
submits never pass a limit, the request rate answers 429 with Retry-After (node sessions exempt),
and whoami shows the limits and the use."""

import concurrent.futures
import json
import os
import sqlite3

import pytest

from tests.integration.test_cli import run  # noqa: F401 - the fixture
from tests.support.gpus import gpus
from tests.support.http import Http

JOB = {"name": "j", "command": ["true"], "resources": {"gpus": 0}}
INSTANCE = {"command": ["sleep", "1d"], "resources": {"gpus": 0}}


def rows(data_dir, table):
    """The rows of `table` in the server's SQLite database, read beside the server (WAL lets us)."""
    db = sqlite3.connect(f"file:{data_dir / 'fleetd.db'}?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]  # noqa: S608 - the tests' own names
    finally:
        db.close()


def spec_bytes_in_db(data_dir, token_id):
    """The bytes of the `spec` column of a token's jobs (runs of instances too) and instances, as
    stored."""
    db = sqlite3.connect(f"file:{data_dir / 'fleetd.db'}?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(
            "SELECT COALESCE(SUM(LENGTH(spec)), 0) FROM (SELECT spec, owner_token_id FROM job "
            "UNION ALL SELECT spec, owner_token_id FROM instance) WHERE owner_token_id = ?",
            (token_id,),
        ).fetchone()[0]
    finally:
        db.close()


def stored_spec_bytes(data_dir, client):
    """What whoami says a token stores of specs, checked against the database itself."""
    who = client("GET", "/api/v1/whoami", expect=200).json()
    assert who["use"]["stored_spec_bytes"] == spec_bytes_in_db(data_dir, who["token_id"]), who
    return who["use"]["stored_spec_bytes"]


def token(http, name, **limits):
    """A submitter token with these limits of its own; returns an Http client for it."""
    made = http(
        "POST",
        "/api/v1/tokens",
        expect=201,
        json={"name": name, "role": "submitter", "limits": limits},
    )
    return Http(http.url, made.json()["token"])


def refused(resp, limit, value, use):
    """The answer is 409 limit_exceeded naming the limit, its value and the use (a callable: a check
    of it)."""
    assert resp.status_code == 409, resp.text
    error = resp.json()["error"]
    details = dict(error["details"])
    seen = details.pop("use")
    assert error["code"] == "limit_exceeded" and details == {"limit": limit, "value": value}, error
    assert use(seen) if callable(use) else seen == use, error
    return error


@pytest.mark.integration  # a real fleetd serve
def test_a_tokens_limits_refuse_jobs_instances_and_specs_past_them_before_anything_is_stored(
    server, admin, data_dir
):
    http = Http(server.url, admin)
    bob = token(http, "bob", max_active_jobs=2, max_instances=1, max_spec_bytes=2000)
    first = bob("POST", "/api/v1/jobs", expect=201, json=JOB).json()
    bob("POST", "/api/v1/jobs", expect=201, json=JOB)
    before = {table: rows(data_dir, table) for table in ("job", "task", "event", "instance")}

    refused(bob("POST", "/api/v1/jobs", json=JOB), "max_active_jobs", 2, 2)
    refused(
        bob("POST", "/api/v1/jobs", json=dict(JOB, command=["echo", "x" * 3000])),
        "max_spec_bytes",
        2000,
        lambda size: 3000 < size < 4000,
    )  # the spec as stored
    assert {table: rows(data_dir, table) for table in before} == before

    bob("POST", f"/api/v1/jobs/{first['id']}/cancel", expect=200)  # an ended job frees its place
    bob("POST", "/api/v1/jobs", expect=201, json=JOB)

    bob("POST", "/api/v1/instances", expect=201, json=dict(INSTANCE, name="a"))
    instances = rows(data_dir, "instance")
    refused(bob("POST", "/api/v1/instances", json=dict(INSTANCE, name="b")), "max_instances", 1, 1)
    assert rows(data_dir, "instance") == instances

    who = bob("GET", "/api/v1/whoami", expect=200).json()
    assert who["token_id"] and who["team"] is None
    assert who["limits"] == {
        "max_active_jobs": 2,
        "max_instances": 1,
        "max_spec_bytes": 2000,
        "max_stored_spec_bytes": 1024**3,
        "max_artifact_bytes": 10 * 1024**3,
        "requests_per_second": 1000.0,
    }
    stored = who["use"].pop("stored_spec_bytes")
    assert who["use"] == {"active_jobs": 2, "instances": 1, "artifact_bytes": 0}
    assert stored == stored_spec_bytes(
        data_dir, bob
    )  # three jobs (one ended), an instance and its run

    # An admin changes them: a value sets one, null gives it back to the setting, the rest stay.
    changed = http(
        "PATCH",
        f"/api/v1/tokens/{who['token_id']}",
        expect=200,
        json={"limits": {"max_active_jobs": 3, "max_spec_bytes": None}},
    ).json()
    assert changed["limits"] == {
        "max_active_jobs": 3,
        "max_instances": 1,
        "max_spec_bytes": None,
        "max_stored_spec_bytes": None,
        "max_artifact_bytes": None,
        "requests_per_second": None,
    }
    assert "token" not in changed
    bob("POST", "/api/v1/jobs", expect=201, json=dict(JOB, command=["echo", "x" * 3000]))
    refused(bob("POST", "/api/v1/jobs", json=JOB), "max_active_jobs", 3, 3)
    assert bob("GET", "/api/v1/whoami").json()["limits"]["max_spec_bytes"] == 256 * 1024
    http("PATCH", "/api/v1/tokens/nope", expect=404, json={"limits": {}})
    assert (
        http(
            "PATCH", f"/api/v1/tokens/{who['token_id']}", json={"limits": {"max_instances": -1}}
        ).status_code
        == 400
    )
    bob(
        "PATCH",
        f"/api/v1/tokens/{who['token_id']}",
        expect=403,
        json={"limits": {"max_instances": 9}},
    )


@pytest.mark.integration  # a real fleetd serve
def test_stored_spec_bytes_count_ended_jobs_and_deleted_instances_until_the_gc_deletes_them(
    server, admin, data_dir
):
    http = Http(server.url, admin)
    bob = token(http, "bob", max_stored_spec_bytes=100_000)
    big = dict(JOB, env={"PAD": "x" * 20_000})  # a spec of about 20 KB

    # Submit and cancel: an ended job holds no place among the active ones, but its spec is still
    # stored.
    for _ in range(4):
        job = bob("POST", "/api/v1/jobs", expect=201, json=big).json()
        bob("POST", f"/api/v1/jobs/{job['id']}/cancel", expect=200)
    use = stored_spec_bytes(data_dir, bob)
    assert 80_000 < use < 100_000
    before = {table: rows(data_dir, table) for table in ("job", "task", "event", "instance")}
    error = refused(bob("POST", "/api/v1/jobs", json=big), "max_stored_spec_bytes", 100_000, use)
    assert "until the gc deletes them" in error["message"]
    # An instance stores its spec twice (its own and its first run's): about 2 x 10 KB, too many.
    refused(
        bob("POST", "/api/v1/instances", json=dict(INSTANCE, name="a", env={"PAD": "x" * 10_000})),
        "max_stored_spec_bytes",
        100_000,
        use,
    )
    assert {table: rows(data_dir, table) for table in before} == before
    assert stored_spec_bytes(data_dir, bob) == use

    # The gc deletes the ended jobs: their bytes are free again, and only theirs.
    http(
        "POST",
        "/api/v1/admin/gc",
        expect=200,
        json={"older_than_seconds": 0, "delete_jobs": True, "dry_run": False},
    )
    assert stored_spec_bytes(data_dir, bob) == 0
    inst = bob(
        "POST",
        "/api/v1/instances",
        expect=201,
        json=dict(INSTANCE, name="a", env={"PAD": "x" * 20_000}),
    )
    inst = inst.json()
    with_instance = stored_spec_bytes(data_dir, bob)
    assert 40_000 < with_instance < 45_000  # the instance's spec and its first run's
    bob("POST", f"/api/v1/instances/{inst['id']}/stop", expect=200)
    bob("POST", f"/api/v1/instances/{inst['id']}/resume", expect=200)  # a second run: a third copy
    assert 60_000 < stored_spec_bytes(data_dir, bob) < 65_000
    bob("POST", f"/api/v1/instances/{inst['id']}/stop", expect=200)
    assert bob("DELETE", f"/api/v1/instances/{inst['id']}").status_code in (202, 204)
    assert 60_000 < stored_spec_bytes(data_dir, bob) < 65_000  # deleted, not yet collected
    http(
        "POST",
        "/api/v1/admin/gc",
        expect=200,
        json={"older_than_seconds": 0, "delete_jobs": True, "dry_run": False},
    )
    assert stored_spec_bytes(data_dir, bob) == 0 and rows(data_dir, "instance") == 0


@pytest.mark.integration  # a real fleetd serve
def test_the_default_limits_refuse_a_large_spec_and_a_resume_past_the_stored_spec_bytes(
    server, admin, data_dir
):
    http = Http(server.url, admin)
    carol = token(http, "carol")
    who = carol("GET", "/api/v1/whoami", expect=200).json()
    assert (
        who["limits"]["max_spec_bytes"] == 256 * 1024
        and who["limits"]["max_stored_spec_bytes"] == 1024**3
    )
    assert who["limits"]["max_artifact_bytes"] == 10 * 1024**3
    large = {f"PAD{i}": "x" * 60_000 for i in range(5)}  # 300 KB: a request body may be 1 MiB
    refused(
        carol("POST", "/api/v1/jobs", json=dict(JOB, env=large)),
        "max_spec_bytes",
        256 * 1024,
        lambda size: 300_000 < size < 301_000,
    )
    assert rows(data_dir, "job") == 0

    # A resume stores a new run: past the owner's stored spec bytes it is refused, and nothing
    # changes.
    dan = token(http, "dan", max_stored_spec_bytes=50_000)
    inst = dan(
        "POST",
        "/api/v1/instances",
        expect=201,
        json=dict(INSTANCE, name="a", env={"PAD": "x" * 20_000}),
    )
    inst = inst.json()
    dan("POST", f"/api/v1/instances/{inst['id']}/stop", expect=200)
    use = stored_spec_bytes(data_dir, dan)
    refused(
        dan("POST", f"/api/v1/instances/{inst['id']}/resume"), "max_stored_spec_bytes", 50_000, use
    )
    assert dan("GET", f"/api/v1/instances/{inst['id']}", expect=200).json()["state"] == "stopped"
    assert stored_spec_bytes(data_dir, dan) == use
    http(
        "POST", f"/api/v1/instances/{inst['id']}/resume", expect=200
    )  # an admin's resume is not held to them
    assert stored_spec_bytes(data_dir, dan) > use


@pytest.mark.integration  # a real fleetd serve
def test_artifact_bytes_count_each_owners_uploads_as_if_not_shared_and_refuse_before_storing(
    server, admin, data_dir
):
    http = Http(server.url, admin)
    bob, carol = (
        token(http, "bob", max_artifact_bytes=1000),
        token(http, "carol", max_artifact_bytes=1000),
    )
    shared, other = b"a" * 600, b"b" * 600

    def put(client, body):
        return client(
            "PUT",
            "/api/v1/artifacts",
            data=body,
            headers={"X-Artifact-Name": "f.bin", "Content-Type": "application/octet-stream"},
        )

    assert put(bob, shared).status_code == 201
    assert put(bob, shared).status_code == 201  # the same bytes again cost nothing more
    store = data_dir / "artifacts"
    files = sorted(str(p) for p in store.rglob("*") if p.is_file())
    before = {table: rows(data_dir, table) for table in ("artifact", "artifact_upload")}
    refused(put(bob, other), "max_artifact_bytes", 1000, 600)
    assert (
        sorted(str(p) for p in store.rglob("*") if p.is_file()) == files
    )  # no file left, not even a part
    assert {table: rows(data_dir, table) for table in before} == before

    assert put(carol, shared).status_code == 201  # stored once, but counted for carol too
    assert carol("GET", "/api/v1/whoami").json()["use"]["artifact_bytes"] == 600
    refused(put(carol, other), "max_artifact_bytes", 1000, 600)
    assert os.listdir(store) and bob("GET", "/api/v1/whoami").json()["use"]["artifact_bytes"] == 600


@pytest.mark.integration  # a real fleetd serve
def test_concurrent_submits_never_pass_the_default_limit_from_the_settings(
    server_factory, admin, data_dir
):
    server = server_factory(FLEETD_LIMITS_MAX_ACTIVE_JOBS="5", FLEETD_LIMITS_MAX_INSTANCES="0")
    http = Http(server.url, admin)
    dan = token(http, "dan")
    assert dan("GET", "/api/v1/whoami").json()["limits"]["max_active_jobs"] == 5

    def submit(_):
        return Http(server.url, dan.token)("POST", "/api/v1/jobs", json=JOB).status_code

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        codes = sorted(pool.map(submit, range(24)))
    assert codes == [201] * 5 + [409] * 19
    assert rows(data_dir, "job") == 5
    refused(dan("POST", "/api/v1/instances", json=dict(INSTANCE, name="a")), "max_instances", 0, 0)
    assert rows(data_dir, "instance") == 0


@pytest.mark.integration  # a real fleetd serve
def test_the_request_rate_answers_429_with_retry_after_per_token_and_node_sessions_are_exempt(
    server_factory, admin
):
    # Every token may make five requests at once (0.01/s with a burst of 500 s); none comes back
    # within the test.
    server = server_factory(
        FLEETD_LIMITS_REQUESTS_PER_SECOND="0.01", FLEETD_LIMITS_REQUEST_BURST_SECONDS="500"
    )
    http = Http(server.url, admin)
    http("POST", "/api/v1/fleets", expect=201, json={"name": "gpu-a"})
    join = http("POST", "/api/v1/fleets/gpu-a/join-tokens", expect=201, json={}).json()["token"]
    eve = token(http, "eve", requests_per_second=1000)  # its own rate, above the setting
    for _ in range(2):
        http("GET", "/api/v1/whoami", expect=200)
    limited = http("GET", "/api/v1/whoami")
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limited"
    assert 60 <= int(limited.headers["Retry-After"]) <= 100  # about 100 s for one request at 0.01/s
    for _ in range(10):
        eve("GET", "/api/v1/whoami", expect=200)

    reg = http(
        "POST",
        "/api/v1/agent/register",
        expect=201,
        token=join,
        agent=True,
        json={
            "hostname": "h1",
            "machine_id": "m1",
            "agent_version": "0.1.0",
            "address": "10.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**34},
            "gpus": gpus(1),
        },
    ).json()
    for _ in range(10):
        http(
            "POST",
            "/api/v1/agent/heartbeat",
            expect=200,
            agent_token=reg["session_token"],
            json={"tasks": []},
        )


def test_a_tokens_bucket_refills_at_its_rate_and_says_when_the_next_request_may_come():
    from fleetd.auth import RequestRates
    from fleetd.errors import RateLimited

    rates = RequestRates(
        default_rate=2.0, burst_seconds=1.0
    )  # two requests at once, then two a second
    rates.take("a", None, now=100.0)
    rates.take("a", None, now=100.0)
    with pytest.raises(RateLimited) as refused_now:
        rates.take("a", None, now=100.0)
    assert (
        refused_now.value.headers["Retry-After"] == "1" and refused_now.value.code == "rate_limited"
    )
    rates.take("b", None, now=100.0)  # another token has a bucket of its own
    rates.take("a", None, now=100.5)  # half a second refills one request
    rates.take("c", 0, now=100.0)  # 0: no limit
    for _ in range(100):
        rates.take("c", 0, now=100.0)


@pytest.mark.integration  # a real fleetd serve
def test_the_cli_sets_a_tokens_limits_at_create_and_changes_them(run, server):  # noqa: F811
    made = json.loads(
        run(
            "token",
            "create",
            "--name",
            "ci",
            "--role",
            "submitter",
            "--max-instances",
            "3",
            "--max-spec-bytes",
            "64K",
            "--requests-per-second",
            "50",
            "--json",
        ).stdout
    )
    assert made["limits"] == {
        "max_active_jobs": None,
        "max_instances": 3,
        "max_spec_bytes": 65536,
        "max_stored_spec_bytes": None,
        "max_artifact_bytes": None,
        "requests_per_second": 50.0,
    }
    changed = json.loads(
        run(
            "token",
            "update",
            made["id"],
            "--max-active-jobs",
            "7",
            "--reset",
            "max_spec_bytes",
            "--max-stored-spec-bytes",
            "500M",
            "--json",
        ).stdout
    )
    assert changed["limits"] == {
        "max_active_jobs": 7,
        "max_instances": 3,
        "max_spec_bytes": None,
        "max_stored_spec_bytes": 500 * 1024**2,
        "max_artifact_bytes": None,
        "requests_per_second": 50.0,
    }
    who = Http(server.url, made["token"])("GET", "/api/v1/whoami", expect=200).json()
    assert who["limits"]["max_active_jobs"] == 7 and who["limits"]["max_spec_bytes"] == 256 * 1024
    assert "max_active_jobs=7" in run("token", "list").stdout
    assert "name a limit" in run("token", "update", made["id"], expect=2).stderr
    assert (
        "your use: 0/10000 active jobs, 0/100 instances, 0 B/1.0 GiB of specs, 0 B/10.0 GiB of "
        "artifacts" in run("status").stdout
    )
