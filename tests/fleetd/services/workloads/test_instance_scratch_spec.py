"""An InstanceSpec's scratch_bytes (GraphQL's containerDiskInGb) is stored, shown and sent to the
node in its run's assignment, where the agent enforces it (tests/agent/test_instance_scratch.py)."""

from tests.fleetd.gql.test_graphql import gql


def test_scratch_bytes_reaches_the_assignment_and_graphql_maps_container_disk_onto_it(api):
    api.create_fleet()
    _node, session = api.ready_node(api.create_join_token(), "a", gpu_count=1)
    made = gql(
        api,
        """mutation { podFindAndDeployOnDemand(input: {name: "s", gpuCount: 1, containerDiskInGb: 2,
        dockerArgs: "sleep 100"}) { id containerDiskInGb } }""",
    )["data"]["podFindAndDeployOnDemand"]
    assert made["containerDiskInGb"] == 2
    assert api.get(f"/api/v1/instances/{made['id']}").get_json()["spec"]["scratch_bytes"] == 2 << 30
    assert api.acquire(session)["instance"]["scratch_bytes"] == 2 << 30

    rest = api.post(
        "/api/v1/instances", {"name": "r", "command": ["true"], "scratch_bytes": 1 << 20}
    )
    assert rest.status_code == 201 and rest.get_json()["spec"]["scratch_bytes"] == 1 << 20
    bad = api.post("/api/v1/instances", {"name": "b", "command": ["true"], "scratch_bytes": -1})
    assert bad.status_code == 400 and "scratch_bytes" in str(bad.get_json()["error"]["details"])
    plain = api.post("/api/v1/instances", {"name": "p", "command": ["true"]}).get_json()
    assert plain["spec"]["scratch_bytes"] == 0  # no limit
