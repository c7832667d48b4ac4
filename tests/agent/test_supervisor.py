"""agent/task/supervisor.py on its own, as another kind of workload than a task would use it."""

import signal
import sys
import time

import pytest

from agent.procfs import TaskKey, read_proc, wait_gone
from agent.task.errors import TaskError
from agent.task.supervisor import Supervisor, check_executable, describe_exit
from agent.threads import Pool
from tests.support import wait_until

PY = sys.executable
# Prints a line, then ignores SIGTERM: only the SIGKILL after the grace ends it.
STUBBORN = (
    "import signal, threading\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "threading.Event().wait(300)\n"
)


class Lines:
    """An on_output that keeps whole lines."""

    def __init__(self):
        self.lines = []

    def __call__(self, buf, stream, eof):
        *whole, rest = buf.split(b"\n")
        self.lines += [(stream, line.decode()) for line in whole]
        if eof and rest:
            self.lines.append((stream, rest.decode()))
            return b""
        return rest


@pytest.fixture
def supervisor(tmp_path):
    process = Supervisor("w-1/1", Pool("test"))
    process.identity = TaskKey("w-1", 1)
    yield process
    process.kill_and_reap()


def test_a_process_that_ignores_sigterm_is_killed_once_the_grace_is_over(supervisor, tmp_path):
    lines = Lines()
    with supervisor.lock:
        supervisor.spawn([PY, "-c", STUBBORN], str(tmp_path), {"PATH": "/usr/bin:/bin"}, lines)
    wait_until(lambda: lines.lines, 10, 0.05, "the first line")
    assert lines.lines == [("stdout", "ready")]
    assert supervisor.pids() == [supervisor.proc.pid]
    with supervisor.lock:
        assert supervisor.terminate(0.3)
        assert supervisor.kill_if_due(time.monotonic()) is not None  # still within the grace
    assert (
        read_proc(supervisor.proc.pid) is not None
    )  # SIGTERM ignored (its handler was set before "ready")
    with supervisor.lock:
        assert (
            supervisor.kill_if_due(time.monotonic() + 0.3) is None
        )  # the grace is over: SIGKILL sent
    assert supervisor.exited.wait(10)
    assert describe_exit(supervisor.reap()) == (128 + signal.SIGKILL, "killed by SIGKILL")
    assert wait_gone([supervisor.proc.pid], 5)
    with supervisor.lock:
        assert not supervisor.terminate(1.0)  # reaped: its pid is no longer its to signal


def test_describe_exit_and_check_executable():
    assert describe_exit(0) == (0, "exit code 0")
    assert describe_exit(3) == (3, "exit code 3")
    assert describe_exit(-signal.SIGTERM) == (143, "killed by SIGTERM")
    check_executable("sh", "/", "/usr/bin:/bin")
    with pytest.raises(TaskError, match="not found in PATH"):
        check_executable("fleet-no-such-tool", "/", "/usr/bin:/bin")
