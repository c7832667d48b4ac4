"""Containers get only what their spec says: the runtime's client runs with the agent's own fixed
environment whatever the spec's env holds, the variables reach the container through a 0600 env
file that is gone once the container exists, the container runs as the owner's uid with no
privilege, and the runtime is probed (`<runtime> info`) before an image instance is run.

Real podman where it works here (tests/agent/podman_support.py), as root, as CI runs; the runtime's
client is a wrapper script that writes down, for each `run`, the environment it was given and the
env file's mode and owner, then hands over to podman.
"""

import os
import shutil
import stat
import tempfile
import types

import pytest

from agent.client import FleetClient
from agent.daemon import Agent
from agent.isolation import Isolation
from agent.ports import PortAllocator
from agent.task.container import (
    CLIENT_PATH,
    NO_RUNTIME,
    READY,
    ContainerRuntime,
    client_env,
    env_file_text,
    write_env_file,
)
from agent.task.output import OutputSettings
from agent.task.runner import Runner
from agent.workers import Workers
from tests.agent.conftest import wait_until
from tests.agent.instance_support import http_get, instance_assignment, port_range
from tests.agent.podman_support import IMAGE, PODMAN, prepare_podman

OWNER = {"source": "dynamic", "user": None, "uid": 61310, "gid": 61310}

# Writes down what the runtime's client was given for each `run`, then is podman.
WRAPPER = """#!/bin/sh
next=
for arg in "$@"; do
    if [ -n "$next" ]; then
        stat -c '%a %u %g' "$arg" >> {record}/env-file-stat
        cp "$arg" {record}/env-file-copy
        env > {record}/client-env
        next=
    fi
    [ "$arg" = --env-file ] && next=1
done
exec {podman} "$@"
"""

# Prints what the container sees, writes its uid into the volume and serves the volume on 8000.
SHOW = (
    'echo "conf=$CONTAINERS_CONF"; echo "path=$PATH"; echo "preload=$LD_PRELOAD"; echo '
    '"host=$CONTAINER_HOST"; echo "greeting=$GREETING"; echo "uid=$(/bin/busybox id '
    '-u):$(/bin/busybox id -g)"; '
    "if ls /agent-state >/dev/null 2>&1; then echo agent-state=visible; else echo "
    "agent-state=absent; fi; "
    'echo hello > "$FLEET_VOLUME/index.html"; /bin/busybox id -u > "$FLEET_VOLUME/uid"; '
    'exec /bin/httpd -f -p 8000 -h "$FLEET_VOLUME"'
)


def failing_runtime(directory, words):
    """A runtime command whose every call fails with `words` on stderr (a daemon that is down)."""
    path = os.path.join(directory, "podman-down")
    with open(path, "w") as fh:
        fh.write(f"#!/bin/sh\necho '{words}' >&2\nexit 125\n")
    os.chmod(path, 0o755)
    return ContainerRuntime([path], "podman")


@pytest.fixture
def state_dir():
    """A state dir other uids may pass through on the way to it, as /var/lib is."""
    top = tempfile.mkdtemp(prefix="fleet-containers-")
    os.chmod(top, 0o711)
    yield os.path.join(top, "state")
    shutil.rmtree(top, ignore_errors=True)


def make_runner(state_dir, fleetd, runtime, ports=None):
    return Runner(
        state_dir,
        Workers(),
        lambda: FleetClient(fleetd.url, "fln_test", timeout=10),
        "127.0.0.1",
        kill_grace_seconds=1.0,
        backoff_max_seconds=0.2,
        ports=ports,
        containers=runtime,
        output_settings=OutputSettings(interval_seconds=0.05, backoff_max_seconds=0.2),
    )


# -------------------------------------------------------------- without a container runtime at work


def test_the_client_environment_is_fixed_and_takes_nothing_of_the_agents_but_its_runtime_dir():
    agent_env = {
        "PATH": "/evil",
        "LD_PRELOAD": "/x.so",
        "CONTAINERS_CONF": "/c",
        "CONTAINER_HOST": "tcp://x",
        "DOCKER_HOST": "tcp://y",
        "FLEET_AGENT_JOIN_TOKEN": "flj_x",
        "XDG_RUNTIME_DIR": "/run/user/0",
    }
    env = client_env(agent_env)
    assert set(env) == {"PATH", "HOME", "LANG", "XDG_RUNTIME_DIR"}
    assert (env["PATH"], env["LANG"], env["XDG_RUNTIME_DIR"]) == (
        CLIENT_PATH,
        "C.UTF-8",
        "/run/user/0",
    )
    assert "XDG_RUNTIME_DIR" not in client_env({})


def test_an_env_file_is_private_one_line_per_variable_and_refuses_what_a_line_cannot_carry(
    tmp_path,
):
    path = str(tmp_path / "container.env")
    write_env_file(path, {"B": "two = 2", "A": " spaced ", "PATH": "/x:/bin"})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as fh:
        assert fh.read() == "A= spaced \nB=two = 2\nPATH=/x:/bin\n"
    for bad, words in (
        ({"X": "a\nY=b"}, "line break"),
        ({"X": "a\rb"}, "line break"),
        ({"BAD NAME": "x"}, "name"),
        ({"X": "v" * 70000}, "longer"),
    ):
        with pytest.raises(ValueError, match=words):
            env_file_text(bad)


def test_a_runtime_that_does_not_answer_info_is_unavailable_with_its_own_words(tmp_path):
    runtime = failing_runtime(str(tmp_path), "Error: cannot connect to the service: no such socket")
    assert (
        runtime.probe()
        == "unavailable: podman info: Error: cannot connect to the service: no such socket"
    )
    assert ContainerRuntime.capability(None) == NO_RUNTIME
    assert NO_RUNTIME == "unavailable: no container runtime (neither podman nor docker found)"


def test_node_capabilities_say_containers_and_keep_isolation(tmp_path):
    down = failing_runtime(str(tmp_path), "podman is broken")
    agent = types.SimpleNamespace(
        _runtime_checked=None,
        config=types.SimpleNamespace(containers_command=down.argv[0]),
        runner=types.SimpleNamespace(containers=None, isolation=Isolation()),
    )
    caps = Agent._capabilities(agent)
    assert (
        caps["container_runtime"] == "podman"
        and caps["containers"] == "unavailable: podman info: podman is broken"
    )
    assert caps["isolation"] in ("uid", "none") and "host_uids" in caps
    agent = types.SimpleNamespace(
        _runtime_checked=None,
        config=types.SimpleNamespace(containers_command="none"),
        runner=types.SimpleNamespace(containers=None, isolation=Isolation()),
    )
    assert Agent._capabilities(agent)["containers"] == NO_RUNTIME


def test_an_image_instance_on_a_node_whose_runtime_is_unavailable_fails_at_once_with_the_reason(
    state_dir, fleetd, tmp_path
):
    runner = make_runner(
        state_dir, fleetd, failing_runtime(str(tmp_path), "Error: storage is corrupt")
    )
    try:
        runner.submit(instance_assignment("t-down", [], instance_id="c-down", image=IMAGE))
        finish = fleetd.wait_finished("t-down", timeout=30)
    finally:
        runner.shutdown("test over", timeout=15)
    assert finish["outcome"] == "failed"
    assert finish["reason"] == (
        f"cannot run image {IMAGE}: containers unavailable: podman info: Error: storage is corrupt"
    )


# ------------------------------------------------------------------ real podman


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="running a container as another uid needs root and setpriv (CI runs as root)",
)


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory):
    return prepare_podman(str(tmp_path_factory.mktemp("podman")))


@pytest.fixture
def recorded(tmp_path, podman_env):
    """(the runtime: the recording wrapper around podman, the directory it records into)."""
    record = tmp_path / "record"
    record.mkdir()
    wrapper = tmp_path / "podman-recorded"
    wrapper.write_text(WRAPPER.format(record=record, podman=" ".join(PODMAN)))
    wrapper.chmod(0o755)
    return ContainerRuntime.detect(str(wrapper)), record


@pytest.mark.integration
def test_podman_here_is_ready(podman_env):
    runtime = ContainerRuntime.detect(" ".join(PODMAN))
    assert runtime.probe() == READY and ContainerRuntime.capability(runtime) == READY


@pytest.mark.integration
@needs_root
def test_a_specs_client_variables_reach_only_the_container_which_runs_as_its_owner_unprivileged(
    state_dir, fleetd, recorded
):
    runtime, record = recorded
    low, high = port_range()
    runner = make_runner(state_dir, fleetd, runtime, ports=PortAllocator(state_dir, low, high))
    # Each would steer a root client that took it: mount the agent's state into the container, run
    # another podman, preload a library into it, talk to another service.
    conf = os.path.join(os.path.dirname(state_dir), "evil-containers.conf")
    with open(conf, "w") as fh:
        fh.write(f'[containers]\nvolumes = ["{state_dir}:/agent-state"]\n')
    hostile = {
        "CONTAINERS_CONF": conf,
        "PATH": "/fleet-evil/bin:/bin",
        "LD_PRELOAD": "/fleet-evil/libevil.so",
        "CONTAINER_HOST": "unix:///fleet-evil/podman.sock",
    }
    wire = instance_assignment(
        "t-c-iso",
        ["/bin/sh", "-c", SHOW],
        instance_id="c-iso",
        restart="never",
        image=IMAGE,
        ports=[{"port": 8000, "protocol": "http"}],
    )
    wire.update(run_as=OWNER, env={"GREETING": "hi", **hostile})
    try:
        task = runner.submit(wire)
        fleetd.wait_for(lambda: fleetd.started.get("t-c-iso"), timeout=60, message="the start")
        assert wait_until(
            lambda: http_get(f"http://127.0.0.1:{low}/index.html"),
            timeout=60,
            message="the container's URL",
        ) == (200, "hello\n")
        out = wait_until(
            lambda: (lambda lines: lines if len(lines) >= 7 else None)(
                fleetd.texts("t-c-iso", "stdout")
            ),
            timeout=30,
            message="what the container saw",
        )
        # The env file was the agent's alone, and is gone while the container runs.
        assert (record / "env-file-stat").read_text().split() == ["600", "0", "0"]
        wait_until(
            lambda: not os.path.exists(task.env_file), timeout=30, message="the env file's removal"
        )
        assert os.path.dirname(task.env_file) == task.dir and os.stat(task.dir).st_uid == 0
        ports = wait_until(
            lambda: (runner.instances_report() or [{}])[0].get("ports"),
            timeout=30,
            message="the port figures",
        )
        wait_until(
            lambda: task.check_ports() == {low: "ok"},
            timeout=30,
            message="the port read as the container's",
        )
        assert ports[0]["port"] == 8000 and ports[0]["host_port"] == low
    finally:
        runner.shutdown("test over", timeout=30, stop_instances=True)
    seen = dict(line.split("=", 1) for line in out if "=" in line)
    assert seen == {
        "conf": conf,
        "path": hostile["PATH"],
        "preload": hostile["LD_PRELOAD"],
        "host": hostile["CONTAINER_HOST"],
        "greeting": "hi",
        "uid": "61310:61310",
        "agent-state": "absent",
    }
    # The client had the agent's fixed environment, none of the spec's.
    client = dict(
        line.split("=", 1)
        for line in (record / "client-env").read_text().splitlines()
        if "=" in line
    )
    assert (
        not {"CONTAINERS_CONF", "LD_PRELOAD", "CONTAINER_HOST"} & set(client)
        and client["PATH"] == CLIENT_PATH
    )
    assert not {"GREETING", "FLEET_INSTANCE_ID"} & set(client)
    assert "GREETING=hi\n" in (record / "env-file-copy").read_text()
    volume = runner.volumes.path("c-iso")
    assert os.stat(os.path.join(volume, "uid")).st_uid == 61310
    with open(os.path.join(volume, "uid")) as fh:
        assert fh.read().strip() == "61310"


@pytest.mark.integration
@needs_root
def test_a_container_has_no_capabilities_and_no_new_privileges_and_root_only_when_fleetd_says_root(
    state_dir, fleetd, recorded
):
    runtime, _record = recorded
    show = [
        "/bin/sh",
        "-c",
        "/bin/busybox id -u; /bin/busybox grep -e ^CapEff -e ^NoNewPrivs /proc/self/status",
    ]
    runner = make_runner(state_dir, fleetd, runtime)
    try:
        for task_id, run_as in (
            ("t-c-caps", OWNER),
            ("t-c-root", {"source": "root", "user": "root", "uid": 0, "gid": 0}),
        ):
            wire = instance_assignment(task_id, show, instance_id=task_id, image=IMAGE)
            wire["run_as"] = run_as
            runner.submit(wire)
            assert fleetd.wait_finished(task_id, timeout=60)["outcome"] == "succeeded"
    finally:
        runner.shutdown("test over", timeout=30, stop_instances=True)
    for task_id, uid in (("t-c-caps", "61310"), ("t-c-root", "0")):
        lines = [line.split() for line in fleetd.texts(task_id, "stdout")]
        assert lines[0] == [uid]
        assert ["CapEff:", "0000000000000000"] in lines and ["NoNewPrivs:", "1"] in lines
