"""An agent that stops leaves its instances running, and the next one takes them back: the runner on
its own, with real processes and the stand-in fleetd. A process that ended meanwhile is restarted
per its policy, and a pid that is another process's by now is never taken for the instance's."""

import os
import signal
import subprocess

import pytest

from agent.ports import PortAllocator
from agent.procfs import read_proc, wait_gone
from agent.task.journal import append_state, read_state
from fleetwire.heartbeat import TaskReport
from tests.agent.conftest import wait_until
from tests.agent.instance_support import PY, instance_assignment, kill_left_instances, port_range
from tests.agent.test_runner import make_runner  # noqa: F401 (fixture)
from tests.support.workloads import GATE_WAIT, hold

# Prints lines 0-19, then (at its first gate) lines 20-39, then (at its second) 'released after 40'.
CHATTY = (
    "import sys\n" + GATE_WAIT + "for i in range(20):\n"
    "    print('line', i, flush=True)\n"
    "gate_wait(sys.argv[1], 300)\n"
    "for i in range(20, 40):\n"
    "    print('line', i, flush=True)\n"
    "gate_wait(sys.argv[2], 300)\n"
    "print('released after', 40, flush=True)\n"
)
# Counts its runs in the volume, says which one it is, and holds until stopped.
COUNTER = (
    "import os\n"
    "path = os.path.join(os.environ['FLEET_VOLUME'], 'runs')\n"
    "open(path, 'a').write('x')\n"
    "print('run', len(open(path).read()), flush=True)\n" + hold(300)
)


@pytest.fixture
def node(make_runner, tmp_path):  # noqa: F811
    low, high = port_range()
    made = []

    def start():
        made.append(make_runner("node", ports=PortAllocator(str(tmp_path / "node"), low, high)))
        return made[-1]

    yield start
    for runner in made:
        runner.shutdown("test over", timeout=15, stop_instances=True)
    kill_left_instances(tmp_path / "node")  # a run a failed test left between two agents


def _record(tmp_path, task_id):
    return read_state(tmp_path / "node" / "tasks" / f"{task_id}.1" / "task.json")


def _started_pid(fleetd, task_id):  # noqa: F811
    return fleetd.wait_for(lambda: fleetd.started.get(task_id), message="the start")["pid"]


def test_a_stopping_agent_leaves_the_instance_running_and_the_next_one_ships_its_output_onward(
    node, fleetd, tmp_path, gates
):  # noqa: F811
    more, release = gates(), gates()
    runner = node()
    runner.submit(instance_assignment("t-chatty", [PY, "-c", CHATTY, more.path, release.path]))
    pid = _started_pid(fleetd, "t-chatty")
    wait_until(lambda: len(fleetd.texts("t-chatty")) >= 20, message="some lines")
    assert runner.shutdown("fleet-agent stopped", timeout=15) == 0  # no task was stopped
    assert read_proc(pid) is not None and "t-chatty" not in fleetd.finished
    more.open()
    stdout = tmp_path / "node" / "tasks" / "t-chatty.1" / "stdout.log"
    wait_until(
        lambda: "line 39\n" in stdout.read_text(), message="lines written while no agent runs"
    )
    assert len(fleetd.texts("t-chatty")) == 20

    again = node()
    assert again.recover() == []  # nothing killed, nothing reported
    assert again.get("t-chatty") is not None
    wait_until(
        lambda: again.workers.report() == [TaskReport("t-chatty", 1, "running")],
        message="the heartbeat's view of it (its lease renewed)",
    )
    release.open()
    finish = fleetd.wait_finished("t-chatty")
    assert (finish["outcome"], finish["exit_code"]) == (
        "succeeded",
        0,
    )  # its status, though no child of this agent
    texts = fleetd.texts("t-chatty", "stdout")
    assert texts == [f"line {i}" for i in range(40)] + ["released after 40"]  # each line once
    assert wait_gone([pid], 5)


def test_an_instance_killed_while_the_agent_was_down_is_restarted_per_its_policy(
    node, fleetd, tmp_path
):  # noqa: F811
    runner = node()
    runner.submit(instance_assignment("t-count", [PY, "-c", COUNTER], restart="on-failure"))
    pid = _started_pid(fleetd, "t-count")
    wait_until(lambda: fleetd.texts("t-count", "stdout") == ["run 1"], message="the first run")
    runner.shutdown("fleet-agent stopped", timeout=15)
    os.killpg(pid, signal.SIGKILL)  # the whole group: its shell writes no exit status
    assert wait_gone([pid], 10)

    again = node()
    assert again.recover() == []
    wait_until(
        lambda: fleetd.texts("t-count", "stdout") == ["run 1", "run 2"], message="the restart"
    )
    assert any("exit status is unknown" in t for t in fleetd.texts("t-count", "system"))
    assert again.get("t-count").restarts == 1 and _record(tmp_path, "t-count")["restarts"] == 1
    assert "t-count" not in fleetd.finished
    again.cancel(["t-count"], "stopped by its owner")
    assert fleetd.wait_finished("t-count")["outcome"] == "cancelled"


def test_an_instance_that_ended_well_while_the_agent_was_down_finishes_with_its_status(
    node, fleetd, gate
):  # noqa: F811
    runner = node()
    runner.submit(
        instance_assignment(
            "t-ends", [PY, "-c", CHATTY, gate.path, gate.path], restart="on-failure"
        )
    )
    pid = _started_pid(fleetd, "t-ends")
    runner.shutdown("fleet-agent stopped", timeout=15)
    gate.open()
    assert wait_gone([pid], 10)

    node().recover()
    finish = fleetd.wait_finished("t-ends")
    assert (finish["outcome"], finish["exit_code"]) == (
        "succeeded",
        0,
    )  # on-failure: exit 0 is not restarted
    assert fleetd.texts("t-ends", "stdout")[-1].startswith("released after")


def test_a_pid_that_is_another_process_by_now_is_neither_adopted_nor_killed(node, fleetd, tmp_path):  # noqa: F811
    runner = node()
    runner.submit(instance_assignment("t-gone", [PY, "-c", COUNTER], restart="never"))
    pid = _started_pid(fleetd, "t-gone")
    runner.shutdown("fleet-agent stopped", timeout=15)
    os.killpg(pid, signal.SIGKILL)
    assert wait_gone([pid], 10)
    # A process of someone else's, and a journal that names its pid (as if the pid had been reused).
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        record = _record(tmp_path, "t-gone")
        append_state(
            tmp_path / "node" / "tasks" / "t-gone.1" / "task.json",
            dict(record, pid=stranger.pid, pgid=stranger.pid),
        )
        node().recover()
        finish = fleetd.wait_finished("t-gone")
        assert finish["outcome"] == "failed" and "exit status is unknown" in finish["reason"]
        assert stranger.poll() is None and read_proc(stranger.pid) is not None
    finally:
        stranger.kill()
        stranger.wait(10)


def test_a_revoked_node_stops_its_instances(node, fleetd, tmp_path):  # noqa: F811
    runner = node()
    runner.submit(instance_assignment("t-rev", [PY, "-c", COUNTER], restart="always"))
    pid = _started_pid(fleetd, "t-rev")
    assert runner.shutdown("node revoked", timeout=15, lost=False, stop_instances=True) == 1
    finish = fleetd.wait_finished("t-rev")
    assert (
        finish["outcome"] == "failed"
        and finish["reason"].startswith("node revoked")
        and "lost" not in finish
    )
    assert wait_gone([pid], 10)
    assert os.path.isdir(
        tmp_path / "node" / "volumes" / "inst-1"
    )  # only fleetd's delete_volumes removes it


def test_an_agent_stop_during_a_back_off_leaves_the_restart_to_the_next_start(
    node, fleetd, tmp_path
):  # noqa: F811
    # Fails three times (back-offs of 1, 2, then 4 s), then runs.
    code = (
        "import os, sys\n"
        "path = os.path.join(os.environ['FLEET_VOLUME'], 'runs')\n"
        "open(path, 'a').write('x')\n"
        "runs = len(open(path).read())\n"
        "print('run', runs, flush=True)\n"
        "if runs <= 3:\n"
        "    sys.exit(5)\n" + hold(300)
    )
    runner = node()
    runner.submit(instance_assignment("t-backoff", [PY, "-c", code], restart="on-failure"))
    wait_until(
        lambda: any("restarting it in 4s" in t for t in fleetd.texts("t-backoff", "system")),
        timeout=30,
        message="the third back-off",
    )
    assert runner.shutdown("fleet-agent stopped", timeout=15) == 0
    assert fleetd.texts("t-backoff", "stdout") == [
        "run 1",
        "run 2",
        "run 3",
    ]  # no restart by the stopping agent

    again = node()
    again.recover()
    wait_until(
        lambda: fleetd.texts("t-backoff", "stdout") == ["run 1", "run 2", "run 3", "run 4"],
        message="the restart by the next agent",
    )
    assert any(
        "ended while fleet-agent was not running (exit code 5)" in t
        for t in fleetd.texts("t-backoff", "system")
    )
    assert again.get("t-backoff").restarts == 3 and "t-backoff" not in fleetd.finished
    again.cancel(["t-backoff"], "stop")
    assert fleetd.wait_finished("t-backoff")["outcome"] == "cancelled"
