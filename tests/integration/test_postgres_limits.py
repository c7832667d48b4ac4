"""Per-owner limits on PostgreSQL, where two transactions' checks can run side by side: the owner's
row lock makes concurrent submits and creates count one after the other, so none passes a limit."""

import concurrent.futures
import threading

import pytest

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


def test_concurrent_submits_and_creates_never_pass_an_owners_limits_on_postgres(pg_api):  # noqa: F811
    made = pg_api.post("/api/v1/tokens", {"name": "bob", "role": "submitter",
                                          "limits": {"max_active_jobs": 5, "max_instances": 2}})
    assert made.status_code == 201, made.get_json()
    bob = made.get_json()["token"]

    def submit(i):
        return ApiClient(pg_api.app, bob).post("/api/v1/jobs", {"name": f"j{i}", "command": ["true"],
                                                                "resources": {"gpus": 0}})

    def create(i):
        return ApiClient(pg_api.app, bob).post("/api/v1/instances", {"name": f"i{i}", "command": ["sleep", "1d"]})

    assert at_once(16, submit) == [201] * 5 + [409] * 11
    assert at_once(8, create) == [201] * 2 + [409] * 6
    use = ApiClient(pg_api.app, bob).get("/api/v1/whoami").get_json()["use"]
    assert use == {"active_jobs": 5, "instances": 2, "artifact_bytes": 0}
