"""MIG end to end (issue 50): a real `fleetd serve`, a real `fleet-agent run` on the fake NVML's
a100_mig_x2 (3x 2g.10gb on GPU 0, 1x 7g.40gb on GPU 1), a real task process. A job that asks for
`resources.mig` runs on its MIG device and sees it, and only it, in CUDA_VISIBLE_DEVICES."""

import json
import sys

import pytest

from tests.agent.conftest import Http, shape_path, wait_until
from tests.agent.test_jobs_e2e import FAST, job_logs, wait_job

pytestmark = pytest.mark.integration

PY = sys.executable
SHAPE = json.loads(shape_path("a100_mig_x2").read_text())
PARENT = [g["uuid"] for g in SHAPE["gpus"]]
MIG = [[d["uuid"] for d in g["mig_devices"]] for g in SHAPE["gpus"]]
SHOW = (
    "import os\n"
    "print('visible', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['NVIDIA_VISIBLE_DEVICES'], "
    "os.environ['FLEET_GPUS_PER_NODE'])\n"
)


def test_a_mig_job_runs_on_its_mig_device_with_only_its_mig_uuid_visible(
    server_factory, admin, agent_factory
):
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()
    agent = agent_factory("mig-host", shape="a100_mig_x2")
    agent.join(join["token"], server.url)
    agent.start()
    node_id = agent.node()["node_id"]
    node = wait_until(
        lambda: (lambda n: n if n["status"] == "ready" else None)(
            http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()
        ),
        timeout=60,
        message="the node ready",
    )
    reported = {g["uuid"]: g["mig_devices"] for g in node["gpus"]}
    assert [d["profile"] for d in reported[PARENT[0]]] == ["2g.10gb"] * 3
    assert [d["profile"] for d in reported[PARENT[1]]] == ["7g.40gb"]

    jobs = [
        http(
            "POST",
            "/api/v1/jobs",
            expect=201,
            json={"name": name, "command": [PY, "-c", SHOW], "resources": resources},
        ).json()
        for name, resources in (
            ("small", {"mig": "2g.10gb", "gpus": 2}),
            ("whole-slice", {"mig": "7g.40gb"}),
        )
    ]
    seen = {}
    for job in jobs:
        done = wait_job(http, job["id"])
        assert done["state"] == "succeeded", done
        [task] = done["tasks"]
        [line] = [x["text"] for x in job_logs(http, job["id"]) if x["stream"] == "stdout"]
        _, cuda, nvidia, count = line.split(" ")
        assert cuda == nvidia == ",".join(task["mig_devices"])
        assert int(count) == len(task["mig_devices"])
        seen[job["name"]] = task["mig_devices"]
    assert len(seen["small"]) == 2 and set(seen["small"]) <= set(MIG[0])
    assert seen["whole-slice"] == MIG[1]
    assert not any(p in ",".join(sum(seen.values(), [])) for p in PARENT)  # never a whole GPU
