"""Instances with an image: podman runs them (tests/agent/podman_support.py), busybox's httpd serves
the volume through the published host port, the variables reach the container, a stop leaves no
container, and an image the host does not have is a failed start that says so."""

import json

import pytest

from agent.ports import PortAllocator
from agent.task.container import ContainerRuntime, container_name
from tests.agent.conftest import wait_until
from tests.agent.instance_support import http_get, instance_assignment, port_range
from tests.agent.podman_support import IMAGE, PODMAN, containers_named, prepare_podman
from tests.agent.test_runner import make_runner  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory):
    return prepare_podman(str(tmp_path_factory.mktemp("podman")))


@pytest.fixture
def node(make_runner, tmp_path, podman_env):  # noqa: F811
    # The agent's podman calls get the agent's fixed environment (no CONTAINERS_CONF): they start
    # even so.
    low, high = port_range()
    runtime = ContainerRuntime.detect(" ".join(PODMAN))
    runner = make_runner(
        "node", ports=PortAllocator(str(tmp_path / "node"), low, high), containers=runtime
    )
    runner.low = low
    yield runner
    runner.shutdown(
        "test over", timeout=30, stop_instances=True
    )  # stops and removes the containers


def test_a_container_instance_serves_its_volume_through_the_published_port_and_a_stop_removes_it(
    node, fleetd, podman_env, tmp_path
):  # noqa: F811
    volume = tmp_path / "node" / "volumes" / "c-web"
    volume.mkdir(parents=True)
    (volume / "index.html").write_text("hello from a container")
    node.submit(
        instance_assignment(
            "t-c-web",
            ["/bin/httpd", "-f", "-v", "-p", "8000", "-h", "/workspace"],
            instance_id="c-web",
            restart="always",
            image=IMAGE,
            ports=[{"port": 8000, "protocol": "http"}],
        )
    )
    started = fleetd.wait_for(
        lambda: fleetd.started.get("t-c-web"), timeout=60, message="the start"
    )
    assert started["ports"] == [{"port": 8000, "host_port": node.low, "protocol": "http"}]
    url = f"http://127.0.0.1:{node.low}/index.html"
    assert wait_until(lambda: http_get(url), timeout=60, message="the container's URL") == (
        200,
        "hello from a container",
    )
    name = container_name("c-web", 1)
    assert containers_named(podman_env, name) == [name]
    figures = wait_until(
        lambda: node.get("t-c-web").container_stats(), timeout=30, message="podman stats"
    )
    assert all(value >= 0 for value in figures)
    node.cancel(["t-c-web"], "stopped by its owner")
    finish = fleetd.wait_finished("t-c-web", timeout=60)
    assert finish["outcome"] == "cancelled" and finish["reason"].startswith("stopped by its owner")
    assert http_get(url) is None and containers_named(podman_env, name) == []
    assert (volume / "index.html").read_text() == "hello from a container"  # the volume stays


def test_a_container_gets_the_instance_variables_and_a_missing_image_is_a_failed_start(
    node, fleetd
):  # noqa: F811
    show = [
        "/bin/sh",
        "-c",
        'echo "{\\"id\\": \\"$FLEET_INSTANCE_ID\\", \\"volume\\": \\"$FLEET_VOLUME\\", '
        '\\"port\\": \\"$FLEET_PORT_8000\\", \\"greeting\\": \\"$GREETING\\", \\"path\\": '
        '\\"$PATH\\"}"; echo note > "$FLEET_VOLUME/note"',
    ]
    node.submit(
        instance_assignment(
            "t-c-env",
            show,
            instance_id="c-env",
            image=IMAGE,
            ports=[{"port": 8000, "protocol": "tcp"}],
        )
    )
    assert fleetd.wait_finished("t-c-env", timeout=60)["outcome"] == "succeeded"
    seen = json.loads(fleetd.texts("t-c-env", "stdout")[0])
    assert seen["id"] == "c-env" and seen["volume"] == "/workspace" and seen["greeting"] == "hi"
    assert seen["port"] == str(node.low)
    assert "/bin" in seen["path"]  # the image's PATH, not the host's passed in
    with open(node.volumes.path("c-env") + "/note") as fh:
        assert fh.read() == "note\n"
    node.submit(
        instance_assignment(
            "t-c-none", [], instance_id="c-none", image="localhost/fleet-no-such-image:1"
        )
    )
    missing = fleetd.wait_finished("t-c-none", timeout=60)
    assert (
        missing["outcome"] == "failed"
        and missing["reason"] == "image localhost/fleet-no-such-image:1 not found on this host"
    )


def test_a_container_that_fails_is_run_again_under_the_same_name(node, fleetd, podman_env):  # noqa: F811
    node.submit(
        instance_assignment(
            "t-c-again",
            ["/bin/sh", "-c", "echo run; exit 3"],
            instance_id="c-again",
            restart="on-failure",
            image=IMAGE,
        )
    )
    wait_until(
        lambda: fleetd.texts("t-c-again", "stdout").count("run") >= 2,
        timeout=60,
        message="a second run of the container",
    )
    notes = [t for t in fleetd.texts("t-c-again", "system") if "restarting it in" in t]
    assert notes and "exit code 3" in notes[0]
    node.cancel(["t-c-again"], "stop")
    assert fleetd.wait_finished("t-c-again", timeout=60)["outcome"] == "cancelled"
    assert containers_named(podman_env, container_name("c-again", 1)) == []
