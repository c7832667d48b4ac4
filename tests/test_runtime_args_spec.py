"""POST /api/v1/instances takes runtime_args from the allow-list only, for an image, and sends them on."""


def test_runtime_args_are_checked_stored_and_sent_to_the_node(api):
    api.create_fleet()
    _node, session = api.ready_node(api.create_join_token(), "a", gpu_count=1)
    api.heartbeat(session, capabilities={"container_runtime": "podman", "containers": "ready", "isolation": "uid"})
    body = {"name": "c", "image": "localhost/app:1", "runtime_args": ["--shm-size=8g", "--init"]}
    made = api.post("/api/v1/instances", body)
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["spec"]["runtime_args"] == ["--shm-size=8g", "--init"]
    assert api.acquire(session)["instance"]["runtime_args"] == ["--shm-size=8g", "--init"]

    for bad in (["--privileged"], ["--volume=/:/host"], ["--init", "--network=host"], ["x"] * 17):
        resp = api.post("/api/v1/instances", dict(body, name="bad", runtime_args=bad))
        assert resp.status_code == 400 and "runtime_args" in str(resp.get_json()["error"]["details"]), bad
    host = api.post("/api/v1/instances", {"name": "h", "command": ["true"], "runtime_args": ["--init"]})
    assert host.status_code == 400 and "image" in str(host.get_json()["error"]["details"])
    listed = [i["name"] for i in api.get("/api/v1/instances").get_json()["items"]]
    assert listed == ["c"]  # nothing refused was stored
