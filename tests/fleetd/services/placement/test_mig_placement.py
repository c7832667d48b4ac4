"""MIG as a resource through the API (issue 50): a node's MIG devices as its agent reports them,
stored with its GPUs and shown on the node. Real API, the agent's side played by hand."""

from fleetwire.assignment import Assignment
from tests.support.gpus import mig_gpu

SEVEN = [("1g.10gb", slot, 1) for slot in range(7)]


def test_a_node_reports_and_shows_its_mig_devices_with_profile_and_placement(api):
    api.create_fleet()
    reg = api.register(api.create_join_token(), gpus=[mig_gpu(0, SEVEN), mig_gpu(1, [])])
    node = api.get(f"/api/v1/nodes/{reg['node_id']}").get_json()
    first, second = sorted(node["gpus"], key=lambda g: g["index"])
    assert [(d["profile"], d["start"]) for d in first["mig_devices"]] == [
        ("1g.10gb", slot) for slot in range(7)
    ]
    assert second["mig_devices"] is None  # MIG enabled, no slice yet


def test_mig_devices_that_overlap_are_refused_in_the_error_envelope(api):
    api.create_fleet()
    bad = mig_gpu(0, [("3g.40gb", 0, 4), ("1g.10gb", 2, 1)])
    body = api.register(api.create_join_token(), gpus=[bad], expect=400)
    assert body["error"]["code"] == "invalid_request"
    assert "overlaps" in str(body["error"])


def _mig_node(api, gpus, fleet_mig=None):
    api.create_fleet()
    if fleet_mig is not None:
        resp = api.patch("/api/v1/fleets/gpu-a", {"mig": fleet_mig})
        assert resp.status_code == 200, resp.get_json()
    reg = api.register(api.create_join_token(), gpus=gpus)
    api.heartbeat(reg["session_token"], gpus=gpus)
    return reg["node_id"]


def test_a_mig_job_runs_on_mig_devices_shown_in_its_status_and_the_allocation(api):
    _mig_node(api, [mig_gpu(0, SEVEN)])
    job = api.submit(name="nb", resources={"mig": "1g.10gb", "gpus": 2})
    assert job["state"] == "running"
    [task] = api.job(job["id"])["tasks"]
    assert task["mig_devices"] == [
        "MIG-00000000-0000-4000-8000-000000000000",
        "MIG-00000000-0000-4000-8000-000000000001",
    ]
    [alloc] = api.get("/api/v1/cluster/allocation").get_json()["allocations"]
    assert alloc["mig_devices"] == task["mig_devices"]
    second = api.submit(name="nb2", resources={"mig": "1g.10gb"})
    [other] = api.job(second["id"])["tasks"]
    assert set(other["mig_devices"]).isdisjoint(task["mig_devices"])


def test_a_gpu_in_mig_mode_takes_no_whole_gpu_job(api):
    _mig_node(api, [mig_gpu(0, SEVEN)])
    job = api.submit(name="whole", resources={"gpus": 1})
    assert job["state"] == "queued"


def test_an_unknown_mig_profile_is_refused_in_the_error_envelope(api):
    resp = api.post(
        "/api/v1/jobs", {"name": "x", "command": ["true"], "resources": {"mig": "9g.1gb"}}
    )
    assert resp.status_code == 400
    assert "mig" in str(resp.get_json()["error"])


def test_mig_with_a_fraction_of_a_gpu_is_refused(api):
    body = {"name": "x", "command": ["true"], "resources": {"mig": "1g.10gb", "gpus": 0.5}}
    resp = api.post("/api/v1/jobs", body)
    assert resp.status_code == 400, resp.get_json()


def test_the_assignment_carries_each_mig_device_with_its_gpu_and_no_software_limit(api):
    api.create_fleet()
    gpus = [mig_gpu(0, SEVEN)]
    reg = api.register(api.create_join_token(), gpus=gpus)
    api.heartbeat(reg["session_token"], gpus=gpus)
    job = api.submit(name="nb", resources={"mig": "1g.10gb", "gpus": 2})
    assignment = api.acquire(reg["session_token"])
    Assignment.from_wire(assignment)  # what the agent accepts
    [task] = api.job(job["id"])["tasks"]
    assert assignment["gpus"] == [
        {"uuid": gpus[0]["uuid"], "mig_device": device} for device in task["mig_devices"]
    ]
    assert assignment["isolation"] == "exclusive"


def test_an_agent_that_reports_no_mig_profiles_never_gets_mig_work(api):
    """An agent older than MIG placement reports a GPU in MIG mode without its devices' profiles
    (or without mig_devices at all): it would run the task on the whole GPU, so nothing is placed
    there until it reports them."""
    api.create_fleet()
    old = mig_gpu(0, SEVEN)
    old["mig_devices"] = [{"uuid": d["uuid"], "memory_total_bytes": 1} for d in old["mig_devices"]]
    older = dict(mig_gpu(1, SEVEN))
    del older["mig_devices"]
    reg = api.register(api.create_join_token(), gpus=[old, older])
    api.heartbeat(reg["session_token"], gpus=[old, older])
    job = api.submit(name="nb", resources={"mig": "1g.10gb"})
    assert job["state"] == "queued"
    assert api.job(job["id"])["tasks"][0]["mig_devices"] == []
