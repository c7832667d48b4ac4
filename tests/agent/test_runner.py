"""The task runner with real processes against a stand-in fleetd on loopback
(tests/agent/fakefleetd.py)."""

import hashlib
import json
import os
import signal
import subprocess
import sys

import pytest

from agent.client import FleetClient
from agent.procfs import read_boot_id, read_proc, read_stat, uptime_ticks, wait_gone
from agent.task.assignment import inside
from agent.task.errors import TaskError
from agent.task.journal import append_state, read_state
from agent.task.output import OutputSettings
from agent.task.runner import Runner
from agent.task.supervisor import check_executable
from agent.task.texts import TEXT_BYTES, TRUNCATED_MARK
from agent.workers import Workers
from fleetwire.assignment import Assignment
from fleetwire.heartbeat import TaskReport
from fleetwire.output import MAX_LINE_BYTES
from tests.agent.conftest import wait_until
from tests.support import wire
from tests.support.workloads import GATE_WAIT, STUBBORN, WAIT_FOR_GATE, hold

PY = sys.executable
GPU_A = "GPU-5f3c6b1e-7a1d-4c2e-9b0f-000000000000"
GPU_B = "GPU-5f3c6b1e-7a1d-4c2e-9b0f-000000000001"


@pytest.fixture
def make_runner(tmp_path, fleetd):
    """Runner(s) with fast retries and a small grace, each with its own state dir; all shut down at
    the end."""
    made = []

    def make(name="node", output_settings=None, **kwargs):
        kwargs.setdefault("kill_grace_seconds", 1.0)
        runner = Runner(
            str(tmp_path / name),
            Workers(),
            lambda: FleetClient(fleetd.url, "fln_test", timeout=10),
            "127.0.0.1",
            backoff_max_seconds=0.2,
            output_settings=output_settings
            or OutputSettings(interval_seconds=0.05, backoff_max_seconds=0.2),
            **kwargs,
        )
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.shutdown("test over", timeout=15)


assignment = wire.assignment


def alive(pid):
    return read_proc(pid) is not None


def test_task_runs_in_its_own_session_and_workdir_with_the_injected_env(
    make_runner, fleetd, monkeypatch, tmp_path
):
    monkeypatch.setenv("FLEET_AGENT_JOIN_TOKEN", "flj_abc.secret")
    runner = make_runner()
    code = (
        "import json, os; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(), 'pid': "
        "os.getpid(), 'pgid': os.getpgrp(), 'sid': os.getsid(0)}))"
    )
    task = runner.submit(
        assignment(
            "t-env",
            [PY, "-c", code],
            epoch=7,
            env={"FOO": "bar", "CUDA_VISIBLE_DEVICES": "all"},
            gpus=[{"uuid": GPU_A}, {"uuid": GPU_B, "memory_limit_bytes": 1 << 30}],
        )
    )
    assert fleetd.wait_outcome("t-env") == {"epoch": 7, "outcome": "succeeded", "exit_code": 0}
    seen = json.loads(fleetd.texts("t-env", "stdout")[0])
    env = seen["env"]
    assert env["FOO"] == "bar"
    assert env["CUDA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"  # the spec cannot widen its GPUs
    assert env["FLEET_JOB_ID"] == "job-t-env" and env["FLEET_TASK_ID"] == "t-env"
    assert (env["FLEET_NODE_RANK"], env["FLEET_NUM_NODES"], env["FLEET_GPUS_PER_NODE"]) == (
        "0",
        "1",
        "2",
    )
    assert (env["NODE_RANK"], env["WORLD_SIZE"]) == ("0", "1")
    assert env["MASTER_ADDR"] == env["FLEET_MASTER_ADDR"] == "127.0.0.1"
    assert env["MASTER_PORT"] == env["FLEET_MASTER_PORT"] and int(env["MASTER_PORT"]) > 0
    assert not [k for k in env if k.startswith("FLEET_AGENT_")]
    # Its own session, led by the root-owned shell that records its exit status (the reported pid).
    assert seen["pgid"] == seen["sid"] == fleetd.started["t-env"]["pid"] != os.getpid()
    assert seen["pid"] != seen["sid"]
    assert seen["cwd"] == os.path.join(str(tmp_path / "node"), "tasks", "t-env.7", "work")
    assert fleetd.started["t-env"]["epoch"] == 7
    wait_until(
        lambda: not os.path.exists(task.dir), message="the task dir to be removed once reported"
    )


def test_a_relative_workdir_is_created_inside_the_task_directory_and_an_escaping_one_refused(
    make_runner, fleetd
):
    runner = make_runner()
    runner.submit(
        assignment("t-wd", [PY, "-c", "import os; print(os.getcwd())"], workdir="src/app")
    )
    runner.submit(assignment("t-wd-up", [PY, "-c", "print('ran')"], workdir="../../.."))
    assert fleetd.wait_finished("t-wd")["outcome"] == "succeeded"
    assert fleetd.texts("t-wd")[0].endswith(os.path.join("tasks", "t-wd.1", "work", "src", "app"))
    refused = fleetd.wait_finished("t-wd-up")
    assert refused["outcome"] == "failed" and "workdir" in refused["reason"]


def test_worker_registry_shows_the_running_task_and_forgets_it_after_the_finish(
    make_runner, fleetd, gate
):
    runner = make_runner()
    runner.submit(
        assignment(
            "t-reg",
            [PY, "-c", WAIT_FOR_GATE, gate.path],
            gpus=[{"uuid": GPU_A}],
            max_runtime_seconds=300,
        )
    )
    fleetd.wait_for(lambda: "t-reg" in fleetd.started, message="start")
    worker = runner.workers.get("t-reg")
    view = worker.to_dict()
    assert (
        view["state"] == "running" and view["pids"][0] == fleetd.started["t-reg"]["pid"]
    )  # the wrapper, then the task
    assert len(view["pids"]) == 2
    assert view["env"]["CUDA_VISIBLE_DEVICES"] == GPU_A and view["gpus"] == [{"uuid": GPU_A}]
    assert view["limits"]["max_runtime_seconds"] == 300
    assert runner.workers.report() == [TaskReport("t-reg", 1, "running")]
    gate.open()
    assert fleetd.wait_finished("t-reg")["outcome"] == "succeeded"
    wait_until(lambda: runner.workers.all() == [], message="the worker to be removed")


def test_failing_command_is_failed_with_its_exit_code_and_a_missing_program_cannot_start(
    make_runner, fleetd
):
    runner = make_runner()
    runner.submit(
        assignment("t-fail", [PY, "-c", "import sys; print('bye', file=sys.stderr); sys.exit(3)"])
    )
    runner.submit(assignment("t-missing", ["/nonexistent/program"]))
    assert fleetd.wait_outcome("t-fail") == {
        "epoch": 1,
        "outcome": "failed",
        "exit_code": 3,
        "reason": "exit code 3",
    }
    assert fleetd.texts("t-fail", "stderr") == ["bye"]
    missing = fleetd.wait_finished("t-missing")
    assert (
        missing["outcome"] == "failed"
        and "cannot start '/nonexistent/program'" in missing["reason"]
    )
    assert "t-missing" not in fleetd.started


def test_output_arrives_complete_and_in_order_in_chunks_and_bounded_batches(make_runner, fleetd):
    runner = make_runner(
        output_settings=OutputSettings(
            batch_lines=100, interval_seconds=0.05, backoff_max_seconds=0.2
        )
    )
    code = (
        "import sys\n"
        "for i in range(3000):\n"
        "    print(f'out {i}')\n"
        "    if i % 30 == 0:\n"
        "        print(f'err {i}', file=sys.stderr)\n"
        "print('no newline at the end', end='')\n"
    )
    runner.submit(assignment("t-logs", [PY, "-c", code]))
    finish = fleetd.wait_finished("t-logs")
    assert finish["output"]["lines"] == 3101 and finish["output"]["truncated"] is False
    assert fleetd.texts("t-logs", "stdout") == [f"out {i}" for i in range(3000)] + [
        "no newline at the end"
    ]
    assert fleetd.texts("t-logs", "stderr") == [f"err {i}" for i in range(0, 3000, 30)]
    expected_bytes = (
        sum(len(f"out {i}\n") for i in range(3000))
        + sum(len(f"err {i}\n") for i in range(0, 3000, 30))
        + len("no newline at the end\n")
    )
    assert finish["output"]["bytes"] == expected_bytes
    # The lines are numbered from 0 across both streams, each once.
    assert [n for n, *_ in fleetd.chunk_lines("t-logs")] == list(range(3101))
    # Batches follow each other with no gap, each with at most batch_lines texts.
    batches = fleetd.wait_for(
        lambda: (b := fleetd.batches.get("t-logs")) and sum(x.count for x in b) == 3101 and b,
        message="the batches of every line",
    )
    assert [b.first_line for b in batches] == [
        sum(x.count for x in batches[:k]) for k in range(len(batches))
    ]
    assert max(len(b.lines) for b in batches) <= 100


def test_long_lines_are_cut_and_line_ends_and_nuls_are_normalised(make_runner, fleetd):
    runner = make_runner()
    code = (
        "import sys\n"
        f"sys.stdout.write('y' * {2 * MAX_LINE_BYTES + 5} + '\\n')\n"
        "sys.stdout.write('a\\r\\nb\\0c\\n')\n"
        "sys.stderr.write('e' * 100 + 'tail')\n"
    )
    runner.submit(assignment("t-long", [PY, "-c", code]))
    assert fleetd.wait_finished("t-long")["outcome"] == "succeeded"
    assert fleetd.texts("t-long", "stdout") == [
        "y" * MAX_LINE_BYTES,
        "y" * MAX_LINE_BYTES,
        "y" * 5,
        "a",
        "b\ufffdc",
    ]
    assert fleetd.texts("t-long", "stderr") == ["e" * 100 + "tail"]
    # A batch carries a long line's text cut and marked.
    batches = fleetd.wait_for(lambda: fleetd.batches.get("t-long"), message="a batch")
    first = next(line for b in batches for line in b.lines if line[0] == 0)
    assert first[3] == "y" * TEXT_BYTES + TRUNCATED_MARK


def test_a_batch_over_fleetds_limit_is_sent_again_with_fewer_texts(make_runner, fleetd):
    fleetd.max_log_body = 4096
    runner = make_runner(
        output_settings=OutputSettings(
            batch_lines=1000, interval_seconds=0.2, backoff_max_seconds=0.2
        )
    )
    code = "for i in range(300):\n    print(f'{i:04d} ' + 'x' * 95)\nprint('last')\n"
    runner.submit(assignment("t-413", [PY, "-c", code]))
    assert fleetd.wait_finished("t-413")["outcome"] == "succeeded"
    assert fleetd.texts("t-413") == [f"{i:04d} " + "x" * 95 for i in range(300)] + ["last"]
    batches = fleetd.wait_for(
        lambda: (b := fleetd.batches.get("t-413")) and sum(x.count for x in b) == 301 and b,
        message="batches of every line",
    )
    assert all(len(b.lines) < 40 for b in batches)  # fewer texts, every line counted
    refused = [p for m, p, _ in fleetd.calls if p.endswith("t-413/logs")]
    assert len(refused) > len(batches)  # some were answered 413 and sent again


def test_a_slow_fleetd_never_blocks_the_task_nor_its_finish_and_every_line_arrives(
    make_runner, fleetd
):
    fleetd.hold_logs.clear()
    settings = OutputSettings(
        batch_lines=200,
        batch_bytes=16 * 1024,
        interval_seconds=0.05,
        tick_bytes=64 * 1024,
        backoff_max_seconds=0.2,
    )
    runner = make_runner(output_settings=settings)
    runner.submit(
        assignment(
            "t-slow", [PY, "-c", "for i in range(20000): print(f'line {i:05d} ' + 'y' * 80)"]
        )
    )
    # The finish comes while fleetd still holds the first batch.
    finish = fleetd.wait_finished("t-slow", timeout=60)
    assert finish["outcome"] == "succeeded" and finish["output"]["lines"] == 20000
    assert not fleetd.batches.get("t-slow")
    fleetd.hold_logs.set()
    # The output waited in the task's files, not in the agent's memory: nothing is dropped.
    assert fleetd.texts("t-slow") == [f"line {i:05d} " + "y" * 80 for i in range(20000)]


def test_cancel_sigterms_the_group_and_sigkills_what_ignores_it_after_the_grace(
    make_runner, fleetd
):
    runner = make_runner(kill_grace_seconds=1.0)
    runner.submit(assignment("t-stubborn", [PY, "-c", STUBBORN]))
    fleetd.wait_for(lambda: fleetd.logs.get("t-stubborn"), message="the pids")
    pids = [int(p) for p in fleetd.texts("t-stubborn")[0].split()]
    assert all(alive(p) for p in pids)
    runner.workers.cancel(["t-stubborn"], "cancelled by fleetd")
    finish = fleetd.wait_finished("t-stubborn")
    assert finish["outcome"] == "cancelled" and finish["exit_code"] == 128 + signal.SIGKILL
    assert "cancelled by fleetd (killed by SIGKILL)" == finish["reason"]
    assert wait_gone(pids, 10)


def test_cancel_of_a_task_that_handles_sigterm_ends_it_with_sigterm(make_runner, fleetd, tmp_path):
    runner = make_runner(kill_grace_seconds=30.0)
    runner.submit(assignment("t-polite", ["sh", "-c", "echo $$; sleep 120 & wait"]))
    fleetd.wait_for(lambda: fleetd.logs.get("t-polite"), message="the pid")
    runner.workers.cancel(["t-polite"], "user asked")
    finish = fleetd.wait_finished("t-polite")
    assert finish["outcome"] == "cancelled" and finish["exit_code"] == 128 + signal.SIGTERM
    assert "killed by SIGTERM" in finish["reason"]


def test_max_runtime_is_enforced_as_a_failure(make_runner, fleetd):
    runner = make_runner()
    runner.submit(
        assignment(
            "t-long",
            [PY, "-c", "import threading; threading.Event().wait(120)"],
            max_runtime_seconds=1,
        )
    )
    finish = fleetd.wait_finished("t-long")
    assert finish["outcome"] == "failed" and "exceeded max_runtime_seconds=1" in finish["reason"]
    assert wait_gone([fleetd.started["t-long"]["pid"]], 10)


def test_what_the_leader_leaves_behind_in_its_group_is_killed_when_it_exits(make_runner, fleetd):
    runner = make_runner()
    runner.submit(assignment("t-bg", ["sh", "-c", "sleep 300 & echo $!"]))
    assert fleetd.wait_finished("t-bg")["outcome"] == "succeeded"
    assert wait_gone([int(fleetd.texts("t-bg")[0])], 10)


def test_artifacts_are_downloaded_verified_and_kept_inside_the_workdir(
    make_runner, fleetd, tmp_path
):
    data = os.urandom(300_000)
    good = hashlib.sha256(data).hexdigest()
    fleetd.artifacts[good] = data
    runner = make_runner()
    code = (
        "import hashlib; print(hashlib.sha256(open('inputs/model.bin', 'rb').read()).hexdigest())"
    )
    runner.submit(
        assignment(
            "t-art", [PY, "-c", code], artifacts=[{"sha256": good, "path": "inputs/model.bin"}]
        )
    )
    assert fleetd.wait_finished("t-art")["outcome"] == "succeeded"
    assert fleetd.texts("t-art") == [good]

    wrong = hashlib.sha256(b"what was uploaded").hexdigest()
    fleetd.artifacts[wrong] = b"something else"
    runner.submit(
        assignment("t-bad", [PY, "-c", "print('ran')"], artifacts=[{"sha256": wrong, "path": "x"}])
    )
    bad = fleetd.wait_finished("t-bad")
    assert bad["outcome"] == "failed" and "failed verification" in bad["reason"]
    assert "t-bad" not in fleetd.started

    for task_id, path in (
        ("t-up", "../escape"),
        ("t-abs", str(tmp_path / "abs")),
        ("t-deep", "a/../../b"),
    ):
        runner.submit(
            assignment(
                task_id, [PY, "-c", "print('ran')"], artifacts=[{"sha256": good, "path": path}]
            )
        )
        refused = fleetd.wait_finished(task_id)
        assert refused["outcome"] == "failed" and "artifact path" in refused["reason"]
        assert task_id not in fleetd.started
    assert not (tmp_path / "abs").exists() and not (tmp_path / "node" / "tasks" / "escape").exists()
    assert not [p for p in fleetd.paths("GET") if p.endswith(wrong)][
        1:
    ]  # a mismatch is not retried


def test_missing_artifact_fails_the_task_with_fleetds_answer(make_runner, fleetd):
    runner = make_runner()
    runner.submit(
        assignment(
            "t-404", [PY, "-c", "print('ran')"], artifacts=[{"sha256": "a" * 64, "path": "x"}]
        )
    )
    finish = fleetd.wait_finished("t-404")
    assert finish["outcome"] == "failed" and "404 not_found" in finish["reason"]
    assert "t-404" not in fleetd.started


def test_409_on_start_kills_the_process_group_at_once_and_reports_nothing(make_runner, fleetd):
    fleetd.fenced.add("t-stale")
    runner = make_runner(kill_grace_seconds=60.0)
    runner.submit(assignment("t-stale", ["sh", "-c", "trap '' TERM; sleep 300"]))
    pid = fleetd.wait_for(
        lambda: next((b["pid"] for m, p, b in fleetd.calls if p.endswith("t-stale/start")), None),
        message="the start call",
    )
    assert wait_gone([pid], 10)  # well within the 60 s grace: SIGKILL, not SIGTERM
    wait_until(
        lambda: runner.get("t-stale") is None and runner.workers.get("t-stale") is None,
        message="the task to be forgotten",
    )
    assert "t-stale" not in fleetd.finished


def test_409_on_a_log_batch_kills_a_running_task(make_runner, fleetd, gate):
    runner = make_runner(kill_grace_seconds=60.0)
    # Three lines, then one more once the test has fenced the task: that batch is answered 409.
    code = (
        "import sys\n" + GATE_WAIT + "for i in range(3):\n    print(i, flush=True)\n"
        "gate_wait(sys.argv[1])\nprint('after the fence', flush=True)\n" + hold(300)
    )
    runner.submit(assignment("t-fence", [PY, "-c", code, gate.path]))
    fleetd.wait_for(lambda: len(fleetd.logs.get("t-fence", [])) >= 3, message="some logs")
    pid = fleetd.wait_for(lambda: fleetd.started.get("t-fence"), message="the start")["pid"]
    fleetd.fenced.add("t-fence")
    gate.open()
    assert wait_gone([pid], 30)
    wait_until(lambda: runner.get("t-fence") is None, message="the task to be forgotten")
    assert "t-fence" not in fleetd.finished


def test_two_ranks_rendezvous_and_talk_over_tcp(make_runner, fleetd, gate):
    fleetd.rendezvous_wait_cap = 0.3  # rank 1 sees 504s before rank 0 publishes
    fleetd.gangs.update({"t-r0": "job-gang", "t-r1": "job-gang"})
    server = (
        "import os, socket\n"
        "s = socket.create_server((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])))\n"
        "s.settimeout(60)\n"
        "print('listening', flush=True)\n"
        "conn, _ = s.accept()\n"
        "msg = conn.recv(100).decode()\n"
        "conn.sendall(b'hello rank 1, this is rank ' + os.environ['NODE_RANK'].encode())\n"
        "print('rank 0 got:', msg)\n"
    )
    # Rank 1 connects once the test has seen rank 0 listening.
    client = (
        "import os, socket, sys\n" + GATE_WAIT + "gate_wait(sys.argv[1])\n"
        "c = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])), "
        "5)\n"
        "c.sendall(b'hello from rank ' + os.environ['FLEET_NODE_RANK'].encode())\n"
        "print('rank 1 got:', c.recv(100).decode(), os.environ['WORLD_SIZE'])\n"
    )
    node0, node1 = make_runner("node0"), make_runner("node1")
    node1.submit(
        assignment("t-r1", [PY, "-c", client, gate.path], job_id="job-gang", rank=1, num_nodes=2)
    )
    fleetd.wait_for(
        lambda: (
            sum(1 for m, p, _ in fleetd.calls if m == "GET" and p.endswith("t-r1/rendezvous")) >= 2
        ),
        message="rank 1 to wait through a 504",
    )
    assert "t-r1" not in fleetd.started
    node0.submit(assignment("t-r0", [PY, "-c", server], job_id="job-gang", rank=0, num_nodes=2))
    fleetd.wait_for(lambda: "listening" in fleetd.texts("t-r0"), message="rank 0 to listen")
    gate.open()
    assert fleetd.wait_finished("t-r0")["outcome"] == "succeeded"
    assert fleetd.wait_finished("t-r1")["outcome"] == "succeeded"
    assert fleetd.texts("t-r0") == ["listening", "rank 0 got: hello from rank 1"]
    assert fleetd.texts("t-r1") == ["rank 1 got: hello rank 1, this is rank 0 2"]
    assert fleetd.rendezvous["job-gang"]["addr"] == "127.0.0.1"


def test_rank_1_gives_up_when_rank_0_never_publishes(make_runner, fleetd):
    fleetd.rendezvous_wait_cap = 0.2
    runner = make_runner(rendezvous_timeout_seconds=1.0)
    runner.submit(assignment("t-alone", [PY, "-c", "print('ran')"], rank=1, num_nodes=2))
    finish = fleetd.wait_finished("t-alone")
    assert (
        finish["outcome"] == "failed" and "did not all arrive at the rendezvous" in finish["reason"]
    )
    assert "t-alone" not in fleetd.started


def test_finish_is_retried_through_a_fleetd_outage(make_runner, fleetd):
    fleetd.down.add("finish")
    runner = make_runner()
    runner.submit(assignment("t-outage", [PY, "-c", "print('done')"]))
    fleetd.wait_for(
        lambda: sum(1 for _, p, _b in fleetd.calls if p.endswith("t-outage/finish")) >= 2,
        message="finish retries",
    )
    assert runner.workers.report() == [TaskReport("t-outage", 1, "finishing")]
    fleetd.down.discard("finish")
    assert fleetd.wait_outcome("t-outage") == {"epoch": 1, "outcome": "succeeded", "exit_code": 0}
    assert fleetd.texts("t-outage") == ["done"]


def test_shutdown_stops_tasks_and_an_unreported_finish_is_reported_by_the_next_start(
    make_runner, fleetd, tmp_path
):
    fleetd.down.add("finish")
    runner = make_runner("node")
    runner.submit(assignment("t-stop", ["sh", "-c", "sleep 300"]))
    pid = fleetd.wait_for(lambda: fleetd.started.get("t-stop"), message="start")["pid"]
    runner.shutdown("fleet-agent stopped", timeout=15)
    assert wait_gone([pid], 10)
    record = read_state(tmp_path / "node" / "tasks" / "t-stop.1" / "task.json")
    assert record["outcome"] == "failed" and record["reason"].startswith("fleet-agent stopped")
    fleetd.down.clear()
    again = make_runner("node")
    assert again.recover() == [("t-stop", 1, [])]
    finish = fleetd.wait_finished("t-stop")
    assert finish["outcome"] == "failed" and finish["reason"].startswith("fleet-agent stopped")
    assert finish["lost"] is True  # the agent ended it: fleetd retries it as for a lost node
    wait_until(
        lambda: not (tmp_path / "node" / "tasks" / "t-stop.1").exists(),
        message="the state to be removed",
    )


def _orphan(tmp_path, task_id, epoch, record_pid=True, journal=False):
    """A process started as a task before an agent restart, and its state file: one JSON object as
    earlier agents wrote it, or (`journal`) a record per line as now, the last one torn."""
    task_dir = tmp_path / "node" / "tasks" / f"{task_id}.{epoch}"
    (task_dir / "work").mkdir(parents=True)
    created = uptime_ticks() - 1
    env = dict(os.environ, FLEET_TASK_ID=task_id, FLEET_TASK_EPOCH=str(epoch))
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True, env=env)
    record = {
        "task_id": task_id,
        "epoch": epoch,
        "job_id": "j",
        "rank": 0,
        "state": "starting",
        "created_ticks": created,
        "boot_id": read_boot_id(),
    }
    lines = [json.dumps(record)]
    if record_pid:
        record.update(
            state="running",
            pid=proc.pid,
            pgid=proc.pid,
            start_ticks=read_stat(proc.pid).start_ticks,
        )
    lines.append(json.dumps(record))
    if journal:  # a host crash may tear the line being written: the one before it counts
        text = (
            "\n".join(lines)
            + "\n"
            + json.dumps(dict(record, state="finished", outcome="succeeded"))[:40]
        )
    else:
        text = lines[-1]
    (task_dir / "task.json").write_text(text)
    return proc


def test_recover_kills_processes_left_from_before_a_restart_and_reports_them(
    make_runner, fleetd, tmp_path
):
    orphan = _orphan(tmp_path, "t-orphan", 3, journal=True)
    unrecorded = _orphan(
        tmp_path, "t-early", 2, record_pid=False
    )  # died before the pid reached the file
    bystander = subprocess.Popen(
        ["sleep", "300"],
        start_new_session=True,
        env=dict(os.environ, FLEET_TASK_ID="t-orphan", FLEET_TASK_EPOCH="4"),
    )
    fenced = _orphan(tmp_path, "t-moved", 1)
    fleetd.fenced.add("t-moved")
    (tmp_path / "node" / "tasks" / "junk").mkdir()
    try:
        wait_until(
            lambda: all(
                len(
                    [
                        p
                        for p in os.listdir("/proc")
                        if p.isdigit() and (s := read_stat(int(p))) and s.pgrp == proc.pid
                    ]
                )
                >= 2
                for proc in (orphan, unrecorded, fenced)
            ),
            message="the orphans' children",
        )
        groups = {
            proc.pid: [
                int(p)
                for p in os.listdir("/proc")
                if p.isdigit() and (s := read_stat(int(p))) and s.pgrp == proc.pid
            ]
            for proc in (orphan, unrecorded, fenced)
        }
        runner = make_runner("node")
        recovered = sorted(runner.recover())
        assert [(t, e, sorted(pids)) for t, e, pids in recovered] == sorted(
            [
                ("t-early", 2, sorted(groups[unrecorded.pid])),
                ("t-moved", 1, sorted(groups[fenced.pid])),
                ("t-orphan", 3, sorted(groups[orphan.pid])),
            ]
        )
        assert all(wait_gone(pids, 10) for pids in groups.values())
        assert alive(bystander.pid)  # same task id, another epoch: not this agent's
        for task_id in ("t-orphan", "t-early"):
            finish = fleetd.wait_finished(task_id)
            assert (
                finish["outcome"] == "failed"
                and "restarted" in finish["reason"]
                and finish["lost"] is True
            )
        wait_until(
            lambda: not (tmp_path / "node" / "tasks" / "t-moved.1").exists(),
            message="the fenced one forgotten",
        )
        assert "t-moved" not in fleetd.finished
        assert not (tmp_path / "node" / "tasks" / "junk").exists()
    finally:
        for proc in (orphan, unrecorded, bystander, fenced):
            proc.kill()
            proc.wait(timeout=10)


def test_the_state_file_is_a_journal_whose_last_complete_record_counts(tmp_path):
    path = tmp_path / "task.json"
    append_state(path, {"state": "starting", "epoch": 1})
    append_state(path, {"state": "running", "epoch": 1, "pid": 42})
    assert read_state(path) == {"state": "running", "epoch": 1, "pid": 42}
    assert path.read_text().count("\n") == 2 and os.stat(path).st_mode & 0o777 == 0o600
    with open(path, "a") as fh:
        fh.write('{"state": "finished", "ep')  # torn by a crash
    assert read_state(path)["state"] == "running"
    path.write_text("[1, 2]\nnot json\n")
    with pytest.raises(ValueError):
        read_state(path)


def test_revocation_like_rejection_of_the_finish_forgets_the_task(make_runner, fleetd):
    runner = make_runner()
    runner.submit(assignment("t-gone", [PY, "-c", "print('x')"]))
    fleetd.fenced.add("t-gone")
    wait_until(lambda: runner.get("t-gone") is None, message="the task to be forgotten")
    assert "t-gone" not in fleetd.finished


def test_a_newer_epoch_of_the_same_task_supersedes_the_old_process(make_runner, fleetd):
    runner = make_runner(kill_grace_seconds=60.0)
    runner.submit(assignment("t-twice", ["sh", "-c", "sleep 300"], epoch=1))
    old = fleetd.wait_for(lambda: fleetd.started.get("t-twice"), message="start")["pid"]
    assert runner.submit(assignment("t-twice", ["sh", "-c", "sleep 300"], epoch=1)) is None
    runner.submit(assignment("t-twice", [PY, "-c", "print('second')"], epoch=2))
    assert wait_gone([old], 10)
    assert fleetd.wait_outcome("t-twice") == {"epoch": 2, "outcome": "succeeded", "exit_code": 0}


def test_an_invalid_assignment_is_reported_failed_and_never_run(make_runner, fleetd):
    runner = make_runner()
    assert runner.submit(assignment("t-bad-cmd", "echo hi", valid=False)) is None
    finish = fleetd.wait_finished("t-bad-cmd")
    assert finish["outcome"] == "failed" and "command must be a non-empty list" in finish["reason"]
    assert runner.submit({"task_id": "../../etc", "epoch": 1, "command": ["true"]}) is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"task_id": "a/b"}, "task_id"),
        ({"epoch": -1}, "epoch"),
        ({"epoch": True}, "epoch"),
        ({"rank": 2, "num_nodes": 2}, "rank"),
        ({"command": []}, "command"),
        ({"command": ["a\0b"]}, "command"),
        ({"env": {"1X": "y"}}, "env"),
        ({"gpus": [{"index": 0}]}, "gpus"),
        ({"max_runtime_seconds": 0}, "max_runtime"),
        ({"artifacts": [{"sha256": "ABC", "path": "x"}]}, "artifacts"),
    ],
)
def test_assignment_validation_names_the_bad_field(change, message):
    with pytest.raises(ValueError, match=message):
        Assignment.from_wire(dict(assignment("t-1", ["true"]), **change))


def test_inside_refuses_paths_that_leave_the_directory(tmp_path):
    root = str(tmp_path)
    assert inside(root, "a/b.txt", "path") == os.path.join(root, "a", "b.txt")
    assert inside(root, "./", "workdir", allow_root=True) == root
    for bad in ("", "/etc/passwd", "../x", "a/../../x", "a/..", ".", "a\0b"):
        with pytest.raises(TaskError):
            inside(root, bad, "path")
    os.symlink("/etc", tmp_path / "link")
    with pytest.raises(TaskError):
        inside(root, "link/passwd", "path")


def test_submit_returns_while_the_task_still_waits_for_its_rendezvous(make_runner, fleetd):
    runner = make_runner()
    fleetd.rendezvous_wait_cap = 0.2
    task = runner.submit(assignment("t-wait", ["true"], rank=1, num_nodes=2))
    assert task is not None and task.thread.is_alive() and "t-wait" not in fleetd.started
    fleetd.wait_for(
        lambda: any(p.endswith("t-wait/rendezvous") for p in fleetd.paths("GET")),
        message="the wait",
    )
    runner.workers.cancel(["t-wait"], "cancelled by fleetd")
    assert fleetd.wait_finished("t-wait")["outcome"] == "cancelled"
    assert "t-wait" not in fleetd.started


def test_a_process_that_ends_at_once_reports_its_start_once_before_or_with_its_finish(
    make_runner, fleetd
):
    runner = make_runner()
    for i in range(5):
        runner.submit(assignment(f"t-quick-{i}", ["true"]))
    for i in range(5):
        finish = fleetd.wait_finished(f"t-quick-{i}")
        assert finish["outcome"] == "succeeded"
        paths = fleetd.paths("POST")
        start, end = (
            f"/api/v1/agent/tasks/t-quick-{i}/start",
            f"/api/v1/agent/tasks/t-quick-{i}/finish",
        )
        if start in paths:  # reported while the process ran
            assert (
                paths.count(start) == 1
                and paths.index(start) < paths.index(end)
                and "pid" not in finish
            )
        else:  # it had ended already: the finish carries the start
            assert finish["pid"] == fleetd.started[f"t-quick-{i}"]["pid"] > 0


def test_a_start_not_reported_before_the_process_ended_rides_on_the_finish(make_runner, fleetd):
    fleetd.down = {"start"}
    runner = make_runner()
    runner.submit(assignment("t-late", [PY, "-c", "import threading; threading.Event().wait(0.3)"]))
    finish = fleetd.wait_finished("t-late")
    assert finish["outcome"] == "succeeded" and finish["pid"] > 0
    assert 0.3 <= finish["started_seconds_ago"] < 30  # it ran 0.3 s before the report
    assert fleetd.paths("POST").count("/api/v1/agent/tasks/t-late/start") >= 1  # tried while it ran


def test_a_start_report_says_how_long_ago_the_process_started(make_runner, fleetd):
    runner = make_runner()
    runner.submit(assignment("t-when", [PY, "-c", "import threading; threading.Event().wait(2)"]))
    started = fleetd.wait_for(lambda: fleetd.started.get("t-when"), message="start")
    # Held a quarter second (a task ending sooner reports its start with its finish), and says so.
    assert started["pid"] > 0 and 0.25 <= started["started_seconds_ago"] < 30
    assert fleetd.wait_outcome("t-when")["outcome"] == "succeeded"


def test_a_fleetd_that_does_not_take_when_in_a_start_gets_starts_without_it(make_runner, fleetd):
    fleetd.strict_start = True
    runner = make_runner()
    for name in ("t-old-1", "t-old-2"):
        runner.submit(assignment(name, [PY, "-c", "import threading; threading.Event().wait(1)"]))
        started = fleetd.wait_for(lambda n=name: fleetd.started.get(n), message=f"{name} start")
        assert started["pid"] > 0 and "started_seconds_ago" not in started
        assert fleetd.wait_outcome(name)["outcome"] == "succeeded"
    refused = [p for p in fleetd.paths("POST") if p.endswith("/start")]
    assert refused.count("/api/v1/agent/tasks/t-old-2/start") == 1  # learnt once, not per task


def test_a_fleetd_that_does_not_take_the_start_in_a_finish_gets_a_start_report_first(
    make_runner, fleetd
):
    fleetd.strict_finish = True
    fleetd.down = {"start"}
    runner = make_runner()
    runner.submit(assignment("t-old", [PY, "-c", "import threading; threading.Event().wait(0.3)"]))
    fleetd.wait_for(
        lambda: fleetd.paths("POST").count("/api/v1/agent/tasks/t-old/finish") >= 1,
        message="the refused finish",
    )
    fleetd.down = set()
    finish = fleetd.wait_finished("t-old")
    assert finish["outcome"] == "succeeded" and "pid" not in finish
    paths = fleetd.paths("POST")
    first_finish = paths.index("/api/v1/agent/tasks/t-old/finish")
    assert "/api/v1/agent/tasks/t-old/start" in paths[first_finish:]


def test_a_fleetd_that_does_not_know_lost_gets_the_finish_without_it(make_runner, fleetd):
    fleetd.strict_finish = True
    runner = make_runner()
    runner.submit(assignment("t-strict", ["sh", "-c", "sleep 300"]))
    fleetd.wait_for(lambda: fleetd.started.get("t-strict"), message="start")
    runner.shutdown("fleet-agent stopped", timeout=15)
    finish = fleetd.wait_finished("t-strict")
    assert finish["outcome"] == "failed" and "lost" not in finish


def test_a_command_found_in_path_is_looked_for_again_once_it_is_gone(tmp_path):
    tool = tmp_path / "bin" / "fleet-test-tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    path = f"{tmp_path / 'empty'}:{tool.parent}"
    for _ in range(2):  # found, then found again from what the first lookup learnt
        check_executable("fleet-test-tool", str(tmp_path), path)
    tool.chmod(0o644)
    with pytest.raises(TaskError, match="not found in PATH"):
        check_executable("fleet-test-tool", str(tmp_path), path)
    tool.chmod(0o755)
    check_executable("fleet-test-tool", str(tmp_path), path)
    tool.unlink()
    for _ in range(2):
        with pytest.raises(TaskError, match="not found in PATH"):
            check_executable("fleet-test-tool", str(tmp_path), path)
