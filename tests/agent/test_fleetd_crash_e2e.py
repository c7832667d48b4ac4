"""fleetd killed with SIGKILL at the moments that matter, with a real `fleet-agent run` and real
task processes (SQLite; the same on PostgreSQL with a replica taking over is in
test_server_failover_e2e.py and tests/integration/test_replicas.py): a job placed but not yet
delivered, and a job whose process ends while fleetd is down, each run exactly once and succeed; no
acknowledged job is lost."""

import signal
import socket
import sys

import pytest

from tests.agent.conftest import Http, wait_until
from tests.support.server import FleetdProcess
from tests.support.workloads import GATE_WAIT

pytestmark = pytest.mark.integration

PY = sys.executable
# A TTL and a task lease long enough that a fleetd restart (a few seconds) neither loses the node
# nor makes the agent fence its job tasks: what is tested is fleetd's own crash.
SETTINGS = {
    "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1",
    "FLEETD_NODE_TTL_SECONDS": "20",
    "FLEETD_NODE_GRACE_SECONDS": "2",
    "FLEETD_LIVENESS_SWEEP_SECONDS": "0.5",
    "FLEETD_FAILOVER_GRACE_SECONDS": "2",
    "FLEETD_TASK_LEASE_SECONDS": "60",
    "FLEETD_SCHEDULER_INTERVAL_SECONDS": "0.5",
}
# One line per run in the marker file (argv[1]); then waits for the gate (argv[2], bounded) when
# given one.
RUN = (
    "import sys\n" + GATE_WAIT + "with open(sys.argv[1], 'a') as fh:\n"
    "    fh.write('ran\\n')\n"
    "if len(sys.argv) > 2:\n"
    "    gate_wait(sys.argv[2], 60)\n"
)


def job(http, job_id):
    return http("GET", f"/api/v1/jobs/{job_id}", expect=200).json()


def runs(path):
    return path.read_text().count("ran\n") if path.exists() else 0


def test_a_killed_fleetd_loses_no_acknowledged_job_and_runs_none_twice(
    tmp_path, admin, data_dir, agent_factory, gate
):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = FleetdProcess(
        data_dir, SETTINGS, bind=f"127.0.0.1:{port}"
    ).start()  # the same URL after a restart
    try:
        http = Http(server.url, admin)
        http.create_root_fleet("lab")
        join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={}).json()
        agent = agent_factory("host", shape="l4_x4")
        agent.join(join["token"], server.url)
        agent.start()
        node_id = agent.node()["node_id"]
        wait_until(
            lambda: http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()["status"] == "ready",
            timeout=60,
            message="the node to be ready",
        )

        # 1. Placed, not delivered: the agent is paused, so its acquire cannot take the assignment.
        placed_marker = tmp_path / "placed.runs"
        agent.signal(signal.SIGSTOP)
        try:
            placed = http(
                "POST",
                "/api/v1/jobs",
                expect=201,
                json={
                    "name": "placed",
                    "command": [PY, "-c", RUN, str(placed_marker)],
                    "resources": {"gpus": 1},
                },
            ).json()
            wait_until(
                lambda: [t["state"] for t in job(http, placed["id"])["tasks"]] == ["assigned"],
                timeout=30,
                message="the job to be placed on the paused node",
            )
            server.kill()  # SIGKILL between placement and delivery
            server.wait()
            server.start()
        finally:
            agent.signal(signal.SIGCONT)
        wait_until(
            lambda: job(http, placed["id"])["state"] == "succeeded",
            timeout=60,
            message="the placed job to run once fleetd is back",
        )

        # 2. Its process ends while fleetd is down: the finish report waits for fleetd, nothing
        #    reruns.
        ended_marker = tmp_path / "ended.runs"
        ended = http(
            "POST",
            "/api/v1/jobs",
            expect=201,
            json={
                "name": "ended",
                "command": [PY, "-c", RUN, str(ended_marker), gate.path],
                "resources": {"gpus": 1},
            },
        ).json()
        wait_until(
            lambda: job(http, ended["id"])["state"] == "running" and runs(ended_marker) == 1,
            timeout=60,
            message="the second job to run",
        )
        server.kill()  # SIGKILL while it runs
        server.wait()
        gate.open()
        agent.wait_for_line(
            r"finish not reported yet", timeout=30
        )  # the report is owed while fleetd is down
        server.start()
        wait_until(
            lambda: job(http, ended["id"])["state"] == "succeeded",
            timeout=60,
            message="the finish report to land once fleetd is back",
        )

        for marker, record in ((placed_marker, placed), (ended_marker, ended)):
            after = job(http, record["id"])
            assert runs(marker) == 1, (record["name"], runs(marker))
            assert after["attempt"] == 1 and after["state"] == "succeeded", after
        assert http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()["status"] == "ready"
        jobs = http("GET", "/api/v1/jobs", expect=200).json()["items"]
        assert sorted(j["name"] for j in jobs) == ["ended", "placed"]
    finally:
        server.kill()
