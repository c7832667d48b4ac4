"""What bounds a task, end to end (issue 44): a real `fleetd serve` sends each task its fleet's pid
limit, default memory bound and PATH, and a real `fleet-agent run` holds the task to them. The tasks
run as their owner's uid (the fleet allows no root), so that the pid limit holds even where no
cgroup v2 pids controller is delegated (RLIMIT_NPROC then): a fork bomb stops at it. The agent's
state dir lies where other uids may pass (as /var/lib is); the tasks run /usr/bin/python3, which
every uid can execute."""

import os
import shutil
import tempfile

import pytest

from tests.agent.conftest import AgentProcess, Http, wait_until
from tests.agent.test_jobs_e2e import job_logs, wait_job

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("setpriv"),
        reason="tasks as their own uid need root and setpriv (CI runs as root)",
    ),
]

FAST = {
    "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1",
    "FLEETD_NODE_TTL_SECONDS": "5",
    "FLEETD_SCHEDULER_INTERVAL_SECONDS": "0.5",
}
PY = "/usr/bin/python3"
GIB = 1024**3
PIDS = 64
FLEET_PATH = "/usr/local/bin:/usr/bin:/bin:/opt/fleet-tools/bin"
AGENT_PATH = "/root/.pyenv/shims:" + os.environ.get(
    "PATH", "/usr/bin:/bin"
)  # as on the audited host
# Forks up to 10,000 children (each its own session, then /bin/sleep), for at most 60 s; says how
# many it made and why it stopped; kills and reaps them all.
FORK_BOMB = """
import errno, os, time
children, stopped = [], None
deadline = time.monotonic() + 60
for _ in range(10000):
    if time.monotonic() > deadline:
        stopped = "deadline"
        break
    try:
        pid = os.fork()
    except OSError as exc:
        stopped = errno.errorcode.get(exc.errno, str(exc.errno))
        break
    if pid == 0:
        try:
            os.setsid()
            os.execv("/bin/sleep", ["sleep", "120"])
        finally:
            os._exit(0)
    children.append(pid)
print(len(children), stopped, flush=True)
for pid in children:
    try:
        os.kill(pid, 9)
    except OSError:
        pass
for pid in children:
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass
"""
SAY_PATH_AND_HOLD = "import os, time\nprint(os.environ['PATH'], flush=True)\ntime.sleep(120)\n"


@pytest.fixture
def node(server_factory, admin):
    """fleetd, fleet `lab` (root not allowed; pid limit PIDS, PATH FLEET_PATH) and one ready agent
    whose own PATH is AGENT_PATH: (http, agent)."""
    top = tempfile.mkdtemp(prefix="fleet-bounds-")
    os.chmod(top, 0o711)
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http(
        "POST",
        "/api/v1/fleets",
        expect=201,
        json={"name": "lab", "task_pids_max": PIDS, "task_path": FLEET_PATH},
    )
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()
    agent = AgentProcess(top, "bounded-host", shape="l4_x4")
    try:
        agent.join(join["token"], server.url)
        agent.start(env={"PATH": AGENT_PATH})
        node_id = agent.node()["node_id"]
        wait_until(
            lambda: (lambda n: n["status"] == "ready" and n["capabilities"]["isolation"] == "uid")(
                http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()
            ),
            timeout=60,
            message="the node ready, with isolation",
        )
        yield http, agent
    finally:
        agent.kill()
        agent.remove_task_cgroups()
        shutil.rmtree(top, ignore_errors=True)


def submit(http, code, **resources):
    return http(
        "POST",
        "/api/v1/jobs",
        expect=201,
        json={
            "name": "bounded",
            "command": [PY, "-c", code],
            "resources": {"gpus": 1, **resources},
            "retry": {"max_attempts": 1, "on": []},
        },
    ).json()


def stdout(http, job_id):
    return [line["text"] for line in job_logs(http, job_id) if line["stream"] == "stdout"]


def worker(agent, job_id, http):
    """The local API's record of the job's one running task."""
    task_id = http("GET", f"/api/v1/jobs/{job_id}", expect=200).json()["tasks"][0]["id"]
    local = Http(agent.local_url, agent.local_token())
    # The record is listed as the task is taken, its limits once they are set up: wait for those.
    return wait_until(
        lambda: next(
            (
                w
                for w in local("GET", "/api/v1/workers", expect=200).json()["data"]
                if w["task_id"] == task_id and "host" in (w.get("limits") or {})
            ),
            None,
        ),
        timeout=30,
        message="the worker record with its limits",
    )


def test_a_task_forking_10000_processes_stops_at_its_fleets_pid_limit_and_the_node_stays_healthy(
    node,
):
    http, agent = node
    job = submit(http, FORK_BOMB)
    done = wait_job(http, job["id"], timeout=120)
    assert done["state"] == "succeeded", done
    [said] = stdout(http, job["id"])
    made, stopped = said.split()
    # Its uid's processes and threads: the task itself, then its children, up to the fleet's limit.
    assert stopped == "EAGAIN" and PIDS // 2 <= int(made) < PIDS, said
    # The node is healthy: still ready in fleetd, its agent answering, and the next task runs.
    node_id = agent.node()["node_id"]
    assert http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()["status"] == "ready"
    assert Http(agent.local_url, None)("GET", "/healthz", expect=200).json() == {
        "data": {"status": "ok"}
    }
    after = submit(http, "print('after', flush=True)")
    assert wait_job(http, after["id"])["state"] == "succeeded"
    assert stdout(http, after["id"]) == ["after"]


def test_a_tasks_path_is_its_fleets_never_the_agents_own(node):
    http, agent = node
    job = submit(http, SAY_PATH_AND_HOLD)
    assert wait_until(lambda: stdout(http, job["id"]), timeout=60, message="the task's PATH") == [
        FLEET_PATH
    ]
    http("POST", f"/api/v1/jobs/{job['id']}/cancel", expect=200)
    wait_job(http, job["id"])


def test_a_task_without_memory_bytes_is_bounded_by_its_fleets_default_and_one_with_them_by_its_own(
    node,
):
    http, agent = node
    http("PATCH", "/api/v1/fleets/lab", expect=200, json={"task_memory_default_bytes": 3 * GIB})
    for resources, limit, source in (
        ({}, 3 * GIB, "fleet task_memory_default_bytes"),
        ({"memory_bytes": GIB}, GIB, None),
    ):
        job = submit(http, SAY_PATH_AND_HOLD, **resources)
        record = worker(agent, job["id"], http)["limits"]["host"]["memory_bytes"]
        assert record["limit"] == limit and record.get("source") == source, record
        # Enforced where the host has a writable cgroup v2 memory controller; said why not where
        # not.
        assert (
            record["how"] == f"cgroup v2 memory.max = {limit}"
            if record["enforced"]
            else record["how"].startswith("not enforced: ")
        ), record
        http("POST", f"/api/v1/jobs/{job['id']}/cancel", expect=200)
        wait_job(http, job["id"])
