"""MIG as a resource through the API (issue 50): a node's MIG devices as its agent reports them,
stored with its GPUs and shown on the node. Real API, the agent's side played by hand."""

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
