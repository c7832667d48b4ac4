"""GraphQL end to end: a real `fleetd serve`, a real `fleet-agent run` on fake L4 GPUs, real
processes. The seed's `cluster...` operations sent as raw requests with ?api_key= (create on-demand
and spot, list with runtime, stop, resume, bid-resume, terminate, GPU types with prices, errors),
and the `runpod` SDK, installed from the package index into a venv of its own, driving fleetd
unchanged through its pod calls."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.agent.conftest import Http, wait_until
from tests.agent.instance_support import (
    HTTP_SERVER,
    PY,
    http_get,
    kill_left_instances,
    start_instance_agent,
    wait_instance_state,
)
from tests.agent.podman_support import IMAGE, PODMAN, prepare_podman
from tests.support.workloads import hold

pytestmark = pytest.mark.integration

MODEL = "NVIDIA L4"  # the l4_x4 shape's GPUs
SETTINGS = {
    "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1",
    "FLEETD_SCHEDULER_INTERVAL_SECONDS": "0.5",
    "FLEETD_LIVENESS_SWEEP_SECONDS": "0.5",
    "FLEETD_LEASE_SWEEP_SECONDS": "0.5",
    # The access log is written at DEBUG: the api_key must not be in it.
    "FLEETD_LOG_LEVEL": "DEBUG",
}
SDK = "runpod==1.12.*"
SDK_SCRIPT = Path(__file__).resolve().parent / "runpod_calls.py"
UNREACHABLE = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Failed to establish a new connection",
    "ConnectTimeoutError",
    "ProxyError",
)


@pytest.fixture
def fleet(server_factory, admin, agent_factory):
    """fleetd (GPU price 2.5, spot minimum bid 0.3 per L4 hour) and one ready agent with 4 fake L4
    GPUs: make(env=..., **agent config) -> (server, http, agent)."""

    def make(env=None, **extra):
        server = server_factory(**SETTINGS)
        http = Http(server.url, admin)
        http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
        http(
            "PUT",
            f"/api/v1/gpu-types/{MODEL}",
            expect=200,
            json={"price_per_hour": 2.5, "spot_min_bid": 0.3},
        )
        agent = start_instance_agent(http, server.url, agent_factory, env=env, **extra)
        made.append(agent)
        return server, http, agent

    made = []
    yield make
    for agent in made:  # instances outlive their agent by design: what a failed test left goes here
        agent.kill()
        kill_left_instances(agent.state_dir)


def graphql(server, key, query, variables=None):
    """One GraphQL request authenticated only by ?api_key= -> its JSON answer."""
    resp = requests.post(
        f"{server.url}/graphql",
        params={"api_key": key},
        timeout=30,
        json={"query": query, "variables": variables or {}},
    )
    assert resp.status_code in (200, 400, 401), resp.text
    return resp.json()


def data(answer):
    assert "errors" not in answer, answer
    return answer["data"]


def wait_gone(http, instance_id):
    wait_until(
        lambda: http("GET", f"/api/v1/instances/{instance_id}").status_code == 404,
        timeout=60,
        message=f"instance {instance_id} deleted once its node removed its volume",
    )


CLUSTERS = """query clusters { myself { clusters { id name runtime { uptimeInSeconds
  ports { ip isIpPublic privatePort publicPort type } gpus { id gpuUtilPercent memoryUtilPercent }
  container { cpuPercent memoryPercent } } } } }"""
ON_DEMAND = """mutation deploy($input: PodFindAndDeployOnDemandInput!) {
  clusterFindAndDeployOnDemand(input: $input) {
    id imageName env machineId machine { clusterHostId } costPerHr } }"""


def test_the_seed_cluster_operations_with_api_key_on_a_real_agent(fleet):
    server, http, agent = fleet()
    key = http.token
    web = data(
        graphql(
            server,
            key,
            ON_DEMAND,
            {
                "input": {
                    "cloudType": "ALL",
                    "gpuCount": 1,
                    "volumeInGb": 1,
                    "containerDiskInGb": 40,
                    "minVcpuCount": 1,
                    "minMemoryInGb": 1,
                    "gpuTypeId": MODEL,
                    "name": "web",
                    "imageName": "",
                    "dockerArgs": shlex.join([PY, "-c", HTTP_SERVER]),
                    "ports": "8000/http",
                    "volumeMountPath": "/workspace",
                    "env": [{"key": "JUPYTER_PASSWORD", "value": "pw"}],
                }
            },
        )
    )["clusterFindAndDeployOnDemand"]
    assert web["env"] == ["JUPYTER_PASSWORD=pw"] and web["imageName"] is None
    spot = data(
        graphql(
            server,
            key,
            f"""mutation {{ clusterRentInterruptable(input: {{bidPerGpu: 0.5, cloudType: SECURE,
        gpuCount: 1, name: "spot", dockerArgs: {json.dumps(shlex.join([PY, "-c", hold(600)]))}}})
        {{ id podType bidPerGpu }} }}""",
        )
    )["clusterRentInterruptable"]
    assert spot["podType"] == "INTERRUPTABLE" and spot["bidPerGpu"] == 0.5

    def running_with_figures():
        clusters = {
            c["name"]: c for c in data(graphql(server, key, CLUSTERS))["myself"]["clusters"]
        }
        ready = all(c["runtime"] and c["runtime"]["gpus"] for c in clusters.values())
        return clusters if ready and clusters["web"]["runtime"]["ports"] else None

    clusters = wait_until(
        running_with_figures, timeout=60, message="both clusters running with GPU figures"
    )
    assert set(clusters) == {"web", "spot"} and clusters["web"]["id"] == web["id"]
    (port,) = clusters["web"]["runtime"]["ports"]
    assert (port["privatePort"], port["type"]) == (8000, "http") and port["publicPort"] != 8000
    assert len(clusters["web"]["runtime"]["gpus"]) == 1 and clusters["web"]["runtime"]["gpus"][0][
        "id"
    ].startswith("GPU-")
    priced = data(
        graphql(
            server,
            key,
            f'{{ cluster(input: {{clusterId: "{web["id"]}"}}) {{ costPerHr podType }} }}',
        )
    )
    assert priced["cluster"] == {"costPerHr": 2.5, "podType": "RESERVED"}  # the price once placed
    volume = agent.state_dir / "volumes" / web["id"]
    wait_until(volume.is_dir, message="the volume made by the agent")
    (volume / "index.html").write_text("through graphql")
    url = f"http://127.0.0.1:{port['publicPort']}/"
    assert wait_until(lambda: http_get(url), message="the cluster's port") == (
        200,
        "through graphql",
    )

    stop = 'mutation {{ clusterStop(input: {{clusterId: "{}"}}) {{ id desiredStatus }} }}'
    assert (
        data(graphql(server, key, stop.format(web["id"])))["clusterStop"]["desiredStatus"]
        == "EXITED"
    )
    wait_instance_state(http, web["id"], "stopped")
    resumed = data(
        graphql(
            server,
            key,
            f'mutation {{ clusterResume(input: {{clusterId: "{web["id"]}", gpuCount: 1}}) '
            "{ id desiredStatus imageName env machineId machine { clusterHostId } } }",
        )
    )
    assert resumed["clusterResume"]["desiredStatus"] == "RUNNING"
    wait_instance_state(http, web["id"], "running")
    assert wait_until(lambda: http_get(url), message="the resumed port") == (200, "through graphql")

    data(graphql(server, key, stop.format(spot["id"])))
    wait_instance_state(http, spot["id"], "stopped")
    bid = data(
        graphql(
            server,
            key,
            f"""mutation {{ clusterBidResume(input: {{clusterId: "{spot["id"]}", bidPerGpu: 0.6,
        gpuCount: 1}}) {{ id desiredStatus bidPerGpu }} }}""",
        )
    )["clusterBidResume"]
    assert bid == {"id": spot["id"], "desiredStatus": "RUNNING", "bidPerGpu": 0.6}
    assert wait_instance_state(http, spot["id"], "running")["spec"]["bid"] == 0.6

    (gpu,) = data(
        graphql(
            server,
            key,
            f"""query GpuTypes {{ gpuTypes(input: {{ id: "{MODEL}" }}) {{
        id displayName memoryInGb secureCloud communityCloud maxGpuCount
        lowestPrice(input: {{ gpuCount: 1 }}) {{ minimumBidPrice uninterruptablePrice }}
        eight: lowestPrice(input: {{ gpuCount: 8 }}) {{ minimumBidPrice uninterruptablePrice }}
        }} }}""",
        )
    )["gpuTypes"]
    assert (
        (gpu["id"], gpu["displayName"]) == (MODEL, "L4")
        and gpu["maxGpuCount"] == 4
        and gpu["memoryInGb"] > 20
    )
    assert gpu["lowestPrice"] == {"minimumBidPrice": 0.3, "uninterruptablePrice": 2.5}
    assert gpu["eight"] == {"minimumBidPrice": None, "uninterruptablePrice": None}  # no node has 8

    again = graphql(server, key, ON_DEMAND, {"input": {"name": "web", "dockerArgs": "true"}})
    assert (
        again["errors"][0]["extensions"]["code"] == "conflict"
        and web["id"] in again["errors"][0]["message"]
    )
    refused = graphql(server, "fla_wrong.key", CLUSTERS)
    assert refused["errors"][0]["extensions"]["code"] == "unauthorized"

    for pod in (web, spot):
        assert data(
            graphql(
                server, key, f'mutation {{ clusterTerminate(input: {{clusterId: "{pod["id"]}"}}) }}'
            )
        ) == {"clusterTerminate": None}
    for pod in (web, spot):
        wait_gone(http, pod["id"])
    missing = graphql(
        server, key, f'query {{ cluster(input: {{clusterId: "{web["id"]}"}}) {{ id }} }}'
    )
    assert missing["errors"][0]["extensions"]["code"] == "not_found"
    assert data(graphql(server, key, CLUSTERS))["myself"]["clusters"] == []

    events = http("GET", f"/api/v1/instances/{web['id']}/events", expect=200).text
    assert "?api_key=[redacted]" in server.log  # the access log was written, scrubbed
    assert key not in server.log and key.split(".")[-1] not in server.log and key not in events


# ---------------------------------------------------------------- the runpod SDK


@pytest.fixture(scope="session")
def runpod_python(tmp_path_factory):
    """The python of a venv with the runpod SDK from the package index (its dependencies do not fit
    the project's constraints); skipped only when the index cannot be reached."""
    venv = tmp_path_factory.mktemp("runpod-sdk") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", SDK],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if installed.returncode != 0:
        output = installed.stdout + installed.stderr
        if any(sign in output for sign in UNREACHABLE):
            pytest.skip(
                f"the package index is unreachable, so {SDK} cannot be installed: {output[-300:]}"
            )
        raise AssertionError(f"pip install {SDK} failed:\n{output[-2000:]}")
    return python


class Sdk:
    """The runpod SDK in its own venv: call(name, *args, **kwargs) -> its result; SdkError when it
    raised."""

    def __init__(self, python, base_url, token):
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path(python).parent.parent),
            "RUNPOD_API_BASE_URL": base_url,
            "FLEETD_TOKEN": token,
        }
        self.proc = subprocess.Popen(
            [str(python), str(SDK_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def answer(self, name, *args, **kwargs):
        self.proc.stdin.write(json.dumps({"call": name, "args": args, "kwargs": kwargs}) + "\n")
        self.proc.stdin.flush()
        for _ in range(1000):  # bounded: lines the SDK itself may print before the answer
            line = self.proc.stdout.readline()  # each SDK request has its own 30 s timeout
            assert line, f"the SDK script ended (exit {self.proc.poll()})"
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
        raise AssertionError("no answer from the SDK script")

    def __call__(self, name, *args, **kwargs):
        answer = self.answer(name, *args, **kwargs)
        assert "error" not in answer, answer
        return answer["result"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.mark.timeout(
    600
)  # the first use installs the SDK and its dependencies from the package index
def test_the_runpod_sdk_creates_lists_stops_resumes_and_terminates_a_pod(
    fleet, runpod_python, tmp_path
):
    env = prepare_podman(str(tmp_path))
    server, http, agent = fleet(
        env={"CONTAINERS_CONF": env["CONTAINERS_CONF"]}, containers_command=" ".join(PODMAN)
    )
    sdk = Sdk(runpod_python, server.url, http.token)
    try:
        gpus = sdk("get_gpus")
        assert {"id": MODEL, "displayName": "L4", "memoryInGb": gpus[0]["memoryInGb"]} in gpus
        gpu = sdk("get_gpu", MODEL)
        assert (
            gpu["maxGpuCount"] == 4 and gpu["securePrice"] == 2.5 and gpu["secureSpotPrice"] == 0.3
        )
        assert gpu["lowestPrice"] == {"minimumBidPrice": 0.3, "uninterruptablePrice": 2.5}
        assert gpu["communityPrice"] is None and gpu["oneMonthPrice"] is None

        pod = sdk(
            "create_pod",
            "sdk-box",
            IMAGE,
            MODEL,
            gpu_count=1,
            volume_in_gb=1,
            volume_mount_path="/workspace",
            docker_args="/bin/httpd -f -p 8000 -h /workspace",
            ports="8000/http",
            env={"GREETING": "hi"},
        )
        assert pod["imageName"] == IMAGE and pod["env"] == ["GREETING=hi"]
        running = wait_until(
            lambda: (
                (found := sdk("get_pod", pod["id"]))["runtime"]
                and found["runtime"]["ports"]
                and found
            ),
            timeout=90,
            message="the pod running with its port",
        )
        assert (
            running["desiredStatus"] == "RUNNING"
            and running["costPerHr"] == 2.5
            and running["gpuCount"] == 1
        )
        assert running["machine"] == {"gpuDisplayName": MODEL} and running["ports"] == "8000/http"
        assert (
            running["volumeMountPath"] == "/workspace" and running["containerDiskInGb"] == 10
        )  # the SDK's default
        (port,) = running["runtime"]["ports"]
        (Path(agent.state_dir) / "volumes" / pod["id"] / "index.html").write_text("from the sdk")
        url = f"http://127.0.0.1:{port['publicPort']}/index.html"
        assert wait_until(lambda: http_get(url), timeout=60, message="the pod's port") == (
            200,
            "from the sdk",
        )
        assert [p["id"] for p in sdk("get_pods")] == [pod["id"]]

        assert sdk("stop_pod", pod["id"])["desiredStatus"] == "EXITED"
        wait_instance_state(http, pod["id"], "stopped")
        assert sdk("get_pod", pod["id"])["runtime"] is None
        assert sdk("resume_pod", pod["id"], 1)["desiredStatus"] == "RUNNING"
        assert wait_until(lambda: http_get(url), timeout=60, message="the resumed pod") == (
            200,
            "from the sdk",
        )

        assert sdk("terminate_pod", pod["id"]) is None
        wait_gone(http, pod["id"])
        assert sdk("get_pods") == []
        assert (
            sdk.answer("get_pod", pod["id"])["error"] == "QueryError"
        )  # not_found, in the SDK's words

        # Without a GPU type the SDK deploys a CPU pod (deployCpuPod, its default template named);
        # get_user.
        assert sdk("get_user")["networkVolumes"] == []
        cpu = sdk("create_pod", "sdk-cpu", IMAGE, docker_args="sleep 600", instance_id="cpu3c-1-1")
        assert cpu["imageName"] == IMAGE
        resources = http("GET", f"/api/v1/instances/{cpu['id']}", expect=200).json()["spec"][
            "resources"
        ]
        assert (resources["gpus"], resources["cpus"], resources["memory_bytes"]) == (0, 1, 1 << 30)
        assert sdk("terminate_pod", cpu["id"]) is None
        wait_gone(http, cpu["id"])
    finally:
        sdk.close()
