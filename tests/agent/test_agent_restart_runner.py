"""The runner tells fleetd when it stops a task because the agent shuts down (`agent_stopping`),
and only then: fleetd requeues those jobs without using an attempt."""

import os
import signal

from agent.procfs import wait_gone
from agent.task.journal import read_state
from tests.agent.conftest import wait_until
from tests.agent.test_runner import assignment, make_runner  # noqa: F401 (fixtures)


def _pid(fleetd, task_id):
    return fleetd.wait_for(lambda: fleetd.started.get(task_id), message="start")["pid"]


def test_a_shutdown_reports_its_tasks_as_stopped_by_the_agent(make_runner, fleetd):
    runner = make_runner("node")
    runner.submit(assignment("t-stop", ["sh", "-c", "sleep 300"]))
    pid = _pid(fleetd, "t-stop")
    assert runner.shutdown("fleet-agent stopped", timeout=15) == 1
    assert wait_gone([pid], 10)
    finish = fleetd.wait_finished("t-stop")
    assert (
        finish["outcome"] == "failed"
        and finish["lost"] is True
        and finish["agent_stopping"] is True
    )


def test_an_undelivered_shutdown_report_keeps_agent_stopping_for_the_next_start(
    make_runner, fleetd, tmp_path
):
    fleetd.down.add("finish")
    runner = make_runner("node")
    runner.submit(assignment("t-later", ["sh", "-c", "sleep 300"]))
    pid = _pid(fleetd, "t-later")
    runner.shutdown("fleet-agent stopped", timeout=15)
    assert wait_gone([pid], 10)
    assert (
        read_state(tmp_path / "node" / "tasks" / "t-later.1" / "task.json")["agent_stopping"]
        is True
    )
    fleetd.down.clear()
    make_runner("node").recover()
    finish = fleetd.wait_finished("t-later")
    assert finish["lost"] is True and finish["agent_stopping"] is True


def test_a_task_killed_from_outside_is_not_reported_as_stopped_by_the_agent(make_runner, fleetd):
    runner = make_runner("node")
    runner.submit(assignment("t-killed", ["sh", "-c", "exec sleep 300"]))
    os.kill(_pid(fleetd, "t-killed"), signal.SIGKILL)
    finish = fleetd.wait_finished("t-killed")
    assert finish["outcome"] == "failed" and "lost" not in finish and "agent_stopping" not in finish


def test_an_assignment_that_comes_while_the_agent_stops_is_handed_back(make_runner, fleetd):
    runner = make_runner("node")
    runner.shutdown("fleet-agent stopped", timeout=5)
    assert runner.submit(assignment("t-late", ["sh", "-c", "sleep 300"], epoch=4)) is None
    finish = fleetd.wait_finished("t-late")
    assert finish == {
        "epoch": 4,
        "outcome": "failed",
        "reason": "not started: fleet-agent is stopping",
        "lost": True,
        "agent_stopping": True,
    }
    assert "t-late" not in fleetd.started


def test_a_fleetd_that_does_not_know_agent_stopping_gets_the_finish_without_it(make_runner, fleetd):
    fleetd.strict_finish = True  # refuses every field beyond epoch, outcome, exit_code, reason
    runner = make_runner("node")
    runner.submit(assignment("t-old", ["sh", "-c", "sleep 300"]))
    _pid(fleetd, "t-old")
    runner.shutdown("fleet-agent stopped", timeout=15)
    finish = wait_until(lambda: fleetd.finished.get("t-old"), message="the finish")
    assert finish["outcome"] == "failed" and "agent_stopping" not in finish and "lost" not in finish
