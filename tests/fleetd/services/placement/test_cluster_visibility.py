"""Cluster status and the UI overview show others' running work only as counts, except to admins."""

from tests.conftest import ApiClient
from tests.ui.conftest import UiClient


def _running(api, owner_token, name):
    job = ApiClient(api.app, owner_token).submit(name=name, resources={"gpus": 1})
    assert job["state"] == "running", job
    return job


def test_only_admins_see_every_running_job_others_see_their_own_and_counts(api):
    api.create_fleet()
    reg = api.register(api.create_join_token(), gpu_count=4)
    api.heartbeat(reg["session_token"])
    alice, bob, metrics = (
        api.create_token("submitter", "alice"),
        api.create_token("submitter", "bob"),
        api.create_token("metrics", "prom"),
    )
    _running(api, alice, "alice-secret-project")
    _running(api, alice, "alice-second")
    mine = _running(api, bob, "bob-job")

    every = api.get("/api/v1/cluster/status").get_json()
    assert sorted(j["name"] for j in every["active_jobs"]) == [
        "alice-second",
        "alice-secret-project",
        "bob-job",
    ]
    assert every["other_active_jobs"] == {"count": 0, "gpus": 0}

    as_bob = ApiClient(api.app, bob).get("/api/v1/cluster/status").get_json()
    assert [j["id"] for j in as_bob["active_jobs"]] == [mine["id"]]
    assert as_bob["other_active_jobs"] == {"count": 2, "gpus": 2}
    assert type(as_bob["other_active_jobs"]["count"]) is int  # a count, never 2.0
    assert "alice" not in str(as_bob)

    as_metrics = ApiClient(api.app, metrics).get("/api/v1/cluster/status").get_json()
    assert as_metrics["active_jobs"] == [] and as_metrics["other_active_jobs"] == {
        "count": 3,
        "gpus": 3,
    }
    assert as_metrics["gpu"]["used"] == 3

    ui = UiClient(api.app)
    ui.login(bob)
    page = ui.text("/ui/")
    assert (
        "bob-job" in page and "alice" not in page and "2 jobs of others running on 2 GPUs" in page
    )
    ui = UiClient(api.app)
    ui.login(api.token)
    assert "alice-secret-project" in ui.text("/ui/")


def test_a_fractional_job_counts_its_fraction_of_a_gpu(api):
    api.create_fleet()
    reg = api.register(api.create_join_token(), gpu_count=1)
    api.heartbeat(reg["session_token"])
    job = api.submit(name="quarter", resources={"gpus": 0.25})
    assert job["state"] == "running"
    [row] = api.get("/api/v1/cluster/status").get_json()["active_jobs"]
    assert row["gpus"] == 0.25
    ui = UiClient(api.app)
    ui.login(api.token)
    assert '<td class="n">0.25</td>' in ui.text("/ui/")


def test_the_allocation_view_can_be_asked_for_one_node(api):
    api.create_fleet()
    join = api.create_join_token()
    n1, _ = api.ready_node(join, "n1", gpu_count=2)
    n2, _ = api.ready_node(join, "n2", gpu_count=3)
    api.submit(resources={"gpus": 2}, node_selector={"labels": {}})
    whole = api.get("/api/v1/cluster/allocation").get_json()
    assert len(whole["gpus"]) == 5 and set(whole["nodes"]) == {n1, n2}
    one = api.get(f"/api/v1/cluster/allocation?node_id={n2}").get_json()
    assert (
        {g["node_id"] for g in one["gpus"]} == {n2}
        and len(one["gpus"]) == 3
        and set(one["nodes"]) == {n2}
    )
    assert all(a["node_id"] == n2 for a in one["allocations"])
    assert api.get("/api/v1/cluster/allocation?node_id=unknown").get_json()["gpus"] == []


def test_the_listing_holds_active_limit_of_each_kind_and_counts_them_all(api):
    api.create_fleet()
    reg = api.register(api.create_join_token(), gpu_count=4)
    api.heartbeat(reg["session_token"])
    alice, bob = api.create_token("submitter", "alice"), api.create_token("submitter", "bob")
    ids = [_running(api, alice, f"a{i}")["id"] for i in range(3)] + [_running(api, bob, "b")["id"]]

    cut = api.get("/api/v1/cluster/status?active_limit=2").get_json()
    assert [j["id"] for j in cut["active_jobs"]] == sorted(ids)[:2]  # id order: the first ones
    assert cut["active_jobs_total"] == 4 and cut["active_count"] == 4
    assert cut["active_instances"] == [] and cut["active_instances_total"] == 0
    assert cut["gpu"]["used"] == 4  # the summary counts every job, listed or not
    counts = api.get("/api/v1/cluster/status?active_limit=0").get_json()
    assert counts["active_jobs"] == [] and counts["active_jobs_total"] == 4
    whole = api.get("/api/v1/cluster/status").get_json()
    assert len(whole["active_jobs"]) == whole["active_jobs_total"] == 4

    as_alice = ApiClient(api.app, alice).get("/api/v1/cluster/status?active_limit=1").get_json()
    assert [j["id"] for j in as_alice["active_jobs"]] == [sorted(ids[:3])[0]]
    assert as_alice["active_jobs_total"] == 3  # her own, listed or not
    assert as_alice["other_active_jobs"] == {"count": 1, "gpus": 1}

    for bad in ("-1", "100001", "ten", "1.5"):
        resp = api.get(f"/api/v1/cluster/status?active_limit={bad}")
        assert resp.status_code == 400, bad
        assert resp.get_json()["error"]["code"] == "invalid_request"
