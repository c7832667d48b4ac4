"""Jobs end to end: a real `fleetd serve`, real `fleet-agent run` processes with fake GPUs, real
task processes."""

import hashlib
import json
import os
import signal
import sys

import pytest

from agent.procfs import read_proc, wait_gone
from tests.agent.conftest import Http, wait_until
from tests.support.proxy import TcpProxy
from tests.support.workloads import GATE_WAIT, STUBBORN, ticks

pytestmark = pytest.mark.integration

PY = sys.executable
# Node lost after 2 + 1 s of silence, task lease 8 s: by the time a lease expires its node is lost,
# so the retry is placed on the other node. The agent stops its job tasks 8 x 0.98 - 2 (grace) - 2
# (safety) = 3.8 s after the last heartbeat fleetd answered (agent/lease.py): a few missed
# heartbeats.
FAST = {
    "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1",
    "FLEETD_NODE_TTL_SECONDS": "2",
    "FLEETD_NODE_GRACE_SECONDS": "1",
    "FLEETD_LIVENESS_SWEEP_SECONDS": "0.5",
    "FLEETD_FAILOVER_GRACE_SECONDS": "1",
    "FLEETD_TASK_LEASE_SECONDS": "8",
    "FLEETD_LEASE_SWEEP_SECONDS": "0.5",
    "FLEETD_SCHEDULER_INTERVAL_SECONDS": "0.5",
}
GRACE = 2.0
TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def fleet(server_factory, admin, agent_factory):
    """fleetd and `count` ready agents (4 fake L4 GPUs each): (http, [agents])."""

    def make(count):
        server = server_factory(**FAST)
        http = Http(server.url, admin)
        http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
        join = http(
            "POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 10}
        ).json()
        agents = []
        for i in range(count):
            agent = agent_factory(
                f"host-{i}", shape="l4_x4", extra={"tasks_kill_grace_seconds": GRACE}
            )
            agent.join(join["token"], server.url)
            agent.start()
            agents.append(agent)
        for agent in agents:
            wait_until(
                lambda a=agent: (
                    http("GET", f"/api/v1/nodes/{a.node()['node_id']}", expect=200).json()["status"]
                    == "ready"
                ),
                timeout=60,
                message=f"{agent.name} ready",
            )
        return http, agents

    return make


def submit(http, command, **spec):
    body = {"name": spec.pop("name", "e2e"), "command": command, "resources": {"gpus": 1}}
    body.update(spec)
    return http("POST", "/api/v1/jobs", expect=201, json=body).json()


def wait_job(
    http,
    job_id,
    predicate=lambda job: job["state"] in TERMINAL,
    timeout=90,
    message="the job to end",
):
    def check():
        job = http("GET", f"/api/v1/jobs/{job_id}?wait_seconds=2", expect=200).json()
        return job if predicate(job) else None

    return wait_until(check, timeout=timeout, interval=0.05, message=message)


def wait_stored(http, job_id):
    """Once a job ended, its nodes upload the output they hold: wait (bounded) until fleetd has
    it all."""
    return wait_until(
        lambda: (
            not http("GET", f"/api/v1/jobs/{job_id}/output/info", expect=200).json()[
                "pending_ranges"
            ]
        ),
        timeout=30,
        message="the job's output stored",
    )


def job_logs(http, job_id, rank=None):
    """Every log line of a job, following the cursor (bounded), once an ended job's output is
    stored."""
    job = http("GET", f"/api/v1/jobs/{job_id}", expect=200).json()
    if job["state"] in TERMINAL:
        wait_stored(http, job_id)
    lines, after = [], None
    for _ in range(1000):
        query = (
            "limit=1000"
            + (f"&after={after}" if after is not None else "")
            + (f"&rank={rank}" if rank is not None else "")
        )
        page = http("GET", f"/api/v1/jobs/{job_id}/logs?{query}", expect=200).json()
        lines += page["items"]
        if not page["items"] or page["next_cursor"] is None:
            return lines
        after = page["items"][-1]["seq"]
    raise AssertionError("too many log pages")


def agent_of(agents, node_id):
    return next(a for a in agents if a.node()["node_id"] == node_id)


def alive(pid):
    return read_proc(pid) is not None


def moved_epoch(side):
    """The epoch of the second start, from its marker file name."""
    starts = sorted(
        (int(p.name.split("-")[1]), p.name) for p in side.iterdir() if p.name.startswith("started-")
    )
    return str(starts[-1][0])


def test_a_single_node_job_succeeds_with_complete_ordered_logs_and_its_exit_code(fleet):
    http, _agents = fleet(1)
    code = (
        "import os, sys\n"
        "print('gpus', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['FLEET_GPUS_PER_NODE'], "
        "flush=True)\n"
        "for i in range(2500):\n"
        "    print(f'line {i}')\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    job = submit(http, [PY, "-c", code], name="ordered")
    done = wait_job(http, job["id"])
    assert done["state"] == "succeeded", done
    result = http("GET", f"/api/v1/jobs/{job['id']}/result", expect=200).json()
    assert result["outcome"] == "succeeded"
    assert [(t["rank"], t["exit_code"], t["outcome"]) for t in result["tasks"]] == [
        (0, 0, "succeeded")
    ]
    lines = job_logs(http, job["id"])
    stdout = [line["text"] for line in lines if line["stream"] == "stdout"]
    assert stdout[1:] == [f"line {i}" for i in range(2500)]
    assert stdout[0].startswith("gpus GPU-") and stdout[0].endswith(" 1")
    assert [line["text"] for line in lines if line["stream"] == "stderr"] == ["to stderr"]
    assert [line["seq"] for line in lines] == sorted(line["seq"] for line in lines)


def test_the_whole_output_of_a_running_job_comes_from_its_node_on_demand(fleet, gate):
    http, _agents = fleet(1)
    code = (
        "import sys\n" + GATE_WAIT + "for i in range(3000):\n"
        "    print(f'early {i}')\n"
        "sys.stdout.flush()\n"
        "gate_wait(sys.argv[1], 120)\n"
        "print('late')\n"
    )
    job = submit(http, [PY, "-c", code, gate.path], name="chatty")
    wait_until(
        lambda: (
            http("GET", f"/api/v1/jobs/{job['id']}/output/info", expect=200).json()["lines"] >= 3000
        ),
        timeout=30,
        message="fleetd to count the early lines",
    )
    # Fleetd keeps the first 100 lines and the newest 1000 as text; the middle is in the node's
    # open chunk, which the download asks the node for.
    whole = http("GET", f"/api/v1/jobs/{job['id']}/output", expect=200).text.splitlines()
    assert whole == [f"early {i}" for i in range(3000)]
    info = http("GET", f"/api/v1/jobs/{job['id']}/output/info", expect=200).json()
    assert info["pending_ranges"] == [] and info["outputs"][0]["ended"] is False
    gate.open()
    assert wait_job(http, job["id"])["state"] == "succeeded"
    assert [line["text"] for line in job_logs(http, job["id"])][-2:] == ["early 2999", "late"]


def test_a_failing_command_fails_the_job_with_its_exit_code(fleet):
    http, _agents = fleet(1)
    job = submit(http, [PY, "-c", "import sys; print('about to fail'); sys.exit(7)"], name="fails")
    done = wait_job(http, job["id"])
    assert done["state"] == "failed"
    result = http("GET", f"/api/v1/jobs/{job['id']}/result", expect=200).json()
    assert result["outcome"] == "failed"
    assert [(t["exit_code"], t["outcome"]) for t in result["tasks"]] == [(7, "failed")]
    assert [line["text"] for line in job_logs(http, job["id"])] == ["about to fail"]


def test_a_two_node_gang_rendezvous_and_the_ranks_talk_over_tcp(fleet, gate):
    http, agents = fleet(2)
    # Rank 1 connects once the test has seen rank 0 listening.
    code = (
        "import os, socket, sys\n"
        + GATE_WAIT
        + (
            "addr, port, rank = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']), "
            "os.environ['NODE_RANK']\n"
            "assert os.environ['WORLD_SIZE'] == '2' and os.environ['FLEET_NUM_NODES'] == '2'\n"
            "if rank == '0':\n"
            "    s = socket.create_server((addr, port))\n"
            "    s.settimeout(60)\n"
            "    print('listening', flush=True)\n"
            "    conn, _ = s.accept()\n"
            "    print('rank 0 got:', conn.recv(100).decode(), flush=True)\n"
            "    conn.sendall(b'welcome')\n"
            "else:\n"
            "    gate_wait(sys.argv[1])\n"
            "    c = socket.create_connection((addr, port), 5)\n"
            "    c.sendall(f'hello from rank {rank} to {addr}:{port}'.encode())\n"
            "    print('rank 1 got:', c.recv(100).decode(), f'from {addr}:{port}', flush=True)\n"
        )
    )
    job = submit(http, [PY, "-c", code, gate.path], name="gang", num_nodes=2)
    wait_until(lambda: job_logs(http, job["id"], rank=0), timeout=60, message="rank 0 to listen")
    gate.open()
    done = wait_job(http, job["id"])
    assert done["state"] == "succeeded", (done, agents[0].log, agents[1].log)
    assert len({t["node_id"] for t in done["tasks"]}) == 2
    rank0 = [line["text"] for line in job_logs(http, job["id"], rank=0)]
    rank1 = [line["text"] for line in job_logs(http, job["id"], rank=1)]
    assert len(rank0) == 2 and rank0[0] == "listening"
    assert rank0[1].startswith("rank 0 got: hello from rank 1 to 127.0.0.1:")
    port = rank0[1].rsplit(":", 1)[1]
    assert rank1 == [f"rank 1 got: welcome from 127.0.0.1:{port}"]


def test_cancel_while_running_kills_the_process_group_within_the_grace(fleet):
    http, agents = fleet(1)
    job = submit(http, [PY, "-c", STUBBORN], name="cancel-me")
    lines = wait_until(lambda: job_logs(http, job["id"]), timeout=60, message="the pids in the log")
    pids = [int(p) for p in lines[0]["text"].split()]
    assert all(alive(p) for p in pids)
    http("POST", f"/api/v1/jobs/{job['id']}/cancel", expect=200)
    # The agent hears of it at its next heartbeat (1 s), then SIGTERM, then SIGKILL after the grace.
    assert wait_gone(pids, GRACE + 10), agents[0].log
    done = wait_job(http, job["id"])
    assert done["state"] == "cancelled"
    agents[0].wait_for_line(r"task \S+: cancelled, exit code 137")


def test_artifacts_reach_the_task_verified_in_its_working_directory(fleet):
    http, _agents = fleet(1)
    data = os.urandom(100_000)
    sha = hashlib.sha256(data).hexdigest()
    stored = http(
        "PUT",
        "/api/v1/artifacts",
        expect=201,
        data=data,
        headers={"X-Artifact-Name": "weights.bin", "X-Artifact-Kind": "model"},
    ).json()
    assert stored["sha256"] == sha
    code = "import hashlib; print(hashlib.sha256(open('in/weights.bin', 'rb').read()).hexdigest())"
    job = submit(
        http,
        [PY, "-c", code],
        name="artifact",
        artifacts=[{"sha256": sha, "path": "in/weights.bin"}],
    )
    assert wait_job(http, job["id"])["state"] == "succeeded"
    assert [line["text"] for line in job_logs(http, job["id"])] == [sha]


def test_a_sigkilled_agents_task_is_requeued_once_and_completes_on_the_other_node_exactly_once(
    fleet, tmp_path, gate
):
    http, agents = fleet(2)
    side = tmp_path / "side"
    side.mkdir()
    code = (
        "import os, sys\n" + GATE_WAIT + "side, release = sys.argv[1], sys.argv[2]\n"
        "open(os.path.join(side, f\"started-{os.environ['FLEET_TASK_EPOCH']}-{os.getpid()}\"), "
        "'w').close()\n"
        "print('started', os.getpid(), flush=True)\n"
        "gate_wait(release, 120)\n"
        "with open(os.path.join(side, 'completions'), 'a') as fh:\n"
        "    fh.write(os.environ['FLEET_TASK_EPOCH'] + '\\n')\n"
        "print('completed', flush=True)\n"
    )
    job = submit(
        http,
        [PY, "-c", code, str(side), gate.path],
        name="survivor",
        retry={"max_attempts": 2, "on": ["node_lost"]},
    )
    first = wait_until(
        lambda: [p.name for p in side.iterdir() if p.name.startswith("started-")],
        timeout=60,
        message="the first start",
    )
    first_pid = int(first[0].rsplit("-", 1)[1])
    running = wait_job(
        http,
        job["id"],
        lambda j: j["tasks"] and j["tasks"][0]["state"] == "running",
        message="the task to run",
    )
    victim = agent_of(agents, running["tasks"][0]["node_id"])
    survivor = next(a for a in agents if a is not victim)

    victim.signal(signal.SIGKILL)
    victim.wait()
    assert alive(first_pid)  # its own session: the agent's death does not end it
    moved = wait_job(
        http,
        job["id"],
        lambda j: (
            j["attempt"] == 2
            and j["tasks"][0]["state"] == "running"
            and j["tasks"][0]["node_id"] == survivor.node()["node_id"]
        ),
        timeout=60,
        message="the retry to run on the other node",
    )
    assert moved["state"] == "running"
    wait_until(
        lambda: len([p for p in side.iterdir() if p.name.startswith("started-")]) == 2,
        timeout=30,
        message="the second start",
    )

    # It comes back and takes its task back; fleetd has moved it on, so the old copy is ended.
    victim.start()
    victim.wait_for_line(r"no longer leases it to this node \(fleetd answered 409", timeout=60)
    assert wait_gone([first_pid], 10)
    gate.open()
    done = wait_job(http, job["id"])
    assert done["state"] == "succeeded" and done["attempt"] == 2
    result = http("GET", f"/api/v1/jobs/{job['id']}/result", expect=200).json()
    assert [(t["node_id"], t["exit_code"]) for t in result["tasks"]] == [
        (survivor.node()["node_id"], 0)
    ]
    assert (side / "completions").read_text().splitlines() == [moved_epoch(side)]
    texts = [line["text"] for line in job_logs(http, job["id"])]
    assert texts.count("completed") == 1


def test_an_agent_killed_and_back_within_the_lease_takes_its_task_back_and_reports_the_real_outcome(
    fleet, gate
):
    """An agent SIGKILLed and restarted before the lease expires finds its task still running (its
    output goes into files, its exit status is recorded by a root-owned shell): it watches it again,
    the task runs on undisturbed, and the outcome it reports is the task's own; nothing runs
    twice."""
    http, agents = fleet(1)
    code = (
        "import os, sys\n" + GATE_WAIT + "print('before', os.getpid(), flush=True)\n"
        "gate_wait(sys.argv[1], 120)\n"
        "print('after', os.getpid(), flush=True)\n"
        "sys.exit(3)\n"
    )
    job = submit(
        http, [PY, "-c", code, gate.path], name="orphan", retry={"max_attempts": 1, "on": []}
    )
    wait_job(
        http,
        job["id"],
        lambda j: j["tasks"] and j["tasks"][0]["state"] == "running",
        message="the task to run",
    )
    pid = int(
        wait_until(lambda: job_logs(http, job["id"]), message="its first line")[0]["text"].split()[
            1
        ]
    )
    agent = agents[0]
    agent.signal(signal.SIGKILL)
    agent.wait()
    assert alive(pid)
    agent.start()  # back before the lease expires
    agent.wait_for_line(r"took back pid \d+, which ran on while the agent was down", timeout=30)
    assert alive(pid)
    gate.open()
    done = wait_job(http, job["id"])
    assert done["state"] == "failed" and done["attempt"] == 1, json.dumps(done)
    [task] = http("GET", f"/api/v1/jobs/{job['id']}/result", expect=200).json()["tasks"]
    assert (task["outcome"], task["exit_code"], task["reason"]) == ("failed", 3, "exit code 3")
    texts = [line["text"] for line in job_logs(http, job["id"])]
    assert texts == [f"before {pid}", f"after {pid}"]  # one process, through the restart


def test_a_partitioned_nodes_job_stops_before_fleetd_reruns_it_elsewhere(
    server_factory, admin, agent_factory, tmp_path
):
    """The agent reaches fleetd through a proxy that stops forwarding (requests hang, nothing is
    refused). fleetd declares the node lost and reruns the job on the other node once the task's
    lease has run out; the cut-off copy must have stopped before that: no moment with two copies
    running."""
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http.create_root_fleet("lab")
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 10}).json()[
        "token"
    ]
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    proxy = TcpProxy((host, int(port)))
    try:
        cut_off = agent_factory("cut-off", shape="l4_x4", extra={"tasks_kill_grace_seconds": GRACE})
        cut_off.join(join, proxy.url)
        cut_off.start()
        wait_until(
            lambda: (
                http("GET", f"/api/v1/nodes/{cut_off.node()['node_id']}", expect=200).json()[
                    "status"
                ]
                == "ready"
            ),
            timeout=60,
            message="the cut-off node ready",
        )
        marks = tmp_path / "ticks"  # a line per 0.05 s: '<epoch> <wall clock>'
        job = submit(
            http,
            [PY, "-c", ticks(0.05, 600), str(marks)],
            name="writer",
            retry={"max_attempts": 2, "on": ["node_lost"]},
        )

        def copies():
            seen = {}
            for line in marks.read_text().splitlines() if marks.exists() else []:
                epoch, _, at = line.partition(" ")
                if at:
                    seen.setdefault(epoch, []).append(float(at))
            return seen

        wait_until(
            lambda: "1" in copies(), timeout=60, message="the job to run on the cut-off node"
        )
        other = agent_factory("other", shape="l4_x4", extra={"tasks_kill_grace_seconds": GRACE})
        other.join(join, server.url)
        other.start()
        wait_until(
            lambda: (
                http("GET", f"/api/v1/nodes/{other.node()['node_id']}", expect=200).json()["status"]
                == "ready"
            ),
            timeout=60,
            message="the other node ready",
        )
        proxy.cut()
        wait_until(lambda: len(copies()) == 2, timeout=60, message="the rerun on the other node")
        seen = copies()
        assert max(seen["1"]) < min(seen["2"]), (max(seen["1"]), min(seen["2"]))
        cut_off.wait_for_line(r"the tasks' lease", timeout=30)
        rerun = http("GET", f"/api/v1/jobs/{job['id']}", expect=200).json()
        assert rerun["attempt"] == 2 and rerun["tasks"][0]["node_id"] == other.node()["node_id"], (
            rerun
        )
        http("POST", f"/api/v1/jobs/{job['id']}/cancel", expect=200)
    finally:
        proxy.close()
