"""simulate-schedule takes an InstanceSpec as well as a JobSpec, and reserves nothing."""


def _simulate(api, body, expect=200):
    resp = api.post("/api/v1/cluster/simulate-schedule", body)
    assert resp.status_code == expect, resp.get_json()
    return resp.get_json()


def test_an_instance_spec_with_ports_and_a_volume_is_simulated_like_its_run(api):
    api.create_fleet()
    node_id, _ = api.ready_node(api.create_join_token(), "a", gpu_count=2)
    spec = {
        "name": "notebook",
        "command": ["sleep", "600"],
        "resources": {"gpus": 2},
        "ports": [{"port": 8888, "protocol": "http"}],
        "volume_bytes": 10 << 30,
    }
    result = _simulate(api, spec)
    assert result["schedulable"] and [r["node_id"] for r in result["placement"]] == [node_id]
    assert len(result["placement"][0]["gpus"]) == 2
    assert api.get("/api/v1/cluster/status").get_json()["gpu"]["used"] == 0  # nothing reserved

    too_big = _simulate(api, dict(spec, resources={"gpus": 4}))
    assert not too_big["schedulable"] and too_big["filter_detail"]
    # An image needs a node whose container runtime works: this one reported none.
    image = _simulate(
        api,
        {"kind": "instance", "name": "web", "image": "localhost/app:1", "resources": {"gpus": 1}},
    )
    assert not image["schedulable"] and image["filter_detail"][0]["node_id"] == node_id


def test_an_instance_spec_is_checked_as_instance_creation_checks_it(api):
    # No command and no image: refused as POST /instances refuses it, in the error envelope.
    bad = _simulate(api, {"kind": "instance", "name": "x", "resources": {"gpus": 1}}, expect=400)
    assert bad["error"]["code"] == "invalid_request" and "command" in str(bad["error"]["details"])
    bad = _simulate(api, {"name": "x", "command": ["true"], "ports": [{"port": 0}]}, expect=400)
    assert "ports" in str(bad["error"]["details"])
    assert (
        _simulate(api, {"kind": "pod", "name": "x", "command": ["true"]}, expect=400)["error"][
            "code"
        ]
        == "invalid_request"
    )
    # A JobSpec stays a JobSpec: an instance-only field it does not have is refused.
    assert (
        _simulate(api, {"kind": "job", "name": "x", "command": ["true"], "ports": []}, expect=400)[
            "error"
        ]["code"]
        == "invalid_request"
    )
