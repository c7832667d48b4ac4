"""An instance's slice of GPU memory end to end (issue 44): a real `fleetd serve`, a real
`fleet-agent run` on a fake 4xL4 host, a real process. The node is told the limit and its watchdog
stops the instance's process past it, as it stops a job's (tests/agent/test_limits_e2e.py plays the
GPU the same way)."""

import pytest

from tests.agent.conftest import Http, wait_until
from tests.agent.test_limits_e2e import GIB, MIB, PY, SLEEP_AND_SAY_PID, node, set_process  # noqa: F401 - fixture

pytestmark = pytest.mark.integration


def test_an_instance_over_its_gpu_memory_is_stopped_by_its_node_as_a_job_is(node):  # noqa: F811
    http, agent = node
    limit = 2 * GIB
    inst = http(
        "POST",
        "/api/v1/instances",
        expect=201,
        json={
            "name": "vram",
            "command": [PY, "-c", SLEEP_AND_SAY_PID],
            "restart": "never",
            "resources": {"gpus": 0.5, "gpu_memory_bytes": limit},
        },
    ).json()
    lines = wait_until(
        lambda: http("GET", f"/api/v1/instances/{inst['id']}/logs", expect=200).json()["items"],
        timeout=60,
        message="the instance's pid in its log",
    )
    pid = int(lines[0]["text"])
    local = Http(agent.local_url, agent.local_token())
    [worker] = wait_until(
        lambda: local("GET", "/api/v1/workers", expect=200).json()["data"],
        timeout=30,
        message="the instance's worker on the node",
    )
    [gpu] = worker["limits"]["gpus"]
    assert gpu["memory_limit_bytes"] == limit
    set_process(agent, gpu["uuid"], pid, limit + 600 * MIB)  # crosses the limit
    failed = wait_until(
        lambda: (lambda i: i if i["state"] == "failed" else None)(
            http("GET", f"/api/v1/instances/{inst['id']}", expect=200).json()
        ),
        timeout=60,
        message="the instance failed",
    )
    assert failed["last_exit"]["reason"].startswith(
        f"gpu_memory_limit_exceeded: GPU {gpu['uuid']} limit {limit} bytes"
    ), failed["last_exit"]
