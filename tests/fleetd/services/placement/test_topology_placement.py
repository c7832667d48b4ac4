"""Aligned GPU sets through the API: resources.topology, link_class in simulate-schedule, the
allocation view and job status (issue 50). The node registers the topology of an A100 PCIe box
with NVLink bridges between GPUs 0-1 and 2-3, as its agent reports it; GPUs are taken out by
the node's own health reports. Real API, the agent's side played by hand."""

from tests.fleetd.scheduler.factories import A100_NVLINK_PAIRS_X4
from tests.support.gpus import gpus

GPUS = gpus(4, model="NVIDIA A100-PCIE-40GB")
TOPOLOGY = {
    "gpus": [g["uuid"] for g in GPUS],
    "links": [list(row) for row in A100_NVLINK_PAIRS_X4],
    "nvlink_count": [[12 if c == "nvlink" else 0 for c in row] for row in A100_NVLINK_PAIRS_X4],
    "nics": [],
}


def _pairs_node(api, unhealthy=()):
    """A ready A100 node with NVLink pairs; the GPUs at the indices `unhealthy` reported faulty
    (the fleet's health policy leaves the node in service)."""
    api.create_fleet()
    api.patch("/api/v1/fleets/gpu-a", {"health_policy": {"cordon_on_gpu_fault": False}})
    reg = api.register(
        api.create_join_token(),
        machine_id="a100",
        hostname="a100",
        topology=TOPOLOGY,
        gpus=GPUS,
    )
    reports = [
        dict(g, healthy=False, health_reason="XID 79") if i in unhealthy else g
        for i, g in enumerate(GPUS)
    ]
    api.heartbeat(reg["session_token"], gpus=reports)
    return reg["node_id"]


def _simulate(api, body, expect=200):
    resp = api.post("/api/v1/cluster/simulate-schedule", body)
    assert resp.status_code == expect, resp.get_json()
    return resp.get_json()


def test_simulate_allocation_and_job_status_show_the_link_class(api):
    node_id = _pairs_node(api)
    spec = {"name": "pair", "command": ["true"], "resources": {"gpus": 2}}
    sim = _simulate(api, spec)
    [rank] = sim["placement"]
    assert rank["link_class"] == "nvlink" and "aligned" in rank["link_note"]

    job = api.submit(**spec)
    assert job["state"] == "running"
    [task] = api.job(job["id"])["tasks"]
    assert task["link_class"] == "nvlink" and "nvlink" in task["reason"]
    [alloc] = api.get("/api/v1/cluster/allocation").get_json()["allocations"]
    assert alloc["task_id"] == task["id"] and alloc["link_class"] == "nvlink"
    second = api.submit(**dict(spec, name="pair2"))
    assert api.job(second["id"])["tasks"][0]["link_class"] == "nvlink"
    assert set(api.job(second["id"])["tasks"][0]["gpus"]).isdisjoint(task["gpus"])
    assert node_id == alloc["node_id"]


def test_required_waits_for_an_aligned_set_and_says_why_preferred_takes_what_is_free(api):
    _pairs_node(api, unhealthy=(0, 2))  # GPUs 1 and 3 usable: on no common NVLink
    required = {"name": "r", "command": ["true"], "resources": {"gpus": 2, "topology": "required"}}
    sim = _simulate(api, required)
    assert not sim["schedulable"]
    [detail] = sim["filter_detail"]
    assert detail["stage"] == "topology" and "nvlink" in detail["reason"]
    waiting = api.submit(**required)
    assert waiting["state"] == "queued"
    assert "topology" in api.job(waiting["id"])["pending_reason"]

    preferred = api.submit(name="p", resources={"gpus": 2})
    [task] = api.job(preferred["id"])["tasks"]
    assert task["link_class"] == "system" and "no such set is free" in task["reason"]


def test_a_bad_topology_is_refused_in_the_error_envelope(api):
    resp = api.post(
        "/api/v1/jobs",
        {"name": "x", "command": ["true"], "resources": {"gpus": 2, "topology": "strict"}},
    )
    assert resp.status_code == 400
    body = resp.get_json()
    assert body["error"]["code"] == "invalid_request" and "topology" in str(body["error"])
    bad = _simulate(
        api,
        {"kind": "instance", "name": "x", "command": ["x"], "resources": {"topology": 1}},
        expect=400,
    )
    assert "topology" in str(bad["error"]["details"])
