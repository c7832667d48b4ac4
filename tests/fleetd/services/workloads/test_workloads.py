"""Jobs and instances are distinct workloads on every surface: an instance's internal runs never
pose as jobs (job routes answer 404 for them), the cluster status and allocation name the
instance, and a preemption names the workload that caused it."""

from tests.fleetd.services.workloads.test_instances import create, finish, fleet, show, start  # noqa: F401 (fleet is a fixture)


def _run_id(api, inst):
    with api.app.app_context():
        from fleetd.models import Instance

        return Instance.get_by_id(inst["id"]).run_id


def test_job_routes_answer_404_for_the_run_of_an_instance(api, fleet):
    _, _, session = fleet
    inst = create(api, name="web")
    start(api, session)
    run = _run_id(api, inst)
    for method, path in (
        ("GET", f"/api/v1/jobs/{run}"),
        ("POST", f"/api/v1/jobs/{run}/cancel"),
        ("GET", f"/api/v1/jobs/{run}/logs"),
        ("GET", f"/api/v1/jobs/{run}/events"),
        ("GET", f"/api/v1/jobs/{run}/result"),
    ):
        resp = api.call(method, path)
        assert resp.status_code == 404, (path, resp.get_json())
        assert resp.get_json()["error"]["code"] == "not_found"
    assert show(api, inst["id"])["state"] == "running"  # the cancel above touched nothing
    assert [j["id"] for j in api.get("/api/v1/jobs").get_json()["items"]] == []


def test_the_cluster_status_lists_running_instances_apart_from_jobs_by_their_own_id(api, fleet):
    _, node, session = fleet
    inst = create(api, name="web")
    start(api, session)
    job = api.submit(name="train", resources={"gpus": 1})
    status = api.get("/api/v1/cluster/status").get_json()
    assert [j["id"] for j in status["active_jobs"]] == [job["id"]]
    assert [
        (i["id"], i["name"], i["state"], i["gpus"], i["nodes"]) for i in status["active_instances"]
    ] == [(inst["id"], "web", "running", 1, [node])]
    assert status["other_active_instances"] == {"count": 0, "gpus": 0}
    mallory = api.create_token("submitter", name="mallory")
    theirs = api.get("/api/v1/cluster/status", token=mallory).get_json()
    assert theirs["active_instances"] == [] and theirs["other_active_instances"] == {
        "count": 1,
        "gpus": 1,
    }
    assert type(theirs["other_active_instances"]["count"]) is int


def test_the_allocation_names_the_instance_that_holds_a_gpu(api, fleet):
    _, node, session = fleet
    inst = create(api, name="web")
    start(api, session)
    allocation = api.get(f"/api/v1/cluster/allocation?node_id={node}").get_json()
    assert [a["workload"] for a in allocation["allocations"]] == [
        {"kind": "instance", "id": inst["id"], "name": "web"}
    ]


def test_a_preempted_instance_is_told_which_workload_preempted_it(api, fleet):
    _, _, session = fleet
    inst = create(api, name="cheap", priority_class="spot", resources={"gpus": 2})
    a = start(api, session)
    job = api.submit(name="urgent", resources={"gpus": 2})
    shown = show(api, inst["id"])
    assert f"preempted by on-demand job urgent (id {job['id']})" in shown["status_reason"], shown
    assert shown["state"] == "interrupted" and shown["interruption"] == "preempted"
    assert shown["interrupted_by"] == {"kind": "job", "id": job["id"], "name": "urgent"}
    events = api.get(f"/api/v1/instances/{inst['id']}/events").get_json()["items"]
    assert f"preempted by on-demand job urgent (id {job['id']})" in events[-1]["reason"]
    finish(api, session, a, "cancelled")
    assert show(api, inst["id"])["interrupted_by"] == {
        "kind": "job",
        "id": job["id"],
        "name": "urgent",
    }


def test_an_instance_preempted_by_an_instance_names_that_instance_and_a_resume_forgets_it(
    api, fleet
):
    _, _, session = fleet
    cheap = create(api, name="cheap", priority_class="spot", resources={"gpus": 2})
    a = start(api, session)
    web = create(api, name="web", resources={"gpus": 2})
    shown = show(api, cheap["id"])
    assert f"preempted by on-demand instance web (id {web['id']})" in shown["status_reason"], shown
    assert shown["interrupted_by"] == {"kind": "instance", "id": web["id"], "name": "web"}
    finish(api, session, a, "cancelled")
    resumed = api.post(f"/api/v1/instances/{cheap['id']}/resume", {}).get_json()
    assert (
        resumed["state"] == "pending"
        and resumed["interrupted_by"] is None
        and resumed["interruption"] is None
    )
