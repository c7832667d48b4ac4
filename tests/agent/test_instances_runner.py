"""Instance runs in the task runner, with real processes against the stand-in fleetd: the volume,
the host ports and the environment, the restart policy and its back-off, and volumes deleted on
fleetd's word."""

import json
import os
import socket

import pytest

from agent.ports import PortAllocator
from agent.procfs import read_proc, wait_gone
from tests.agent.conftest import wait_until
from tests.agent.instance_support import (
    HTTP_SERVER,
    PY,
    http_get,
    instance_assignment,
    kill_left_instances,
    port_range,
)
from tests.agent.test_runner import make_runner  # noqa: F401 (fixture)
from tests.support.workloads import hold

ENV_PRINTER = (
    "import json, os\n"
    "keys = ('FLEET_INSTANCE_ID', 'FLEET_VOLUME', 'FLEET_PORT_8000', 'FLEET_PORT_9000', "
    "'GREETING')\n"
    "print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True)\n"
)


@pytest.fixture
def node(make_runner, tmp_path):  # noqa: F811
    """A runner with a port range of its own; node.start(name) makes another one on the same state
    dir."""
    low, high = port_range()

    made = []

    def start(name="node"):
        made.append(make_runner(name, ports=PortAllocator(str(tmp_path / name), low, high)))
        return made[-1]

    start.range = (low, high)
    yield start
    for runner in made:
        runner.shutdown("test over", timeout=15, stop_instances=True)
    kill_left_instances(tmp_path / "node")  # what a failed test left between two runners


def test_an_instance_gets_its_volume_its_ports_and_its_variables_and_keeps_the_volume(
    node, fleetd, tmp_path
):  # noqa: F811
    runner = node()
    low, _high = node.range
    ports = [{"port": 8000, "protocol": "http"}, {"port": 9000, "protocol": "tcp"}]
    runner.submit(instance_assignment("t-env", [PY, "-c", ENV_PRINTER], ports=ports))
    finish = fleetd.wait_finished("t-env")
    assert finish["outcome"] == "succeeded" and finish["exit_code"] == 0
    volume = tmp_path / "node" / "volumes" / "inst-1"
    seen = json.loads(fleetd.texts("t-env", "stdout")[0])
    assert seen == {
        "FLEET_INSTANCE_ID": "inst-1",
        "FLEET_VOLUME": str(volume),
        "FLEET_PORT_8000": str(low),
        "FLEET_PORT_9000": str(low + 1),
        "GREETING": "hi",
    }
    # The start report names the ports; a process that ended before it was sent has its start in the
    # finish.
    start = finish if "pid" in finish else fleetd.started["t-env"]
    assert start["ports"] == [
        {"port": 8000, "host_port": low, "protocol": "http"},
        {"port": 9000, "host_port": low + 1, "protocol": "tcp"},
    ]
    assert volume.is_dir() and oct(volume.stat().st_mode & 0o777) == "0o700"
    assert json.loads((tmp_path / "node" / "ports.json").read_text()) == {
        "inst-1": {"8000": low, "9000": low + 1}
    }
    wait_until(
        lambda: not (tmp_path / "node" / "tasks" / "t-env.1").exists(), message="the task dir to go"
    )
    assert volume.is_dir()  # the run's end leaves the volume


def test_a_resume_finds_the_volume_and_the_ports_and_another_instance_gets_other_ports(
    node, fleetd, tmp_path
):  # noqa: F811
    low, _high = node.range
    runner = node()
    write = [
        PY,
        "-c",
        "import os; open(os.path.join(os.environ['FLEET_VOLUME'], 'note'), 'w').write('kept')",
    ]
    runner.submit(instance_assignment("t-run1", write, ports=[{"port": 8000, "protocol": "http"}]))
    assert fleetd.wait_finished("t-run1")["outcome"] == "succeeded"
    runner.shutdown("a restart of the agent", timeout=10)
    # Something else listens on the next port of the range: the second instance skips it.
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", low + 1))
        busy.listen()
        runner = node()  # a new agent on the same state dir: ports.json is read again
        read = [
            PY,
            "-c",
            "import os; print(open(os.path.join(os.environ['FLEET_VOLUME'], 'note')).read(), "
            "os.environ['FLEET_PORT_8000'])",
        ]
        runner.submit(
            instance_assignment("t-run2", read, epoch=1, ports=[{"port": 8000, "protocol": "http"}])
        )
        runner.submit(
            instance_assignment(
                "t-other",
                [PY, "-c", "import os; print(os.environ['FLEET_PORT_8000'])"],
                instance_id="inst-2",
                ports=[{"port": 8000, "protocol": "http"}],
            )
        )
        assert fleetd.wait_finished("t-run2")["outcome"] == "succeeded"
        assert fleetd.wait_finished("t-other")["outcome"] == "succeeded"
    assert fleetd.texts("t-run2", "stdout") == [f"kept {low}"]
    assert fleetd.texts("t-other", "stdout") == [str(low + 2)]


def test_the_start_report_names_the_ports_and_the_url_answers_until_the_stop(
    node, fleetd, tmp_path
):  # noqa: F811
    low, _high = node.range
    runner = node()
    (tmp_path / "node" / "volumes" / "inst-web").mkdir(parents=True)
    (tmp_path / "node" / "volumes" / "inst-web" / "index.html").write_text("hello from the volume")
    runner.submit(
        instance_assignment(
            "t-web",
            [PY, "-c", HTTP_SERVER],
            instance_id="inst-web",
            restart="always",
            ports=[{"port": 8000, "protocol": "http"}],
        )
    )
    started = fleetd.wait_for(lambda: fleetd.started.get("t-web"), message="the start")
    assert started["ports"] == [{"port": 8000, "host_port": low, "protocol": "http"}]
    assert (
        wait_until(lambda: http_get(f"http://127.0.0.1:{low}/"), message="the server")[1]
        == "hello from the volume"
    )
    runner.cancel(["t-web"], "stopped by its owner")
    finish = fleetd.wait_finished("t-web")
    assert finish["outcome"] == "cancelled" and finish["reason"].startswith("stopped by its owner")
    assert (
        http_get(f"http://127.0.0.1:{low}/") is None
    )  # a stop never restarts, whatever the policy
    assert wait_gone([started["pid"]], 10)


def test_on_failure_restarts_with_a_doubling_back_off_until_the_process_succeeds(
    node, fleetd, tmp_path
):  # noqa: F811
    runner = node()
    # Each run notes its start time in the volume, then fails three times and succeeds the fourth.
    code = (
        "import os, sys, time\n"
        "path = os.path.join(os.environ['FLEET_VOLUME'], 'starts')\n"
        "open(path, 'a').write(f'{time.monotonic()}\\n')\n"
        "runs = len(open(path).read().split())\n"
        "print('run', runs, flush=True)\n"
        "sys.exit(0 if runs == 4 else 7)\n"
    )
    runner.submit(
        instance_assignment(
            "t-flaky", [PY, "-c", code], instance_id="inst-flaky", restart="on-failure"
        )
    )
    finish = fleetd.wait_finished("t-flaky", timeout=60)
    assert finish["outcome"] == "succeeded"
    starts = [
        float(t)
        for t in (tmp_path / "node" / "volumes" / "inst-flaky" / "starts").read_text().split()
    ]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert (
        len(gaps) == 3 and 0.9 <= gaps[0] < 1.9 and 1.9 <= gaps[1] < 3.5 and 3.9 <= gaps[2] < 6
    ), gaps
    assert fleetd.texts("t-flaky", "stdout") == ["run 1", "run 2", "run 3", "run 4"]
    notes = [t for t in fleetd.texts("t-flaky", "system") if "restarting it in" in t]
    assert [n.split("restarting it in ")[1].split("s ")[0] for n in notes] == ["1", "2", "4"]
    assert all("exit code 7" in n and "restart policy on-failure" in n for n in notes)
    # Each exit that is restarted is reported with its back-off; each start that is reported (a
    # process that ends within the report's delay has its start carried by what follows) says which
    # restart it is.
    assert [
        (r["exit_code"], r["reason"], r["backoff_seconds"]) for r in fleetd.restarts["t-flaky"]
    ] == [(7, "exit code 7", 1), (7, "exit code 7", 2), (7, "exit code 7", 4)]
    # The wire leaves `restarts` out when it is 0 (the first start).
    starts = [
        body.get("restarts", 0) for _, path, body in fleetd.calls if path.endswith("/t-flaky/start")
    ]
    assert (
        starts == sorted(set(starts))
        and set(starts) <= {0, 1, 2, 3}
        and fleetd.started["t-flaky"]["epoch"] == 1
    )


def test_a_policy_gives_up_after_its_limit_of_quick_restarts_and_the_run_fails(
    node, make_runner, fleetd
):  # noqa: F811
    runner = node()
    runner.restart_limit = 2
    runner.submit(
        instance_assignment(
            "t-loop",
            [PY, "-c", "import sys; sys.exit(126)"],
            instance_id="i-loop",
            restart="always",
        )
    )
    finish = fleetd.wait_finished("t-loop", timeout=30)
    assert finish["outcome"] == "failed" and finish["exit_code"] == 126, finish
    assert finish["reason"] == (
        "exit code 126; restart policy always gave up after 2 restarts in a row that each "
        "ran under 60s"
    )
    assert [r["backoff_seconds"] for r in fleetd.restarts["t-loop"]] == [1, 2]


def test_never_does_not_restart_and_always_restarts_a_clean_exit_until_stopped(
    node, fleetd, tmp_path
):  # noqa: F811
    runner = node()
    runner.submit(
        instance_assignment(
            "t-never", [PY, "-c", "import sys; sys.exit(3)"], instance_id="i-never", restart="never"
        )
    )
    runner.submit(
        instance_assignment(
            "t-always",
            [PY, "-c", "print('up', flush=True)"],
            instance_id="i-always",
            restart="always",
        )
    )
    never = fleetd.wait_finished("t-never")
    assert (never["outcome"], never["exit_code"], never["reason"]) == ("failed", 3, "exit code 3")
    wait_until(
        lambda: fleetd.texts("t-always", "stdout").count("up") >= 2,
        message="a restart after exit 0",
    )
    assert "t-always" not in fleetd.finished
    restarts = runner.get("t-always").restarts
    runner.cancel(["t-always"], "stop")
    assert fleetd.wait_finished("t-always")["outcome"] == "cancelled"
    assert runner.get("t-always") is None or runner.get("t-always").restarts <= restarts + 1


def test_delete_volumes_removes_a_stopped_instances_volume_and_ports_but_never_a_running_ones(
    node, fleetd, tmp_path
):  # noqa: F811
    runner = node()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("not the volume's")
    link = (
        "import os; v = os.environ['FLEET_VOLUME']; os.makedirs(v + '/sub'); "
        f"os.symlink({str(outside)!r}, v + '/sub/link'); open(v + '/data', 'w').write('x' * 10000)"
    )
    runner.submit(
        instance_assignment(
            "t-old",
            [PY, "-c", link],
            instance_id="i-old",
            ports=[{"port": 8000, "protocol": "http"}],
        )
    )
    assert fleetd.wait_finished("t-old")["outcome"] == "succeeded"
    runner.submit(instance_assignment("t-live", [PY, "-c", hold(300)], instance_id="i-live"))
    fleetd.wait_for(lambda: "t-live" in fleetd.started, message="the start")
    assert runner.volumes.list() == ["i-live", "i-old"]
    used = runner.volumes.used_bytes("i-old")
    assert used >= 10000
    runner.delete_volumes(["i-old", "i-live", "i-unknown"])
    wait_until(
        lambda: runner.volumes.list() == ["i-live"], message="the stopped instance's volume to go"
    )
    assert (
        outside / "precious"
    ).read_text() == "not the volume's"  # the link went, not what it points at
    assert runner.ports.get("i-old") == {}
    assert "i-old" not in json.loads((tmp_path / "node" / "ports.json").read_text())
    runner.cancel(["t-live"], "stop")
    assert fleetd.wait_finished("t-live")["outcome"] == "cancelled"


def test_an_instance_that_cannot_start_fails_with_the_reason_and_no_port_is_taken_twice(
    node, fleetd, tmp_path
):  # noqa: F811
    runner = node()
    runner.submit(
        instance_assignment(
            "t-missing", ["/nonexistent/server"], instance_id="i-m", restart="always"
        )
    )
    missing = fleetd.wait_finished("t-missing")
    assert (
        missing["outcome"] == "failed" and "cannot start '/nonexistent/server'" in missing["reason"]
    )
    runner.submit(
        instance_assignment("t-image", [], instance_id="i-img", image="localhost/none:latest")
    )
    image = fleetd.wait_finished("t-image")
    assert image["outcome"] == "failed" and "no container runtime" in image["reason"]
    runner.submit(
        instance_assignment("t-huge", ["true"], instance_id="i-huge", volume_bytes=1 << 60)
    )
    huge = fleetd.wait_finished("t-huge")
    assert (
        huge["outcome"] == "failed"
        and f"the volume of {1 << 60} bytes does not fit" in huge["reason"]
    )


def test_the_runtime_figures_of_a_running_instance(node, fleetd, tmp_path):  # noqa: F811
    runner = node()
    burn = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass\n"
    runner.submit(instance_assignment("t-busy", [PY, "-c", burn], instance_id="i-busy"))
    fleetd.wait_for(lambda: "t-busy" in fleetd.started, message="the start")
    task = runner.get("t-busy")
    # The second reading of /proc, PROCESS_EVERY_SECONDS after the first, gives the CPU share.
    wait_until(
        lambda: task.report()["container"]["cpu_percent"], timeout=20, message="a CPU reading"
    )
    figures = task.report()
    assert figures["container"]["cpu_percent"] > 20
    assert figures["task_id"] == "t-busy" and figures["epoch"] == 1 and figures["restarts"] == 0
    assert figures["uptime_seconds"] >= 0 and figures["gpus"] == []
    assert figures["container"]["memory_percent"] > 0 and figures["volume_used_bytes"] is not None
    assert runner.instances_report() == [task.report()]
    runner.cancel(["t-busy"], "stop")
    assert fleetd.wait_finished("t-busy")["outcome"] == "cancelled"
    assert os.path.isdir(tmp_path / "node" / "volumes" / "i-busy")


def test_a_stopped_run_reports_its_finish_only_once_a_daemon_it_started_is_gone(
    node, fleetd, tmp_path
):  # noqa: F811
    runner = node()
    # The command starts a daemon in a session of its own (out of its process group), notes its pid,
    # then waits.
    code = (
        "import os, subprocess, sys\n"
        f"daemon = subprocess.Popen([sys.executable, '-c', {hold(3600)!r}], "
        f"start_new_session=True)\n"
        "open(os.path.join(os.environ['FLEET_VOLUME'], 'daemon.pid'), 'w').write(str(daemon.pid))\n"
        + hold(3600)
    )
    runner.submit(
        instance_assignment("t-daemon", [PY, "-c", code], instance_id="i-daemon", restart="always")
    )
    pid_file = tmp_path / "node" / "volumes" / "i-daemon" / "daemon.pid"
    daemon = int(
        wait_until(
            lambda: pid_file.exists() and pid_file.read_text(), timeout=30, message="the daemon"
        )
    )
    fleetd.hold_finish.clear()  # the finish report waits, unanswered, while the test looks
    try:
        runner.cancel(["t-daemon"], "stopped by its owner")
        wait_until(
            lambda: any(path.endswith("finish") for _, path, _ in fleetd.calls),
            timeout=30,
            message="the finish report",
        )
        assert read_proc(daemon) is None  # gone before fleetd heard that the run ended
    finally:
        fleetd.hold_finish.set()
    assert fleetd.wait_finished("t-daemon")["outcome"] == "cancelled"
