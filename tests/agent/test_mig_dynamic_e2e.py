"""Dynamic MIG end to end (issue 50): a real `fleetd serve`, a real `fleet-agent run` on the fake
NVML's a100_mig_x2 (3x 2g.10gb on GPU 0, 1x 7g.40gb on GPU 1), in a fleet whose MIG mode is
dynamic. A job asks for a 1g.5gb slice that no GPU has: fleetd plans an idle GPU's layout, the
agent repartitions it through NVML and reports it, and the job runs on a new 1g.5gb slice."""

import json
import sys

import pytest

from tests.agent.conftest import Http, shape_path
from tests.agent.test_jobs_e2e import FAST, job_logs, wait_job

pytestmark = pytest.mark.integration

PY = sys.executable
SHAPE = json.loads(shape_path("a100_mig_x2").read_text())
FOUND = {d["uuid"] for g in SHAPE["gpus"] for d in g["mig_devices"]}
SHOW = "import os\nprint('visible', os.environ['CUDA_VISIBLE_DEVICES'])\n"


def test_an_idle_gpu_is_repartitioned_and_a_queued_1g_job_runs_on_the_new_slice(
    server_factory, admin, agent_factory
):
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
    http("PATCH", "/api/v1/fleets/lab", expect=200, json={"mig": {"mode": "dynamic"}})
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()
    agent = agent_factory("mig-host", shape="a100_mig_x2")
    agent.join(join["token"], server.url)
    agent.start()
    node_id = agent.node()["node_id"]
    http.wait_node_ready(node_id)
    job = http(
        "POST",
        "/api/v1/jobs",
        expect=201,
        json={"name": "nb", "command": [PY, "-c", SHOW], "resources": {"mig": "1g.5gb"}},
    ).json()
    planned = http("POST", "/api/v1/admin/tasks/mig_planning/run", expect=200).json()
    assert planned["last_result"]["planned"] == 1, planned

    done = wait_job(http, job["id"])
    assert done["state"] == "succeeded", done
    [task] = done["tasks"]
    [device] = task["mig_devices"]
    assert device not in FOUND  # a slice the agent made
    [line] = [x["text"] for x in job_logs(http, job["id"]) if x["stream"] == "stdout"]
    assert line == f"visible {device}"

    node = http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()
    [changed] = [g for g in node["gpus"] if device in {d["uuid"] for d in g["mig_devices"]}]
    assert [d["profile"] for d in changed["mig_devices"]] == ["1g.5gb"] * 7
    assert changed["mig_target"] is None and changed["mig_blocked"] == ""
    events = http("GET", f"/api/v1/nodes/{node_id}/events", expect=200).json()["items"]
    assert {"gpu.mig_planned", "gpu.mig_changed"} <= {e["kind"] for e in events}
    assert node["status"] == "ready"
