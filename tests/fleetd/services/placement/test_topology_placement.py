"""Aligned GPU sets through the API: resources.topology, link_class in simulate-schedule, the
allocation view and job status (issue 50).

Nodes get their links at registration from the topology-discovery side of issue 50 (another
branch); until it is merged these tests give a 4-GPU node the links of an A100 PCIe box with
NVLink pairs 0-1 and 2-3 where the scheduler reads the cluster (ClusterState.snapshot), which is
the boundary between the two halves. After the merge, registering with a topology replaces it.
"""

import dataclasses

import pytest

from fleetd.scheduler import ClusterSnapshot
from fleetd.services.placement.cluster import ClusterState
from tests.fleetd.scheduler.factories import A100_NVLINK_PAIRS_X4


@pytest.fixture
def nvlink_pairs(monkeypatch):
    """Every 4-GPU node reads as an A100 box with NVLink pairs 0-1 and 2-3; the GPUs at the
    indices the returned dict gives for a node id read as held by work outside fleetd."""
    real = ClusterState.snapshot
    held: dict[str, tuple[int, ...]] = {}

    def with_links(self, nodes=None):
        out = []
        for n in real(self, nodes).nodes:
            if len(n.gpus) == 4:
                gpus = tuple(
                    dataclasses.replace(g, exclusive=True) if i in held.get(n.id, ()) else g
                    for i, g in enumerate(n.gpus)
                )
                n = dataclasses.replace(n, gpus=gpus, links=A100_NVLINK_PAIRS_X4)
            out.append(n)
        return ClusterSnapshot(tuple(out))

    monkeypatch.setattr(ClusterState, "snapshot", with_links)
    return held


def _simulate(api, body, expect=200):
    resp = api.post("/api/v1/cluster/simulate-schedule", body)
    assert resp.status_code == expect, resp.get_json()
    return resp.get_json()


def test_simulate_allocation_and_job_status_show_the_link_class(api, nvlink_pairs):
    api.create_fleet()
    node_id, _ = api.ready_node(api.create_join_token(), "a100", gpu_count=4)
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


def test_required_waits_for_an_aligned_set_and_says_why_preferred_takes_what_is_free(
    api, nvlink_pairs
):
    api.create_fleet()
    node_id, _ = api.ready_node(api.create_join_token(), "a100", gpu_count=4)
    nvlink_pairs[node_id] = (0, 2)  # GPUs 1 and 3 free: on no common NVLink
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
