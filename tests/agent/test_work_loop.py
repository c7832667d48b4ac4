"""`fleet-agent run` processes doing work for a stand-in fleetd: acquire, heartbeat renewal and
cancel, SIGTERM, an outage, and SIGKILL with the restart that cleans up after it."""

import signal
import sys
import time

import pytest
import requests

from agent.procfs import read_proc, wait_gone
from agent.state import State
from tests.agent.conftest import wait_until
from tests.agent.instance_support import instance_assignment
from tests.support import wire
from tests.support.workloads import GATED

pytestmark = pytest.mark.integration

PY = sys.executable


@pytest.fixture
def worker_agent(agent_factory, fleetd):
    """An enrolled `fleet-agent run` against the stand-in fleetd (credentials written directly)."""

    def make(name="worker"):
        agent = agent_factory(
            name,
            shape="l4_x4",
            server_url=fleetd.url,
            extra={"heartbeat_interval_seconds": 0.5, "tasks_kill_grace_seconds": 2.0},
        )
        State(str(agent.state_dir)).save_enrolment(
            {
                "node_id": f"node-{name}",
                "fleet": "lab",
                "server_url": fleetd.url,
                "machine_id": name,
            },
            "fln_test",
        )
        return agent

    return make


def assignment(task_id, command, **overrides):
    return wire.assignment(task_id, command, **{"env": {"GREETING": "hi"}, **overrides})


def alive(pid):
    return read_proc(pid) is not None


def reported(fleetd, task_id, state):
    return any(
        {"id": task_id, "epoch": 1, "state": state} in hb.get("tasks", [])
        for hb in fleetd.heartbeats
    )


def test_agent_acquires_runs_and_reports_a_task_that_heartbeats_and_the_local_api_show(
    worker_agent, fleetd, gate
):
    agent = worker_agent().start()
    gpu = "GPU-2b7d4f6a-6c1e-4f7a-8d8e-0000000000c0"
    fleetd.assign(assignment("t-1", [PY, "-c", GATED, gate.path], gpus=[{"uuid": gpu}]))
    pid = fleetd.wait_for(lambda: fleetd.started.get("t-1"), message="start")["pid"]
    fleetd.wait_for(
        lambda: reported(fleetd, "t-1", "running"), message="the heartbeat to list the task"
    )
    token = agent.local_token()
    workers = requests.get(
        agent.local_url + "/api/v1/workers",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()["data"]
    # The leader is the root-owned shell that records the exit status; the task is its child.
    [(task_id, (leader, task_pid), devices)] = [
        (w["task_id"], w["pids"], w["env"]["CUDA_VISIBLE_DEVICES"]) for w in workers
    ]
    assert (task_id, leader, devices) == ("t-1", pid, gpu)
    gate.open()
    assert fleetd.wait_outcome("t-1") == {"epoch": 1, "outcome": "succeeded", "exit_code": 0}
    assert fleetd.texts("t-1") == [str(task_pid), "released"]


def acquires(fleetd):
    return [c for c in fleetd.calls if c[1] == "/api/v1/agent/acquire"]


def test_assignments_waiting_for_the_agent_come_in_one_acquire_and_all_run(worker_agent, fleetd):
    for i in range(4):
        fleetd.assign(assignment(f"t-batch-{i}", [PY, "-c", "print('ran')"]))
    worker_agent().start()
    for i in range(4):
        assert fleetd.wait_finished(f"t-batch-{i}")["outcome"] == "succeeded"
        assert fleetd.texts(f"t-batch-{i}") == ["ran"]
    assert acquires(fleetd)[0][2]["max_assignments"] > 1
    assert not fleetd.assignments  # all four delivered by the first acquire


def test_an_older_fleetd_that_refuses_batches_gets_one_acquire_per_assignment(worker_agent, fleetd):
    fleetd.strict_acquire = True
    for i in range(2):
        fleetd.assign(assignment(f"t-one-{i}", [PY, "-c", "print('ran')"]))
    agent = worker_agent().start()
    for i in range(2):
        assert fleetd.wait_finished(f"t-one-{i}")["outcome"] == "succeeded"
    agent.wait_for_line(r"does not deliver assignments in batches")
    assert "max_assignments" not in acquires(fleetd)[-1][2]


def test_a_task_in_the_heartbeats_cancel_list_is_stopped_and_reported_cancelled(
    worker_agent, fleetd
):
    worker_agent().start()
    fleetd.assign(assignment("t-cancel", [PY, "-c", GATED]))
    pid = fleetd.wait_for(lambda: fleetd.started.get("t-cancel"), message="start")["pid"]
    fleetd.cancel.add("t-cancel")
    finish = fleetd.wait_finished("t-cancel")
    assert finish["outcome"] == "cancelled" and finish["reason"].startswith("cancelled by fleetd")
    assert wait_gone([pid], 10)


def test_running_tasks_keep_running_through_a_fleetd_outage_and_the_finish_arrives_after_it(
    worker_agent, fleetd, gate
):
    agent = worker_agent().start()
    fleetd.assign(assignment("t-out", [PY, "-c", GATED, gate.path]))
    pid = fleetd.wait_for(lambda: fleetd.started.get("t-out"), message="start")["pid"]
    fleetd.down.add("all")
    agent.wait_for_line(r"fleetd unreachable \(attempt 2\)")
    assert alive(pid)
    gate.open()
    agent.wait_for_line(r"task t-out/1: a batch of output not delivered yet")
    wait_until(lambda: not alive(pid), message="the task to end during the outage")
    fleetd.down.clear()
    assert fleetd.wait_finished("t-out")["outcome"] == "succeeded"
    assert fleetd.texts("t-out")[-1] == "released"


def test_sigterm_stops_the_agents_tasks_and_reports_them(worker_agent, fleetd):
    agent = worker_agent().start()
    fleetd.assign(assignment("t-term", [PY, "-c", GATED]))
    pid = fleetd.wait_for(lambda: fleetd.started.get("t-term"), message="start")["pid"]
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=60) == 0
    assert wait_gone([pid], 10)
    finish = fleetd.wait_finished("t-term")
    assert finish["outcome"] == "failed" and finish["reason"].startswith("fleet-agent stopped")
    assert finish["lost"] is True


def test_revocation_stops_every_task_before_the_agent_exits(worker_agent, fleetd):
    agent = worker_agent().start()
    fleetd.assign(assignment("t-rev-1", [PY, "-c", GATED]))
    fleetd.assign(assignment("t-rev-2", ["sh", "-c", "trap '' TERM; echo $$; sleep 300"]))
    pids = [
        fleetd.wait_for(lambda t=t: fleetd.started.get(t), message="start")["pid"]
        for t in ("t-rev-1", "t-rev-2")
    ]
    fleetd.revoked = True
    assert agent.wait(timeout=60) == 3
    assert wait_gone(pids, 10)
    assert not [
        body for body in fleetd.finished.values() if body.get("lost")
    ]  # revoked: not a lost node
    assert "was revoked by fleetd" in agent.log


def test_a_sigkilled_agent_takes_its_tasks_back_and_stops_those_fleetd_gave_away(
    worker_agent, fleetd, gate
):
    agent = worker_agent().start()
    fleetd.assign(assignment("t-kept", [PY, "-c", GATED, gate.path]))
    fleetd.assign(assignment("t-moved", [PY, "-c", GATED]))
    pids = [
        fleetd.wait_for(lambda t=t: fleetd.started.get(t), message="start")["pid"]
        for t in ("t-kept", "t-moved")
    ]
    agent.signal(signal.SIGKILL)
    agent.wait()
    assert all(
        alive(pid) for pid in pids
    )  # tasks run in their own sessions: the agent's death leaves them
    fleetd.fenced.add("t-moved")  # its lease expired and it runs elsewhere now: stale epoch ...
    fleetd.cancel.add("t-moved")  # ... which fleetd's answer to the heartbeat that lists it says
    agent.start()
    agent.wait_for_line(
        r"task t-moved/1: fleetd no longer leases it to this node \(fleetd answered 409"
    )
    assert wait_gone([pids[1]], 10)
    assert alive(pids[0])  # still fleetd's: taken back, running on
    gate.open()
    assert fleetd.wait_outcome("t-kept") == {"epoch": 1, "outcome": "succeeded", "exit_code": 0}
    assert fleetd.texts("t-kept")[-1] == "released"
    assert "t-moved" not in fleetd.finished


def test_a_gang_rank_still_at_the_rendezvous_when_the_agent_dies_is_reported_as_never_started(
    worker_agent, fleetd
):
    agent = worker_agent().start()
    fleetd.assign(
        assignment("t-rank1", [PY, "-c", GATED], rank=1, num_nodes=2)
    )  # rank 0 never publishes
    fleetd.wait_for(
        lambda: any(
            c[0] == "GET" and c[1].startswith("/api/v1/agent/tasks/t-rank1/rendezvous")
            for c in list(fleetd.calls)
        ),
        message="rank 1 waiting at the rendezvous",
    )
    agent.signal(signal.SIGKILL)
    agent.wait()
    agent.start()
    finish = fleetd.wait_finished("t-rank1")
    assert finish["outcome"] == "failed" and finish.get("lost") is True, finish
    assert (
        finish["reason"]
        == "fleet-agent restarted before the task's command started; nothing of it ran"
    )
    assert "t-rank1" not in fleetd.started


def job_and_instance_under_a_lease(worker_agent, fleetd, job="t-job", inst="t-inst"):
    """An agent told a 9 s lease, running a job task and an instance that a heartbeat has renewed:
    the fence moment is 9 x 0.98 - 2 (grace) - 2 (safety) = 4.8 s after the last answered send.
    Returns (agent, the job's pid, the instance's pid)."""
    fleetd.lease_seconds = 9
    agent = worker_agent().start()
    fleetd.assign(assignment(job, [PY, "-c", GATED]))
    fleetd.assign(instance_assignment(inst, [PY, "-c", GATED], instance_id=f"i-{inst}"))
    job_pid = fleetd.wait_for(lambda: fleetd.started.get(job), message="job start")["pid"]
    inst_pid = fleetd.wait_for(lambda: fleetd.started.get(inst), message="instance start")["pid"]
    wait_until(
        lambda: reported(fleetd, job, "running"), message="a heartbeat that renews the lease"
    )
    return agent, job_pid, inst_pid


def test_a_node_cut_off_from_fleetd_stops_its_job_tasks_before_their_lease_ends_and_keeps_instances(
    worker_agent, fleetd
):
    agent, job_pid, inst_pid = job_and_instance_under_a_lease(worker_agent, fleetd)
    fleetd.down.add("heartbeat")  # a partition as the lease sees it: heartbeats go unanswered
    cut = time.monotonic()
    agent.wait_for_line(r"fleetd could not be reached for 9s, the tasks' lease", timeout=30)
    wait_until(lambda: not alive(job_pid), message="the job task to stop")
    assert time.monotonic() - cut < 9  # before fleetd could count its lease out, from the cut on
    finish = fleetd.wait_finished("t-job")
    assert (
        finish["outcome"] == "failed" and finish.get("lost") is True and "lease" in finish["reason"]
    ), finish
    assert alive(inst_pid)  # instances are never run elsewhere: they run on through a partition
    fleetd.down.clear()


def test_a_dead_agents_fence_keeper_stops_its_job_tasks_when_their_lease_ends_and_keeps_instances(
    worker_agent, fleetd
):
    agent, job_pid, inst_pid = job_and_instance_under_a_lease(worker_agent, fleetd)
    keeper = agent.keeper_pid()
    assert keeper is not None
    agent.signal(signal.SIGKILL)  # no agent left to stop anything
    agent.wait()
    killed = time.monotonic()
    assert alive(job_pid) and alive(keeper)
    try:
        wait_until(
            lambda: not alive(job_pid), timeout=15, message="the keeper to stop the job task"
        )
    except AssertionError as exc:  # what the keeper did, for a failure under load
        log = agent.state_dir / "keeper.log"
        raise AssertionError(
            f"{exc}; keeper.log: {log.read_text() if log.exists() else 'none'}; "
            f"keeper alive: {alive(keeper)}"
        ) from None
    assert time.monotonic() - killed < 9  # before fleetd could count its lease out
    assert alive(inst_pid)  # instances are never fenced
    agent.start()  # the task ended with no status: reported lost, as fleetd has ruled by now
    finish = fleetd.wait_finished("t-job")
    assert finish["outcome"] == "failed" and finish.get("lost") is True, finish
    assert "recorded no exit status" in finish["reason"]
    assert alive(inst_pid)
