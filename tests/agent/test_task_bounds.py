"""What bounds a task on its node, against the stand-in fleetd with real processes (issue 44): the
pid limit where no cgroup holds it (RLIMIT_NPROC), the container runtime's flags, the output offsets
file's mode, and a state dir that tasks of other uids cannot reach. Fleetd's side, and the fork bomb
end to end: tests/fleetd/services/fleet_ops/test_task_bounds.py,
tests/agent/test_task_bounds_e2e.py."""

import json
import logging
import os
import shutil
import stat
import tempfile

import pytest

from agent.client import FleetClient
from agent.task.container import ContainerRuntime
from agent.task.output import OutputSettings
from agent.task.runner import Runner
from agent.workers import Workers
from tests.support import wait_until, wire
from tests.support.workloads import WAIT_FOR_GATE

PY = "/usr/bin/python3"  # every uid can execute it (the venv is root's)
OWNER = {"source": "dynamic", "user": None, "uid": 61331, "gid": 61331}
ROOT = {"source": "root", "user": "root", "uid": 0, "gid": 0}
GIB = 1024**3

as_other_uids = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="switching users needs root and setpriv (CI runs as root)",
)


def make_runner(state_dir, fleetd):
    return Runner(
        state_dir,
        Workers(),
        lambda: FleetClient(fleetd.url, "fln_test", timeout=10),
        "127.0.0.1",
        kill_grace_seconds=1.0,
        backoff_max_seconds=0.2,
        output_settings=OutputSettings(interval_seconds=0.05, backoff_max_seconds=0.2),
    )


@pytest.fixture
def top():
    """A directory of the test's own, 0700 as mkdtemp makes it: other uids cannot pass it."""
    made = tempfile.mkdtemp(prefix="fleet-bounds-")
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def runner(top, fleetd):
    """A runner whose state dir other uids may reach (as /var/lib)."""
    os.chmod(top, 0o711)
    made = make_runner(os.path.join(top, "state"), fleetd)
    yield made
    made.shutdown("test over", timeout=15)


PRINT_NPROC = "import resource\nprint(resource.getrlimit(resource.RLIMIT_NPROC)[0], flush=True)\n"


@as_other_uids
def test_without_a_pids_cgroup_a_tasks_pid_limit_is_its_uids_rlimit_nproc_and_root_is_said_unbound(
    runner, fleetd
):
    runner.submit(wire.assignment("t-own", [PY, "-c", PRINT_NPROC], run_as=OWNER, pids=40))
    finish = fleetd.wait_outcome("t-own")
    assert finish["outcome"] == "succeeded", finish
    record = fleetd.texts("t-own", "stdout")
    host = runner.limits.cgroups
    if "pids" in host.controllers:
        pytest.skip(
            "this host's cgroup v2 has the pids controller: pids.max holds the task (test_limits)"
        )
    assert record == ["40"]  # set before the switch to its uid: the task cannot raise it back
    runner.submit(
        wire.assignment(
            "t-root",
            [PY, "-c", PRINT_NPROC + "import time\ntime.sleep(30)\n"],
            run_as=ROOT,
            pids=40,
        )
    )
    worker = wait_until(lambda: runner.workers.get("t-root"), message="the root task's worker")
    pids = wait_until(
        lambda: worker.limits.get("host", {}).get("pids"), message="its pid limit record"
    )
    assert (
        pids["limit"] == 40
        and pids["enforced"] is False
        and "RLIMIT_NPROC does not bind root" in pids["how"]
    )
    runner.get("t-root").cancel("test over")
    assert fleetd.wait_outcome("t-root")["outcome"] == "cancelled"


def test_a_container_gets_its_tasks_pid_limit_and_memory_bound_from_its_runtime():
    runtime = ContainerRuntime(["/usr/bin/podman"], "podman")
    argv = runtime.run_argv(
        "fleet-x-1",
        "localhost/app:1",
        ["serve"],
        "/v/x",
        "/workspace",
        {},
        "/t/env",
        (1000, 1000),
        [],
        cdi=False,
        memory_bytes=2 * GIB,
        pids=300,
    )
    image = argv.index("localhost/app:1")
    flags = argv[:image]
    assert "--pids-limit=300" in flags
    assert (
        f"--memory={2 * GIB}" in flags and f"--memory-swap={2 * GIB}" in flags
    )  # no swap beyond it
    nproc = flags[flags.index("--ulimit", flags.index("--ulimit") + 1) + 1]
    soft, hard = (int(v) for v in nproc.removeprefix("nproc=").split(":"))
    assert soft == hard <= 300  # the container's RLIMIT_NPROC is never the host's hard limit


def test_the_output_state_and_chunks_are_the_agents_alone(runner, fleetd, gate):
    runner.submit(
        wire.assignment(
            "t-out", [PY, "-c", "print('one', flush=True)\n" + WAIT_FOR_GATE, gate.path]
        )
    )
    task_dir = os.path.join(runner.tasks_dir, "t-out.1")
    state = os.path.join(task_dir, "output-state.json")
    wait_until(lambda: os.path.exists(state), timeout=30, message="the output state file")
    for path, mode in ((state, 0o600), (os.path.join(task_dir, "output"), 0o700)):
        info = os.stat(path)
        assert stat.S_IMODE(info.st_mode) == mode and info.st_uid == 0, path
    assert json.load(open(state))["offsets"]["stdout"] == len("one\n")
    gate.open()
    assert fleetd.wait_outcome("t-out")["outcome"] == "succeeded"


@as_other_uids
def test_a_state_dir_other_uids_cannot_reach_is_named_at_start_and_their_tasks_refused_with_reason(
    top, fleetd, caplog
):
    state = os.path.join(top, "state")
    with caplog.at_level(logging.WARNING, logger="agent.runner"):
        runner = make_runner(state, fleetd)
    try:
        [warning] = [
            r.getMessage()
            for r in caplog.records
            if "not passable by other users" in r.getMessage()
        ]
        assert f"{top} (mode 0700)" in warning and f"chmod o+x {top}" in warning
        runner.submit(wire.assignment("t-uid", [PY, "-c", "print('ran')"], run_as=OWNER))
        finish = fleetd.wait_outcome("t-uid")
        assert (
            finish["outcome"] == "failed" and f"cannot pass {top} (mode 0700)" in finish["reason"]
        ), finish
        runner.submit(wire.assignment("t-root", [PY, "-c", "print('ran')"], run_as=ROOT))
        assert fleetd.wait_outcome("t-root")["outcome"] == "succeeded"  # root passes anything
        os.chmod(top, 0o711)  # the operator's fix holds at once, without a restart
        runner.submit(wire.assignment("t-uid-again", [PY, "-c", "print('ran')"], run_as=OWNER))
        assert fleetd.wait_outcome("t-uid-again")["outcome"] == "succeeded"
        assert fleetd.texts("t-uid-again", "stdout") == ["ran"]
    finally:
        runner.shutdown("test over", timeout=15)


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash"])
def test_the_task_shells_ulimit_sets_the_rlimit_nproc_its_command_starts_with(shell, tmp_path):
    import subprocess

    from agent.cgroups import shell_nproc_flag, shim_command

    if not os.path.exists(shell):
        pytest.skip(f"no {shell} here")
    flag = shell_nproc_flag(shell)
    assert flag == {"bash": "-u", "dash": "-p"}[os.path.basename(os.path.realpath(shell))]
    argv = shim_command("", [PY, "-c", PRINT_NPROC], str(tmp_path / "status"), nproc=(flag, 77))
    argv[0] = shell
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.split() == ["77"], done
    assert (
        tmp_path / "status"
    ).read_text().strip() == "0"  # the shell still records the exit status
