"""Seed gaps a user met (issue 44, item 14), over the real API: an instance's slice of GPU memory as
a job's, seed 004's `?wait=` on a job, seed 000's `POST /api/assign-host-port`, seed 003's profile
labels and storage names, and the GraphQL image name that asks for a host process."""

import json
import threading
import time

import pytest

from tests.conftest import ApiClient
from tests.fleetd.gql.test_graphql import gql
from tests.fleetd.services.workloads.test_instances import create, finish, show, start
from tests.integration.test_cli import run  # noqa: F401 - the fixture
from tests.support.gpus import GPU_H100

GIB = 1 << 30


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    token = api.create_join_token("gpu-a")
    node, session = api.ready_node(token, "host-1", gpu_count=2)
    return token, node, session


def error_of(resp, status):
    """The error envelope of a refused request."""
    assert resp.status_code == status, resp.get_data(as_text=True)
    return resp.get_json()["error"]


# ---------------------------------------------------------------- an instance's GPU memory


def test_an_instance_takes_a_slice_of_gpu_memory_as_a_job_does_and_its_node_is_told_the_limit(
    api, fleet
):
    _, node, session = fleet
    inst = create(api, resources={"gpus": 1, "gpu_memory_bytes": 20 * GIB})
    assert inst["spec"]["resources"]["gpu_memory_bytes"] == 20 * GIB and inst["node_id"] == node
    run = start(api, session)
    # What the node's watchdog enforces (gpu_memory_limit_exceeded past it), as for a job's slice.
    assert [g["memory_limit_bytes"] for g in run["gpus"]] == [20 * GIB] and run[
        "isolation"
    ] == "shared"
    job = api.submit(resources={"gpus": 1, "gpu_memory_bytes": 20 * GIB})
    placed = api.acquire(session)
    assert (
        placed["job_id"] == job["id"] and placed["gpus"][0]["uuid"] == run["gpus"][0]["uuid"]
    )  # one GPU, shared
    assert api.get("/api/v1/cluster/status").get_json()["gpu"]["used"] == 1

    # A resume runs it again with the same slice.
    api.post(f"/api/v1/instances/{inst['id']}/stop")
    finish(api, session, run)
    assert api.post(f"/api/v1/instances/{inst['id']}/resume", {}).status_code == 200
    assert [g["memory_limit_bytes"] for g in start(api, session)["gpus"]] == [20 * GIB]

    # Refused as a job's are: a slice is of one GPU, and at least 256 MiB.
    whole = error_of(
        api.post(
            "/api/v1/instances",
            {
                "name": "two",
                "command": ["a"],
                "resources": {"gpus": 2, "gpu_memory_bytes": 20 * GIB},
            },
        ),
        400,
    )
    assert "one shared GPU" in whole["message"] and "resources" in whole["details"]["fields"]
    small = error_of(
        api.post(
            "/api/v1/instances",
            {
                "name": "small",
                "command": ["a"],
                "resources": {"gpus": 1, "gpu_memory_bytes": 255 << 20},
            },
        ),
        400,
    )
    assert "gpu_memory_bytes" in small["details"]["fields"]["json"]["resources"]


# ---------------------------------------------------------------- seed 004's ?wait=


def test_seed_004s_wait_on_a_job_is_its_wait_seconds_and_a_bad_one_is_refused(api):
    job = api.submit()  # no node: it stays queued until cancelled
    answers = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            ApiClient(api.app, api.token).get(f"/api/v1/jobs/{job['id']}?wait=30").get_json()
        )
    )
    waiter.start()
    time.sleep(0.3)  # the waiter is held (a wait ignored would have answered "queued" by now)
    api.post(f"/api/v1/jobs/{job['id']}/cancel")
    waiter.join(timeout=30)
    assert (
        answers and answers[0]["state"] == "cancelled"
    )  # answered when the job ended, as wait_seconds does
    assert (
        "wait"
        in error_of(api.get(f"/api/v1/jobs/{job['id']}?wait=31"), 400)["details"]["fields"]["query"]
    )
    both = api.get(f"/api/v1/jobs/{job['id']}?wait=31&wait_seconds=0")
    assert both.status_code == 400  # each is checked; wait_seconds wins when both are valid
    assert (
        api.get(f"/api/v1/jobs/{job['id']}?wait=5&wait_seconds=0").get_json()["state"]
        == "cancelled"
    )


# ---------------------------------------------------------------- seed 000's assign-host-port


def test_assign_host_port_answers_the_host_port_of_an_instances_port_as_text(api, fleet, app):
    _, _, session = fleet
    inst = create(api, name="web", ports=[{"port": 8888}])
    url = "/api/assign-host-port?podName=web"
    # Not running yet: nodes hand host ports out at start, so there is none to give.
    assert error_of(api.post(url), 504)["code"] == "timeout"
    run = start(api, session, [(8888, 40001)])
    answer = api.post(url)
    assert answer.status_code == 200 and answer.get_data(as_text=True) == "40001"
    assert answer.mimetype == "text/plain"
    assert (
        api.post(f"/api/assign-host-port?podName={inst['id']}&port=8888").get_data(as_text=True)
        == "40001"
    )
    assert error_of(api.post(f"{url}&port=22"), 404)["details"] == {"port": 22, "declared": [8888]}
    assert error_of(api.post("/api/assign-host-port?podName=nope"), 404)["code"] == "not_found"
    assert (
        "podName" in error_of(api.post("/api/assign-host-port"), 400)["details"]["fields"]["query"]
    )
    assert error_of(api.call("POST", url, token=None), 401)["code"] == "unauthorized"
    alice = ApiClient(app, api.create_token("submitter", "alice"))
    assert error_of(alice.post(url), 404)["code"] == "not_found"  # another owner's instance
    api.post(f"/api/v1/instances/{inst['id']}/stop")
    finish(api, session, run)
    assert error_of(api.post(url), 409)["details"]["state"] == "stopped"
    assert show(api, inst["id"])["state"] == "stopped"


# ---------------------------------------------------------------- seed 003's cluster status


def test_profiles_have_a_label_and_storage_has_seed_003s_names(api, fleet):
    status = api.get("/api/v1/cluster/status").get_json()
    assert status["profiles"][0]["label"] == f"2 x {GPU_H100['model']} per node, 1 node"
    before = status["storage"]
    assert before["measured"] is False and before["total_bytes"] == 0 and before["root"]
    api.run_task("storage")
    storage = api.get("/api/v1/cluster/status").get_json()["storage"]
    assert storage["measured"] is True and storage["stale"] is False
    assert storage["total_bytes"] == storage["disk_total_bytes"] > 0
    assert storage["free_bytes"] == storage["disk_free_bytes"]
    assert storage["used_bytes"] == storage["total_bytes"] - storage["free_bytes"]
    assert storage["runs_bytes"] == storage["database_bytes"] > 0
    assert storage["cache_bytes"] == storage["artifacts_bytes"]
    assert storage["watermark_pct"] == 85 and storage["root"] == storage["data_dir"]


# ------------------------------------------------------------ GraphQL: a host process by image name


def test_the_image_name_host_makes_a_host_process_pod_as_the_sdks_create_pod_sends_it(api, fleet):
    _, _, session = fleet
    made = gql(
        api,
        """mutation create($model: String) { podFindAndDeployOnDemand(input: {name: "hp",
        imageName: "host", gpuTypeId: $model, gpuCount: 1, cloudType: ALL,
        dockerArgs: "python3 -m http.server 8888", ports: "8888/http"}) {
        id imageName dockerArgs } }""",
        {"model": GPU_H100["model"]},
    )
    pod = made["data"]["podFindAndDeployOnDemand"]
    assert pod["imageName"] is None and pod["dockerArgs"] == "python3 -m http.server 8888"
    assert api.get(f"/api/v1/instances/{pod['id']}").get_json()["spec"]["image"] is None
    assert start(api, session)["instance"]["image"] is None  # its node runs it as a host process
    # A host process needs its command, as in REST; an image of that name is still reached in full.
    bare = gql(
        api,
        'mutation { podFindAndDeployOnDemand(input: {name: "x", imageName: "host", gpuCount: 0}) { '
        "id } }",
    )
    assert bare["errors"][0]["extensions"]["code"] == "invalid_request"
    full = gql(
        api,
        """mutation { podFindAndDeployOnDemand(input: {name: "y",
        imageName: "docker.io/library/host", gpuCount: 0}) { id imageName } }""",
    )["data"]["podFindAndDeployOnDemand"]
    assert full["imageName"] == "docker.io/library/host"


# ---------------------------------------------------------------- the CLI's --gpu-memory


@pytest.mark.integration  # a real fleetd serve
def test_gpu_memory_options_take_sizes_like_volume(run):  # noqa: F811
    inst = json.loads(
        run(
            "instance",
            "create",
            "--name",
            "nb",
            "--gpus",
            "1",
            "--gpu-memory",
            "20G",
            "--json",
            "--",
            "sleep",
            "1d",
        ).stdout
    )
    assert inst["spec"]["resources"]["gpu_memory_bytes"] == 20 * GIB
    job = json.loads(
        run("job", "submit", "--gpus", "1", "--gpu-memory", "512M", "--json", "--", "true").stdout
    )
    assert job["spec"]["resources"]["gpu_memory_bytes"] == 512 << 20
    assert (
        "not a size" in run("job", "submit", "--gpu-memory", "lots", "--", "true", expect=2).stderr
    )
