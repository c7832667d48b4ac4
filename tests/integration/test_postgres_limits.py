"""Per-owner limits on PostgreSQL, where two transactions' checks can run side by side: the owner's
row lock makes concurrent submits and creates count one after the other, so none passes a limit."""

import concurrent.futures
import threading

import pytest

from fleetd.db import database
from tests.conftest import ApiClient
from tests.integration.test_postgres import pg_api  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def at_once(count, call):
    """call(i) from `count` threads released together; their status codes, sorted."""
    barrier = threading.Barrier(count)

    def attempt(i):
        barrier.wait(timeout=30)
        return call(i).status_code

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return sorted(pool.map(attempt, range(count)))


def test_concurrent_submits_and_creates_never_pass_an_owners_limits_on_postgres(pg_api, clock):  # noqa: F811
    made = pg_api.post(
        "/api/v1/tokens",
        {"name": "bob", "role": "submitter", "limits": {"max_active_jobs": 5, "max_instances": 2}},
    )
    assert made.status_code == 201, made.get_json()
    bob = made.get_json()["token"]

    def submit(i):
        return ApiClient(pg_api.app, bob).post(
            "/api/v1/jobs", {"name": f"j{i}", "command": ["true"], "resources": {"gpus": 0}}
        )

    def create(i):
        return ApiClient(pg_api.app, bob).post(
            "/api/v1/instances", {"name": f"i{i}", "command": ["sleep", "1d"]}
        )

    assert at_once(16, submit) == [201] * 5 + [409] * 11
    assert at_once(8, create) == [201] * 2 + [409] * 6
    use = ApiClient(pg_api.app, bob).get("/api/v1/whoami").get_json()["use"]
    stored = use.pop("stored_spec_bytes")
    assert use == {"active_jobs": 5, "instances": 2, "artifact_bytes": 0}
    # Five jobs, two instances and their first runs, counted as they were stored (an upsert on
    # PostgreSQL).
    specs = "SELECT COALESCE(SUM(LENGTH(spec)), 0) FROM {} WHERE owner_token_id = %s"
    token_id = made.get_json()["id"]
    with database.connection_context():
        held = sum(
            database.execute_sql(specs.format(table), (token_id,)).fetchone()[0]
            for table in ("job", "instance")
        )
    assert stored == held > 0

    # The gc deletes the ended jobs and takes their specs off the count.
    for job in ApiClient(pg_api.app, bob).get("/api/v1/jobs").get_json()["items"]:
        assert (
            ApiClient(pg_api.app, bob).post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
        )
    clock.advance(60)
    gc = pg_api.post(
        "/api/v1/admin/gc", {"older_than_seconds": 1, "delete_jobs": True, "dry_run": False}
    )
    assert gc.get_json()["jobs"] == 5
    with database.connection_context():
        held = sum(
            database.execute_sql(specs.format(table), (token_id,)).fetchone()[0]
            for table in ("job", "instance")
        )
    assert (
        ApiClient(pg_api.app, bob).get("/api/v1/whoami").get_json()["use"]["stored_spec_bytes"]
        == held
        < stored
    )
