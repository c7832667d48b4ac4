"""GraphQL as the GPU-cloud SDK's other calls send it: create_pod without a GPU type (deployCpuPod),
get_user, cloudType mapped to node labels, and myself { pods } past one page of the REST list."""

import pytest

from fleetd.gql import resolvers
from tests.fleetd.gql.test_graphql import MODEL, gql

# What create_pod("cpu", "localhost/app:1", instance_id="cpu3c-2-4") sends, as the SDK writes it.
CPU_POD = """mutation { deployCpuPod( input: { name: "cpu", imageName: "localhost/app:1",
  cloudType: ALL, startSsh: true, instanceId: "cpu3c-2-4", dataCenterId: null, dockerArgs: "",
  containerDiskInGb: 10, volumeMountPath: "/runpod-volume", templateId: "runpod-ubuntu" } ) {
  id imageName env machineId machine { podHostId } } }"""


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    join = api.create_join_token("gpu-a")
    api.ready_node(join, "host-1", gpu_count=2)
    return join


def test_a_cpu_pod_is_an_instance_without_gpus_sized_by_its_instance_id(api, fleet):
    made = gql(api, CPU_POD)["data"]["deployCpuPod"]
    assert made["imageName"] == "localhost/app:1" and made["env"] == []
    spec = api.get(f"/api/v1/instances/{made['id']}").get_json()["spec"]
    assert spec["resources"] == {"gpus": 0, "gpu_types": [], "cpus": 2.0, "memory_bytes": 4 << 30}
    assert spec["volume_mount_path"] == "/runpod-volume" and spec["command"] == []

    no_image = gql(
        api, 'mutation { deployCpuPod(input: {name: "t", templateId: "runpod-ubuntu"}) { id } }'
    )
    assert no_image["data"]["deployCpuPod"] is None
    assert no_image["errors"][0]["extensions"]["code"] == "invalid_request"
    assert "templateId" in no_image["errors"][0]["message"]
    odd = gql(
        api,
        'mutation { deployCpuPod(input: {name: "t", imageName: "a:1", instanceId: "big"}) { id } }',
    )
    assert (
        odd["errors"][0]["extensions"]["code"] == "invalid_request"
        and "instanceId" in odd["errors"][0]["message"]
    )


def test_get_user_reads_the_token_without_keys_or_network_volumes(api):
    me = gql(
        api, "query myself { myself { id pubKey networkVolumes { id name size dataCenterId } } }"
    )
    whoami = api.get("/api/v1/whoami").get_json()["principal"].removeprefix("token:")
    assert me["data"]["myself"] == {"id": whoami, "pubKey": None, "networkVolumes": []}


def test_cloud_type_selects_the_labels_the_settings_name(api, fleet):
    # community_cloud_labels defaults to cloud_type=community: no node has it yet.
    types = gql(api, "{ gpuTypes { id secureCloud communityCloud } }")["data"]["gpuTypes"]
    assert types == [{"id": MODEL, "secureCloud": True, "communityCloud": False}]
    made = gql(
        api,
        """mutation { podFindAndDeployOnDemand(input: {name: "c", cloudType: COMMUNITY, gpuCount: 1,
        dockerArgs: "sleep 100"}) { id state } }""",
    )["data"]["podFindAndDeployOnDemand"]
    inst = api.get(f"/api/v1/instances/{made['id']}").get_json()
    assert (
        inst["spec"]["node_selector"]["labels"] == {"cloud_type": "community"}
        and inst["state"] == "pending"
    )

    node_id, _ = api.ready_node(fleet, "host-2", gpu_count=2)
    assert (
        api.patch(f"/api/v1/nodes/{node_id}", {"labels": {"cloud_type": "community"}}).status_code
        == 200
    )
    types = gql(api, "{ gpuTypes { id secureCloud communityCloud } }")["data"]["gpuTypes"]
    assert types == [{"id": MODEL, "secureCloud": True, "communityCloud": True}]
    secure = gql(
        api,
        """mutation { podFindAndDeployOnDemand(input: {name: "s", cloudType: SECURE, gpuCount: 1,
        dockerArgs: "sleep 100"}) { id } }""",
    )["data"]["podFindAndDeployOnDemand"]
    assert (
        api.get(f"/api/v1/instances/{secure['id']}").get_json()["spec"]["node_selector"]["labels"]
        == {}
    )


def test_cloud_type_labels_come_from_the_settings(make_settings):
    settings = make_settings(secure_cloud_labels="tier=secure, dc=a", community_cloud_labels="")
    assert settings.cloud_type_labels == {
        "ALL": {},
        "SECURE": {"tier": "secure", "dc": "a"},
        "COMMUNITY": {},
    }
    with pytest.raises(ValueError, match="secure_cloud_labels"):
        make_settings(secure_cloud_labels="tier")


def test_myself_pods_reads_every_page_of_the_list(api, monkeypatch):
    monkeypatch.setattr(resolvers, "PODS_PAGE", 2)  # five instances are three pages
    made = [
        api.post("/api/v1/instances", {"name": f"p{i}", "command": ["sleep", "1"]}).get_json()["id"]
        for i in range(5)
    ]
    pods = gql(api, "{ myself { pods { id name } } }")["data"]["myself"]["pods"]
    assert [p["id"] for p in pods] == sorted(made) and len({p["id"] for p in pods}) == 5
    monkeypatch.setattr(
        resolvers, "MAX_POD_PAGES", 2
    )  # past the bound: an error that names the REST list
    capped = gql(api, "{ myself { pods { id } } }", expect=400)
    assert capped["data"] is None and "GET /api/v1/instances" in capped["errors"][0]["message"]


def test_a_pods_costs_are_the_instances_costs_and_its_volume_is_billed_while_stopped(api, clock):
    api.create_fleet("gpu-a")
    _, session = api.ready_node(api.create_join_token("gpu-a"), "host-1", gpu_count=2)
    assert api.call("PUT", "/api/v1/prices/storage", json={"per_gb_month": 0.1}).status_code == 200
    made = gql(
        api,
        """mutation { podFindAndDeployOnDemand(input: {name: "v", gpuCount: 0, volumeInGb: 10,
        dockerArgs: "sleep 100"}) { id } }""",
    )["data"]["podFindAndDeployOnDemand"]
    # Its volume exists from its first start (a volume that never fitted is never billed).
    assignment = api.acquire(session)
    api.task_call(session, assignment, "start", pid=4242, ports=[])
    assert api.post(f"/api/v1/instances/{made['id']}/stop").status_code == 200
    api.task_call(session, assignment, "finish", outcome="cancelled", reason="stopped")
    clock.advance(30 * 86400)
    api.run_task("usage")
    pod = gql(
        api,
        f'{{ pod(input: {{podId: "{made["id"]}"}}) {{ costSoFar storageCostSoFar desiredStatus }} '
        f"}}",
    )
    rest = api.get(f"/api/v1/instances/{made['id']}").get_json()
    assert pod["data"]["pod"] == {
        "costSoFar": rest["cost_so_far"],
        "storageCostSoFar": rest["storage_cost_so_far"],
        "desiredStatus": "EXITED",
    }
    assert (
        rest["storage_cost_so_far"] > 0.9
    )  # 10 GiB for a month at 0.1 per GB-month, stopped all along
