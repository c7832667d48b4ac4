"""POST /api/v1/instances takes runtime_args from the allow-list only, for an image, and sends them
on."""

import pytest


def test_runtime_args_are_checked_stored_and_sent_to_the_node(api):
    api.create_fleet()
    _node, session = api.ready_node(api.create_join_token(), "a", gpu_count=1)
    api.heartbeat(
        session,
        capabilities={"container_runtime": "podman", "containers": "ready", "isolation": "uid"},
    )
    body = {"name": "c", "image": "localhost/app:1", "runtime_args": ["--shm-size=8g", "--init"]}
    made = api.post("/api/v1/instances", body)
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["spec"]["runtime_args"] == ["--shm-size=8g", "--init"]
    assert api.acquire(session)["instance"]["runtime_args"] == ["--shm-size=8g", "--init"]

    for bad in (["--privileged"], ["--volume=/:/host"], ["--init", "--network=host"], ["x"] * 17):
        resp = api.post("/api/v1/instances", dict(body, name="bad", runtime_args=bad))
        assert resp.status_code == 400 and "runtime_args" in str(
            resp.get_json()["error"]["details"]
        ), bad
    host = api.post(
        "/api/v1/instances", {"name": "h", "command": ["true"], "runtime_args": ["--init"]}
    )
    assert host.status_code == 400 and "image" in str(host.get_json()["error"]["details"])
    listed = [i["name"] for i in api.get("/api/v1/instances").get_json()["items"]]
    assert listed == ["c"]  # nothing refused was stored


def test_runtime_args_refuse_a_trailing_newline_and_a_shm_size_beyond_memory_or_one_tib(api):
    body = {"name": "c", "image": "localhost/app:1"}
    refused = [
        ["--shm-size=1g\n"],
        ["--hostname=box\n"],
        ["--workdir=/srv\n"],
        ["--init\n"],
        ["--ulimit=core=0\n"],
        ["--shm-size=1025g"],
        ["--shm-size=9999999999999g"],
    ]
    for bad in refused:
        resp = api.post("/api/v1/instances", dict(body, runtime_args=bad))
        assert resp.status_code == 400, (bad, resp.get_json())
        assert "runtime_args" in str(resp.get_json()["error"]["details"]), bad
    over = api.post(
        "/api/v1/instances",
        dict(body, runtime_args=["--shm-size=9g"], resources={"memory_bytes": 8 * 1024**3}),
    )
    assert over.status_code == 400 and "resources.memory_bytes" in str(
        over.get_json()["error"]["details"]
    )
    assert api.get("/api/v1/instances").get_json()["items"] == []
    for name, args, memory in (
        ("at-memory", ["--shm-size=8g"], 8 * 1024**3),
        ("at-cap", ["--shm-size=1024g"], 0),
    ):
        made = api.post(
            "/api/v1/instances",
            dict(body, name=name, runtime_args=args, resources={"memory_bytes": memory}),
        )
        assert made.status_code == 201, made.get_json()


def test_the_wire_refuses_what_the_schema_refuses_so_a_node_never_runs_it():
    from fleetwire.assignment import AssignedInstance

    base = {"id": "i1", "image": "localhost/app:1"}
    assert AssignedInstance.from_wire(
        dict(base, runtime_args=["--shm-size=1024g"])
    ).runtime_args == ("--shm-size=1024g",)
    for bad in (["--shm-size=1g\n"], ["--shm-size=2048g"], ["--hostname=a\n"]):
        with pytest.raises(ValueError, match="runtime_args"):
            AssignedInstance.from_wire(dict(base, runtime_args=bad))
