"""GPU limits on the host: the watchdog, PID->task mapping, foreign processes, MPS, cgroups, health.

Real task processes under a real Runner against the stand-in fleetd; the fake NVML says which pid
uses how much memory on which GPU. The watchdog is polled by the test (`limits.poll_once()`), so
that each assertion is about one poll: what it saw and what it did.
"""

import json
import os
import signal
import subprocess
import sys
import uuid as uuidlib

import pytest

from agent.cgroups import Cgroups, shim_command
from agent.client import FleetClient
from agent.devices import DeviceManager
from agent.procfs import (
    ProcessMapper,
    TaskKey,
    cgroup_tree_pids,
    read_bytes,
    read_command,
    read_proc,
    wait_gone,
)
from agent.task.assignment import task_env
from agent.task.limits import MIB, Limits, LimitSettings
from agent.task.mps import mps_client_env, mps_daemon_command
from agent.task.output import OutputSettings
from agent.task.runner import Runner
from agent.workers import Worker, Workers
from fleetwire.assignment import Assignment
from tests.agent.conftest import shape_path, wait_until
from tests.support import wire
from tests.support.workloads import WAIT_FOR_GATE, hold

PY = sys.executable
GIB = 1024**3
TOLERANCE = 32 * MIB
SHAPE = json.loads(shape_path("l4_x4").read_text())
GPU = [g["uuid"] for g in SHAPE["gpus"]]
SLEEPER = [PY, "-c", "import threading\nthreading.Event().wait(600)\n"]
# The leader writes the pids of: a grandchild (through a child), a child that called setsid, and a
# setsid child with an empty environment (no FLEET_TASK_* markers: only its parent links it to the
# task).
NESTED = (
    "import json, os, subprocess, sys\n"
    "sleeper = " + repr(SLEEPER) + "\n"
    "middle = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys; p = "
    "subprocess.Popen(sys.argv[1:]); print(p.pid, flush=True); p.wait()', *sleeper], "
    "stdout=subprocess.PIPE)\n"
    "grandchild = int(middle.stdout.readline())\n"
    "setsid = subprocess.Popen(sleeper, start_new_session=True)\n"
    "bare = subprocess.Popen(sleeper, start_new_session=True, env={})\n"
    "pids = {'leader': os.getpid(), 'middle': middle.pid, 'grandchild': grandchild, 'setsid': "
    "setsid.pid, 'bare': bare.pid}\n"
    "with open(sys.argv[1] + '.tmp', 'w') as fh:\n"
    "    json.dump(pids, fh)\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n" + hold(600)
)
# A daemon that leaves everything: double fork, setsid, empty environment, parent gone (reparented).
ESCAPE = (
    "import os, sys\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.execve(sys.executable, [sys.executable, '-c', 'import os, sys\\n"
    'open(sys.argv[1], "w").write(str(os.getpid()))\\n\' + ' + repr(hold(600)) + ",\n"
    "                   sys.argv[1]], {})\n"
    "    os._exit(0)\n" + hold(600)
)


@pytest.fixture
def host(tmp_path, fleetd, fake_nvml):
    """A fake 4xL4 host (or another fake NVML `shape`): devices, workers, limits (no watchdog
    thread: tests poll) and a runner."""
    made = []

    def make(cgroup_parent="", shape="l4_x4", **settings):
        path = fake_nvml.use(shape)
        devices = DeviceManager(f"fake:{path}", watch_xids=True)
        devices.discover()
        workers = Workers()
        limits = Limits(
            LimitSettings(cgroup_parent=cgroup_parent, **settings),
            devices,
            workers,
            str(tmp_path / "state"),
        )
        runner = Runner(
            str(tmp_path / "state"),
            workers,
            lambda: FleetClient(fleetd.url, "fln_test", timeout=10),
            "127.0.0.1",
            kill_grace_seconds=1.0,
            backoff_max_seconds=0.2,
            output_settings=OutputSettings(interval_seconds=0.05, backoff_max_seconds=0.2),
            limits=limits,
        )
        made.append((runner, limits, devices))
        return runner, limits, devices

    yield make
    for runner, limits, devices in made:
        runner.shutdown("test over", timeout=15)
        limits.close()
        devices.close()


def assignment(task_id, command, gpus=(), **overrides):
    isolation = "shared" if any("memory_limit_bytes" in g for g in gpus) else "exclusive"
    return wire.assignment(
        task_id, command, **{"gpus": list(gpus), "isolation": isolation, **overrides}
    )


def running(runner, fleetd, task_id):
    """The Task once its process runs and fleetd heard of it."""
    fleetd.wait_for(lambda: task_id in fleetd.started, message=f"{task_id} started")
    return runner.get(task_id)


def alive(pid):
    return read_proc(pid) is not None


def test_read_bytes_reads_whole_files_and_answers_none_for_what_cannot_be_read(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * 1000)  # more than one read's worth
    assert read_bytes(big) == bytes(range(256)) * 1000
    assert read_bytes(f"/proc/{os.getpid()}/stat").startswith(f"{os.getpid()} (".encode())
    assert read_bytes(tmp_path / "missing") is None
    assert read_bytes(tmp_path) is None  # a directory: EISDIR on read


# ---------------------------------------------------------------------------- memory limit


def test_a_task_over_its_memory_limit_is_stopped_on_the_first_poll_after_crossing_with_the_reason(
    host, fleetd, fake_nvml
):
    runner, limits, _devices = host()
    limit = 2 * GIB
    task = running(
        runner,
        fleetd,
        runner.submit(
            assignment("t-over", SLEEPER, gpus=[{"uuid": GPU[1], "memory_limit_bytes": limit}])
        ).assignment.task_id,
    )
    pid = task.proc.pid
    fake_nvml.add_process(1, pid, limit - 100 * MIB)
    assert limits.poll_once() == []
    assert limits.poll_once() == []
    fake_nvml.add_process(1, pid, limit + 512 * MIB)  # the task crosses its limit here
    [detection] = limits.poll_once()
    assert detection["kind"] == "gpu_memory_limit_exceeded"
    assert (
        detection["poll"] == detection["last_within_poll"] + 1
    )  # acted on the first poll that saw it over
    assert (detection["gpu_uuid"], detection["used"], detection["limit"]) == (
        GPU[1],
        limit + 512 * MIB,
        limit,
    )
    finish = fleetd.wait_finished("t-over")
    assert finish["outcome"] == "failed" and finish["exit_code"] == 128 + signal.SIGTERM
    assert finish["reason"].startswith(
        f"gpu_memory_limit_exceeded: GPU {GPU[1]} limit {limit} bytes"
    )
    assert (
        f"used {limit + 512 * MIB} bytes" in finish["reason"]
        and "(killed by SIGTERM)" in finish["reason"]
    )
    assert not alive(pid)


def test_a_task_that_ignores_sigterm_is_sigkilled_after_the_limit_grace(
    host, fleetd, fake_nvml, tmp_path
):
    runner, limits, _devices = host(kill_grace_seconds=0.3)
    ready = tmp_path / "ready"
    stubborn = [
        PY,
        "-c",
        "import signal, sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(sys.argv[1], 'w').close()\n" + hold(600),
        str(ready),
    ]
    task = running(
        runner,
        fleetd,
        runner.submit(
            assignment("t-stubborn", stubborn, gpus=[{"uuid": GPU[0], "memory_limit_bytes": GIB}])
        ).assignment.task_id,
    )
    wait_until(ready.exists, message="the SIGTERM handler")
    fake_nvml.add_process(0, task.proc.pid, 3 * GIB)
    assert len(limits.poll_once()) == 1
    finish = fleetd.wait_finished("t-stubborn")
    assert finish["exit_code"] == 128 + signal.SIGKILL and finish["reason"].startswith(
        "gpu_memory_limit_exceeded:"
    )
    assert "(killed by SIGKILL)" in finish["reason"]


@pytest.mark.parametrize(
    "over_by, stopped", [(0, False), (TOLERANCE, False), (TOLERANCE + 1, True)]
)
def test_usage_up_to_limit_plus_tolerance_is_allowed_and_one_byte_more_is_not(
    host, fleetd, fake_nvml, over_by, stopped
):
    runner, limits, _devices = host()
    limit = GIB
    task = running(
        runner,
        fleetd,
        runner.submit(
            assignment("t-edge", SLEEPER, gpus=[{"uuid": GPU[2], "memory_limit_bytes": limit}])
        ).assignment.task_id,
    )
    fake_nvml.add_process(2, task.proc.pid, limit + over_by)
    acted = limits.poll_once()
    assert bool(acted) is stopped
    usage = runner.workers.get("t-edge").usage(None)[GPU[2]]
    assert usage["used_memory_bytes"] == limit + over_by and usage["over_memory_limit"] is stopped
    if stopped:
        assert fleetd.wait_finished("t-edge")["reason"].startswith("gpu_memory_limit_exceeded:")
    else:
        assert limits.poll_once() == [] and alive(task.proc.pid) and "t-edge" not in fleetd.finished


def test_a_task_within_its_limit_runs_to_success_untouched(host, fleetd, fake_nvml, gate):
    runner, limits, _devices = host()
    task = running(
        runner,
        fleetd,
        runner.submit(
            assignment(
                "t-fine",
                [PY, "-c", WAIT_FOR_GATE + "print('done')\n", gate.path],
                gpus=[{"uuid": GPU[0], "memory_limit_bytes": GIB, "compute_percent": 50}],
            )
        ).assignment.task_id,
    )
    fake_nvml.add_process(0, task.proc.pid, GIB - MIB, sm_util=40)
    for _ in range(5):
        assert limits.poll_once() == []
    row = next(r for r in runner.workers.limiter(None) if r["task_id"] == "t-fine")
    assert (row["used_memory_bytes"], row["memory_limit_bytes"], row["sm_util_percent"]) == (
        GIB - MIB,
        GIB,
        40,
    )
    assert row["compute_enforcement"].startswith("reported, not throttled")
    assert row["over_compute_share"] is False
    gate.open()
    assert fleetd.wait_outcome("t-fine") == {"epoch": 1, "outcome": "succeeded", "exit_code": 0}


def test_a_task_over_its_compute_share_while_another_process_is_active_is_flagged_not_throttled(
    host, fleetd, fake_nvml
):
    runner, limits, _devices = host()
    task = running(
        runner,
        fleetd,
        runner.submit(
            assignment(
                "t-greedy",
                SLEEPER,
                gpus=[{"uuid": GPU[0], "memory_limit_bytes": GIB, "compute_percent": 25}],
            )
        ).assignment.task_id,
    )
    neighbour = subprocess.Popen(SLEEPER)
    try:
        fake_nvml.add_process(0, task.proc.pid, MIB, sm_util=70)
        fake_nvml.add_process(0, neighbour.pid, MIB, sm_util=20)
        assert limits.poll_once() == []
        usage = runner.workers.get("t-greedy").usage(None)[GPU[0]]
        assert usage["sm_util_percent"] == 70 and usage["over_compute_share"] is True
        assert alive(task.proc.pid)  # reported, not throttled
    finally:
        neighbour.kill()
        neighbour.wait(10)


# ---------------------------------------------------------------------------- PID -> task


def test_nested_children_and_setsid_processes_map_to_their_task_and_are_summed_and_stopped_together(
    host, fleetd, fake_nvml, tmp_path
):
    runner, limits, _devices = host()
    pid_file = tmp_path / "pids.json"
    task = running(
        runner,
        fleetd,
        runner.submit(
            assignment(
                "t-tree",
                [PY, "-c", NESTED, str(pid_file)],
                gpus=[{"uuid": GPU[3], "memory_limit_bytes": 4 * GIB}],
            )
        ).assignment.task_id,
    )
    pids = wait_until(
        lambda: pid_file.exists() and json.loads(pid_file.read_text()), message="the pid file"
    )
    key = task.key()
    mapper = ProcessMapper([key])
    assert {name: mapper.owner(pid) is key for name, pid in pids.items()} == {
        name: True for name in pids
    }
    leader = read_proc(pids["leader"])
    assert read_proc(pids["setsid"]).session != leader.session  # really left the task's session
    assert read_proc(pids["bare"]).session != leader.session
    assert set(task.pids()) >= set(pids.values())
    stranger = subprocess.Popen(SLEEPER)
    try:
        assert ProcessMapper([key]).owner(stranger.pid) is None
    finally:
        stranger.kill()
        stranger.wait(10)
    for name in ("grandchild", "setsid", "bare"):
        fake_nvml.add_process(3, pids[name], 1536 * MIB)  # 4.5 GiB together, 1.5 GiB each
    [detection] = limits.poll_once()
    assert detection["used"] == 3 * 1536 * MIB
    assert fleetd.wait_finished("t-tree")["reason"].startswith(
        f"gpu_memory_limit_exceeded: GPU {GPU[3]}"
    )
    assert wait_gone(list(pids.values()), 10), "a process of the task outlived it"


def test_a_child_on_a_gpu_not_assigned_to_its_task_fails_it_with_gpu_not_assigned(
    host, fleetd, fake_nvml, tmp_path
):
    runner, limits, _devices = host()
    pid_file = tmp_path / "pids.json"
    task = running(
        runner,
        fleetd,
        runner.submit(
            assignment("t-stray", [PY, "-c", NESTED, str(pid_file)], gpus=[{"uuid": GPU[0]}])
        ).assignment.task_id,
    )
    pids = wait_until(
        lambda: pid_file.exists() and json.loads(pid_file.read_text()), message="the pid file"
    )
    fake_nvml.add_process(0, task.proc.pid, 10 * GIB)  # its own GPU, whole: no limit
    assert limits.poll_once() == []
    fake_nvml.add_process(2, pids["bare"], 300 * MIB)  # a child that ignored CUDA_VISIBLE_DEVICES
    [detection] = limits.poll_once()
    assert detection["kind"] == "gpu_not_assigned" and detection["gpu_uuid"] == GPU[2]
    reason = fleetd.wait_finished("t-stray")["reason"]
    assert reason.startswith(
        f"gpu_not_assigned: GPU {GPU[2]} is not assigned to the task (assigned: {GPU[0]})"
    )
    assert str(pids["bare"]) in reason
    survivors = [(name, pid) for name, pid in pids.items() if not wait_gone([pid], 10)]
    assert survivors == []


@pytest.fixture
def cgroup_parent():
    """A cgroup v2 parent of its own for one test (skips where none can be made), removed
    afterwards."""
    name = f"fleet-agent-test-{uuidlib.uuid4().hex[:8]}"
    probe = Cgroups(name)
    if probe.path is None:
        pytest.skip(f"no writable cgroup v2 here: {probe.why}")
    yield name
    for entry in os.scandir(probe.path):
        if entry.is_dir():
            probe.remove(entry.path)
    probe.remove(probe.path)


def test_a_task_cgroup_that_already_holds_processes_is_never_shared(cgroup_parent):
    # Two agents on one host with the same limits.cgroup_parent, given the same task id: sharing the
    # cgroup would let either task's end kill the other's processes.
    first, second = Cgroups(cgroup_parent), Cgroups(cgroup_parent)
    mine, _host = first.create("task-same.1", memory_bytes=64 << 20)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        Cgroups.move(sleeper.pid, mine)
        path, host = second.create("task-same.1", memory_bytes=64 << 20)
        assert path is None
        assert "already holds processes" in host["memory_bytes"]["how"]
        assert cgroup_parent in host["memory_bytes"]["how"]
        assert first.create("keeper", shared=True)[0] == second.create("keeper", shared=True)[0]
    finally:
        sleeper.kill()
        sleeper.wait()
    # Empty again (a cgroup made before a crash and never used): this agent's to take.
    assert second.create("task-same.1")[0] == mine
    assert first.remove(mine)


def test_cgroup_tree_pids_lists_a_subtree_and_nothing_once_it_is_empty(cgroup_parent):
    cgroups = Cgroups(cgroup_parent)
    top, _host = cgroups.create("task-tree")
    below = os.path.join(top, "below")
    os.mkdir(below)
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        for proc, where in zip(sleepers, (top, below)):
            with open(os.path.join(where, "cgroup.procs"), "w") as fh:
                fh.write(str(proc.pid))
        assert sorted(cgroup_tree_pids(top)) == sorted(p.pid for p in sleepers)
        assert cgroup_tree_pids(below) == [sleepers[1].pid]
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()
    # Reaped: the subtree is unpopulated, and says so without a walk.
    assert cgroup_tree_pids(top) == []
    assert cgroups.remove(below) and cgroups.remove(top)
    assert cgroup_tree_pids(top) == []  # gone


def test_a_daemon_that_escaped_session_environment_and_parent_is_still_found_by_the_task_cgroup(
    cgroup_parent, host, fleetd, fake_nvml, tmp_path
):
    runner, limits, _devices = host(cgroup_parent=cgroup_parent)
    pid_file = tmp_path / "daemon.pid"
    task = running(
        runner,
        fleetd,
        runner.submit(
            assignment(
                "t-escape",
                [PY, "-c", ESCAPE, str(pid_file)],
                gpus=[{"uuid": GPU[1], "memory_limit_bytes": GIB}],
                cpus=1.5,
                memory_bytes=2 * GIB,
                pids=256,
            )
        ).assignment.task_id,
    )
    daemon = int(
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), message="the daemon's pid")
    )
    info = read_proc(daemon)
    assert info.ppid != task.proc.pid and info.session != task.proc.pid  # reparented, own session
    assert ProcessMapper([TaskKey("t-escape", 1)]).owner(daemon) is None  # no markers, no parent
    key = task.key()
    assert key.cgroup == f"/{cgroup_parent}/task-t-escape.1"
    assert ProcessMapper([key]).owner(daemon) == key  # but in the task's cgroup
    host_limits = runner.workers.get("t-escape").limits["host"]
    for name, value in (("cpus", 1.5), ("memory_bytes", 2 * GIB), ("pids", 256)):
        record = host_limits[name]
        assert record["limit"] == value
        controller = {"cpus": "cpu", "memory_bytes": "memory", "pids": "pids"}[name]
        if controller in limits.cgroups.controllers:
            assert record["enforced"] is True and record["how"].startswith("cgroup v2")
        else:
            assert record["enforced"] is False and record["how"].startswith("not enforced: ")
    fake_nvml.add_process(1, daemon, 2 * GIB)
    [detection] = limits.poll_once()
    assert detection["task_id"] == "t-escape"
    assert fleetd.wait_finished("t-escape")["reason"].startswith("gpu_memory_limit_exceeded:")
    assert wait_gone([daemon], 10)
    wait_until(
        lambda: not os.path.exists(os.path.join(limits.cgroups.path, "task-t-escape.1")),
        message="the task cgroup to be removed",
    )


@pytest.mark.parametrize("with_cgroup", [True, False])
def test_a_task_directory_is_reused_only_when_the_task_cgroup_vouched_that_nothing_is_left(
    request, host, fleetd, tmp_path, with_cgroup
):
    runner, _limits, _devices = host(
        cgroup_parent=request.getfixturevalue("cgroup_parent") if with_cgroup else ""
    )
    runner.submit(assignment("t-quick", ["true"]))
    assert fleetd.wait_finished("t-quick")["outcome"] == "succeeded"
    task_dir = tmp_path / "state" / "tasks" / "t-quick.1"
    wait_until(lambda: not task_dir.exists(), message="the task directory to be put away")
    # Without a cgroup, a process the task left behind could still write into the next task's
    # directory, so the directory is removed, not kept.
    assert runner.dirs.spares() == (1 if with_cgroup else 0)


def test_host_limits_say_not_enforced_with_the_reason_when_no_cgroup_can_be_used(host, fleetd):
    runner, _limits, _devices = host(cgroup_parent="")
    task = running(
        runner,
        fleetd,
        runner.submit(assignment("t-host", SLEEPER, cpus=2, memory_bytes=GIB)).assignment.task_id,
    )
    record = runner.workers.get("t-host").limits["host"]
    assert record["cpus"] == {"limit": 2, "enforced": False, "how": record["cpus"]["how"]}
    assert record["cpus"]["how"].startswith("not enforced: cgroups disabled")
    assert record["memory_bytes"]["enforced"] is False
    task.cancel("test over")
    assert fleetd.wait_finished("t-host")["outcome"] == "cancelled"


# ---------------------------------------------------------------------------- foreign processes


@pytest.mark.parametrize("policy", ["report", "kill"])
def test_a_gpu_process_of_no_task_is_reported_and_killed_only_when_configured(
    host, fake_nvml, policy
):
    _runner, limits, _devices = host(foreign_processes=policy, kill_grace_seconds=0.2)
    stranger = subprocess.Popen(SLEEPER)
    try:
        # Until exec has finished the command line is not the sleeper's yet.
        wait_until(
            lambda: "wait(600)" in read_command(stranger.pid), message="the sleeper's command line"
        )
        fake_nvml.add_process(1, stranger.pid, 700 * MIB)
        limits.poll_once()
        [entry] = limits.report()["foreign_processes"]
        assert (entry["pid"], entry["gpu_uuid"], entry["used_memory_bytes"]) == (
            stranger.pid,
            GPU[1],
            700 * MIB,
        )
        assert "threading.Event().wait(600)" in entry["command"]
        if policy == "kill":
            assert entry["action"] == "killed: SIGTERM sent"
            assert stranger.wait(10) == -signal.SIGTERM
        else:
            assert entry["action"] == "reported"
            limits.poll_once()
            assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait(10)


# ---------------------------------------------------------------------------- MPS


FAKE_MPS_CONTROL = """#!/bin/sh
# Stands in for nvidia-cuda-mps-control: records how it was run; -f stays in the foreground.
log="$FAKE_MPS_LOG"
[ -n "$log" ] || log="$(dirname "$0")/calls.log"
run="argv=$* pipe=$CUDA_MPS_PIPE_DIRECTORY logs=$CUDA_MPS_LOG_DIRECTORY"
echo "$run visible=$CUDA_VISIBLE_DEVICES" >> "$log"
if [ "$1" = "-f" ]; then
    rm -f "$CUDA_MPS_PIPE_DIRECTORY/quit"
    i=0
    while [ $i -lt 6000 ] && [ ! -e "$CUDA_MPS_PIPE_DIRECTORY/quit" ]; do
        sleep 0.1; i=$((i+1))
    done
else
    read cmd
    echo "stdin=$cmd pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$log"
    [ "$cmd" = "quit" ] && touch "$CUDA_MPS_PIPE_DIRECTORY/quit"
fi
"""


def test_mps_daemon_command_and_client_env_are_composed_per_gpu(tmp_path):
    argv, env = mps_daemon_command(
        "/usr/bin/nvidia-cuda-mps-control",
        "/var/lib/fleet-agent/mps",
        GPU[0],
        environ={"PATH": "/usr/bin", "SECRET": "x"},
    )
    assert argv == ["/usr/bin/nvidia-cuda-mps-control", "-f"]
    assert env == {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": GPU[0],
        "CUDA_MPS_PIPE_DIRECTORY": f"/var/lib/fleet-agent/mps/{GPU[0]}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"/var/lib/fleet-agent/mps/{GPU[0]}/log",
    }
    client = mps_client_env(
        "/var/lib/fleet-agent/mps",
        GPU[0],
        {"uuid": GPU[0], "memory_limit_bytes": 2 * GIB, "compute_percent": 37.5},
    )
    assert client == {
        "CUDA_MPS_PIPE_DIRECTORY": f"/var/lib/fleet-agent/mps/{GPU[0]}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"/var/lib/fleet-agent/mps/{GPU[0]}/log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "38",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M",
    }
    assert shim_command("/sys/fs/cgroup/fleet-agent/task-a.1", ["python", "x.py"])[-2:] == [
        "python",
        "x.py",
    ]


def test_an_mps_task_runs_as_a_client_of_a_supervised_per_gpu_daemon_that_quits_with_the_agent(
    host, fleetd, tmp_path
):
    control = tmp_path / "bin" / "nvidia-cuda-mps-control"
    control.parent.mkdir()
    control.write_text(FAKE_MPS_CONTROL)
    control.chmod(0o755)
    calls = tmp_path / "bin" / "calls.log"
    runner, limits, _devices = host(
        mps_enabled=True, mps_control_command=str(control), mps_dir=str(tmp_path / "mps")
    )
    code = (
        "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if 'CUDA' in k or "
        "'NVIDIA' in k}))"
    )
    grant = {"uuid": GPU[2], "memory_limit_bytes": 3 * GIB, "compute_percent": 25}
    runner.submit(assignment("t-mps", [PY, "-c", code], gpus=[grant], isolation="mps"))
    assert fleetd.wait_finished("t-mps")["outcome"] == "succeeded"
    env = json.loads(fleetd.texts("t-mps", "stdout")[0])
    pipe = str(tmp_path / "mps" / GPU[2] / "pipe")
    assert env == {
        "CUDA_VISIBLE_DEVICES": GPU[2],
        "NVIDIA_VISIBLE_DEVICES": GPU[2],
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps" / GPU[2] / "log"),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3072M",
    }
    status = limits.mps.status()[GPU[2]]
    assert status["running"] and status["argv"] == [str(control), "-f"]
    wait_until(
        lambda: calls.exists() and "argv=-f" in calls.read_text(), message="the daemon to run"
    )
    assert (
        f"argv=-f pipe={pipe} logs={tmp_path / 'mps' / GPU[2] / 'log'} visible={GPU[2]}"
        in calls.read_text()
    )
    # A daemon that dies is restarted by the supervisor (after its backoff).
    os.killpg(status["pid"], signal.SIGKILL)
    wait_until(
        lambda: limits.mps.supervise() or limits.mps.status()[GPU[2]]["starts"] == 2,
        timeout=10,
        message="the daemon to be restarted",
    )
    pid = limits.mps.status()[GPU[2]]["pid"]
    limits.close()
    assert f"stdin=quit pipe={pipe}" in calls.read_text()
    assert wait_gone([pid], 10)


def test_an_mps_task_with_two_gpus_is_refused_with_the_reason(host, fleetd, tmp_path):
    runner, _limits, _devices = host(
        mps_enabled=True, mps_control_command="/bin/true", mps_dir=str(tmp_path / "m")
    )
    runner.submit(
        assignment("t-mps2", SLEEPER, gpus=[{"uuid": GPU[0]}, {"uuid": GPU[1]}], isolation="mps")
    )
    finish = fleetd.wait_finished("t-mps2")
    assert finish["outcome"] == "failed" and finish["reason"].startswith(
        "mps isolation needs exactly one GPU"
    )
    assert "t-mps2" not in fleetd.started


def test_every_mode_sees_only_its_gpus_through_cuda_and_nvidia_visible_devices():
    for gpus, isolation in (
        ([{"uuid": GPU[0]}, {"uuid": GPU[3]}], "exclusive"),
        ([{"uuid": GPU[1], "memory_limit_bytes": GIB}], "shared"),
        ([], "exclusive"),
    ):
        a = Assignment.from_wire(
            assignment(
                "t-env",
                ["true"],
                gpus=gpus,
                isolation=isolation,
                env={"CUDA_VISIBLE_DEVICES": "all", "NVIDIA_VISIBLE_DEVICES": "all"},
            )
        )
        env, injected = task_env(a, "127.0.0.1", 1234, environ={})
        expected = ",".join(g["uuid"] for g in gpus)
        assert env["CUDA_VISIBLE_DEVICES"] == injected["CUDA_VISIBLE_DEVICES"] == expected
        assert env["NVIDIA_VISIBLE_DEVICES"] == (expected or "none")


# ---------------------------------------------------------------------------- health and trap


def test_a_critical_xid_on_its_gpu_fails_the_task_with_gpu_unhealthy(host, fleetd, fake_nvml):
    runner, limits, devices = host()
    task = running(
        runner,
        fleetd,
        runner.submit(assignment("t-xid", SLEEPER, gpus=[{"uuid": GPU[1]}])).assignment.task_id,
    )
    other = running(
        runner,
        fleetd,
        runner.submit(assignment("t-ok", SLEEPER, gpus=[{"uuid": GPU[2]}])).assignment.task_id,
    )
    fake_nvml.add_process(1, task.proc.pid, GIB)
    assert limits.poll_once() == []
    fake_nvml.inject_xid(1, 79)  # fallen off the bus
    detection = wait_until(lambda: limits.poll_once(), timeout=10, message="the XID to be seen")[0]
    assert detection["kind"] == "gpu_unhealthy" and detection["task_id"] == "t-xid"
    reason = fleetd.wait_finished("t-xid")["reason"]
    assert reason.startswith(f"gpu_unhealthy: GPU {GPU[1]} is unhealthy: critical XID 79")
    assert devices.poll().find(GPU[1]).gpu.healthy is False
    assert alive(other.proc.pid) and "t-ok" not in fleetd.finished
    fake_nvml.inject_xid(2, 13)  # an application XID: the GPU stays healthy
    assert limits.poll_once() == [] and alive(other.proc.pid)


def test_an_uncorrectable_ecc_error_fails_the_task_and_a_hot_gpu_does_not(host, fleetd, fake_nvml):
    runner, limits, devices = host()
    task = running(
        runner,
        fleetd,
        runner.submit(assignment("t-ecc", SLEEPER, gpus=[{"uuid": GPU[3]}])).assignment.task_id,
    )
    fake_nvml.update_gpu(3, temperature_c=99)
    devices.poll()
    assert limits.poll_once() == [] and alive(task.proc.pid)
    fake_nvml.update_gpu(3, ecc_uncorrected_volatile=2, temperature_c=50)
    devices.poll()
    [detection] = limits.poll_once()
    assert (
        detection["reason"]
        == f"gpu_unhealthy: GPU {GPU[3]} is unhealthy: 2 uncorrectable ECC error(s) since "
        "driver load"
    )


def test_trap_lists_spot_before_on_demand_then_lowest_bid_then_largest():
    workers = Workers()
    rows = [
        ("od", "on-demand", None, 5),
        ("spot-rich", "spot", 3.0, 9),
        ("spot-cheap-small", "spot", 1.0, 1),
        ("spot-cheap-big", "spot", 1.0, 4),
    ]
    for task_id, klass, bid, used in rows:
        worker = Worker(
            task_id=task_id,
            epoch=1,
            priority_class=klass,
            bid=bid,
            gpus=[{"uuid": GPU[0], "memory_limit_bytes": 10 * GIB}],
        )
        worker.gpu_usage = {GPU[0]: {"used_memory_bytes": used * GIB, "processes": []}}
        workers.add(worker)
    order = [c["task_id"] for c in workers.trap(None, GPU[0])]
    assert order == ["spot-cheap-big", "spot-cheap-small", "spot-rich", "od"]
    assert [c["task_id"] for c in workers.trap(None, GPU[0], pressure_bytes=5 * GIB)] == [
        "spot-cheap-big",
        "spot-cheap-small",
    ]
    assert workers.trap(None, GPU[1]) == []


def test_worker_view_shows_gpus_limits_usage_per_process_and_the_injected_env(
    host, fleetd, fake_nvml
):
    runner, limits, _devices = host()
    task = running(
        runner,
        fleetd,
        runner.submit(
            assignment(
                "t-view",
                SLEEPER,
                gpus=[{"uuid": GPU[0], "memory_limit_bytes": 2 * GIB, "compute_percent": 50}],
                priority_class="spot",
                bid=1.25,
            )
        ).assignment.task_id,
    )
    fake_nvml.add_process(0, task.proc.pid, GIB, sm_util=30)
    limits.poll_once()
    view = runner.workers.get("t-view").to_dict()
    assert view["gpus"] == [{"uuid": GPU[0], "memory_limit_bytes": 2 * GIB, "compute_percent": 50}]
    assert view["env"]["CUDA_VISIBLE_DEVICES"] == view["env"]["NVIDIA_VISIBLE_DEVICES"] == GPU[0]
    assert view["env"]["FLEET_TASK_ID"] == "t-view"
    assert (
        view["limits"]["isolation"] == "shared"
        and view["limits"]["memory_tolerance_bytes"] == TOLERANCE
    )
    assert view["limits"]["gpus"][0]["memory_enforcement"].startswith("watchdog")
    assert view["usage"][GPU[0]]["processes"] == [
        {"pid": task.proc.pid, "used_memory_bytes": GIB, "sm_util_percent": 30}
    ]
    assert (view["priority_class"], view["bid"]) == ("spot", 1.25)


# ---------------------------------------------------------------------------- configuration


def test_limits_settings_come_from_the_limits_table_and_fleet_agent_limits_environment(tmp_path):
    from agent.config import ConfigError, load_config

    path = tmp_path / "agent.toml"
    path.write_text(
        '[limits]\npoll_seconds = 0.5\nforeign_processes = "kill"\nmps_enabled = true\n'
        'memory_tolerance_bytes = 0\ncgroup_parent = ""\n'
    )
    config = load_config(
        str(path),
        environ={
            "FLEET_AGENT_LIMITS_KILL_GRACE_SECONDS": "2",
            "FLEET_AGENT_LIMITS_MPS_ENABLED": "false",
        },
    )
    settings = LimitSettings.from_config(config)
    assert (settings.poll_seconds, settings.foreign_processes, settings.memory_tolerance_bytes) == (
        0.5,
        "kill",
        0,
    )
    assert (settings.kill_grace_seconds, settings.mps_enabled, settings.cgroup_parent) == (
        2.0,
        False,
        "",
    )
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    assert LimitSettings.from_config(load_config(str(empty), environ={})) == LimitSettings()
    for text, message in (
        ("poll_seconds = 1", "at most 0.5"),
        ('foreign_processes = "shoot"', "'report' or 'kill'"),
        ('mps_enabled = "maybe"', "true or false"),
    ):
        path.write_text(f"[limits]\n{text}\n")
        with pytest.raises(ConfigError, match=message):
            load_config(str(path), environ={})


def test_a_lost_gpu_fails_its_task_and_unreadable_processes_do_not(host, fleetd, fake_nvml):
    runner, limits, _devices = host()
    lost = running(
        runner,
        fleetd,
        runner.submit(assignment("t-lost", SLEEPER, gpus=[{"uuid": GPU[0]}])).assignment.task_id,
    )
    odd = running(
        runner,
        fleetd,
        runner.submit(
            assignment("t-odd", SLEEPER, gpus=[{"uuid": GPU[1], "memory_limit_bytes": GIB}])
        ).assignment.task_id,
    )
    fake_nvml.update_gpu(1, errors={"nvmlDeviceGetComputeRunningProcesses": "NoPermission"})
    assert limits.poll_once() == []
    assert (
        runner.workers.get("t-odd")
        .usage(None)[GPU[1]]["error"]
        .startswith("cannot read its processes")
    )
    fake_nvml.update_gpu(0, lost=True)
    [detection] = limits.poll_once()
    assert detection["task_id"] == "t-lost"
    assert fleetd.wait_finished("t-lost")["reason"].startswith(
        f"gpu_unhealthy: GPU {GPU[0]} is unhealthy: GPU 0 unavailable: GPU is lost"
    )
    assert alive(odd.proc.pid) and not alive(lost.proc.pid)


def test_a_memory_limit_of_0_is_an_error_never_no_limit(host, fleetd):
    runner, _limits, _devices = host()
    runner.submit(
        assignment(
            "t-zero",
            [sys.executable, "-c", "pass"],
            gpus=[{"uuid": GPU[1], "memory_limit_bytes": 0}],
        )
    )
    finish = fleetd.wait_outcome("t-zero")
    assert finish["outcome"] == "failed"
    assert "memory_limit_bytes 0 is not a positive number" in finish["reason"], finish
