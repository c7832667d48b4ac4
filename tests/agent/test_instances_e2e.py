"""Instances end to end: a real `fleetd serve`, a real `fleet-agent run` on fake GPUs, real
processes and podman containers. Create, connect, stop, resume with the volume's content, an agent
SIGKILLed under a running instance, delete (deleting, then gone); an image served through its
published port; a host process and a container that exit at every start (restarting, then failed); a
daemon a stopped instance started."""

import signal

import pytest

from agent.procfs import read_proc
from agent.task.journal import read_state
from tests.agent.conftest import Http, wait_until
from tests.agent.instance_support import HTTP_SERVER, PY, http_get, kill_left_instances, port_range
from tests.agent.podman_support import IMAGE, PODMAN, containers_named, prepare_podman
from tests.support.workloads import hold

pytestmark = pytest.mark.integration

SETTINGS = {
    "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1",
    "FLEETD_SCHEDULER_INTERVAL_SECONDS": "0.5",
    "FLEETD_LIVENESS_SWEEP_SECONDS": "0.5",
    "FLEETD_LEASE_SWEEP_SECONDS": "0.5",
}


@pytest.fixture
def fleet(server_factory, admin, agent_factory):
    """fleetd and one ready agent with 4 fake L4 GPUs: make(**agent config, env=...) -> (http,
    agent)."""

    def make(env=None, **extra):
        server = server_factory(**SETTINGS)
        http = Http(server.url, admin)
        http.create_root_fleet("lab")  # not about isolation: the admin's work runs as root
        join = http(
            "POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}
        ).json()
        low, high = port_range()
        settings = {
            "tasks_kill_grace_seconds": 2.0,
            "ports_range": f"{low}-{high}",
            "containers_command": "none",
        }
        settings.update(extra)
        agent = agent_factory("host", shape="l4_x4", extra=settings, env=env)
        agent.join(join["token"], server.url, check=True)
        agent.start()
        node_id = agent.node()["node_id"]
        http.wait_node_ready(node_id)
        made.append(agent)
        return http, agent

    made = []
    yield make
    for agent in made:  # instances outlive their agent by design: what a failed test left goes here
        agent.kill()
        kill_left_instances(agent.state_dir)


def wait_state(http, instance_id, state, timeout=60):
    # A plain GET each look: a long poll answers with the state after the next change, so one sent
    # while a crash loop is restarting (1 s, then 2 s) would skip past it.
    def check():
        found = http("GET", f"/api/v1/instances/{instance_id}", expect=200).json()
        return found if found["state"] == state else None

    def seen():
        events = http("GET", f"/api/v1/instances/{instance_id}/events", expect=200).json()
        return [(e["to_status"], e.get("reason")) for e in events["items"]]

    return wait_until(
        check,
        timeout=timeout,
        interval=0.05,
        message=f"instance {instance_id} {state}",
        details=seen,
    )


def instance_pid(agent, instance_id):
    """The pid of the instance's running process, from the agent's journal of the run."""
    for path in (agent.state_dir / "tasks").glob("*/task.json"):
        record = read_state(path)
        if record.get("instance") == instance_id and record.get("state") == "running":
            return record["pid"]
    return None


def connect(http, instance_id):
    return http(
        "GET", f"/api/v1/instances/{instance_id}/connection?wait_seconds=30", expect=200
    ).json()["url"]


def test_create_connect_stop_resume_survive_an_agent_kill_and_delete(fleet):
    http, agent = fleet()
    created = http(
        "POST",
        "/api/v1/instances",
        expect=201,
        json={
            "name": "web",
            "command": [PY, "-c", HTTP_SERVER],
            "resources": {"gpus": 1},
            "ports": [{"port": 8000, "protocol": "http"}],
            "restart": "always",
        },
    ).json()
    instance_id = created["id"]
    volume = agent.state_dir / "volumes" / instance_id
    wait_until(volume.is_dir, message="the volume made by the agent")
    (volume / "index.html").write_text("my notebook")
    url = connect(http, instance_id)
    assert wait_until(lambda: http_get(url), message="the instance's URL") == (200, "my notebook")

    http("POST", f"/api/v1/instances/{instance_id}/stop", expect=200)
    wait_state(http, instance_id, "stopped")
    assert http_get(url) is None
    assert (volume / "index.html").read_text() == "my notebook"

    http("POST", f"/api/v1/instances/{instance_id}/resume", expect=200, json={})
    again = connect(http, instance_id)
    assert again == url  # the same host port: kept in ports.json
    assert wait_until(lambda: http_get(url), message="the resumed URL") == (200, "my notebook")
    running = wait_state(http, instance_id, "running")
    assert running["runs"] == 2

    # The agent dies under it: the process serves on, and the next agent takes it back.
    pid = wait_until(lambda: instance_pid(agent, instance_id), message="the run's journal")
    agent.signal(signal.SIGKILL)
    agent.wait()
    assert read_proc(pid) is not None and http_get(url) == (200, "my notebook")
    agent.start()
    agent.wait_for_line(rf"took back pid {pid}")
    assert wait_state(http, instance_id, "running")["runs"] == 2  # not lost, not run again
    assert http_get(url) == (200, "my notebook") and read_proc(pid) is not None
    runtime = wait_until(
        lambda: (
            (found := http("GET", f"/api/v1/instances/{instance_id}", expect=200).json())[
                "runtime"
            ]["volume_used_bytes"]
            and found["runtime"]
        ),
        message="the runtime figures",
    )
    assert runtime["restarts"] == 0 and len(runtime["gpus"]) == 1

    deleting = http("DELETE", f"/api/v1/instances/{instance_id}", expect=202).json()
    assert deleting["state"] == "deleting"
    read_back = http("GET", f"/api/v1/instances/{instance_id}")  # at once: deleting, or gone
    assert read_back.status_code == 404 or read_back.json()["state"] == "deleting", read_back.text
    wait_until(lambda: not volume.exists(), timeout=60, message="the agent to delete the volume")
    wait_until(
        lambda: http("GET", f"/api/v1/instances/{instance_id}").status_code == 404,
        timeout=30,
        message="the instance gone once its node removed the volume",
    )
    assert http_get(url) is None
    assert [
        i["state"]
        for i in http("GET", "/api/v1/instances?state=deleted", expect=200).json()["items"]
    ] == ["deleted"]


def test_a_crash_looping_process_reads_restarting_with_its_exit_then_failed(fleet):
    http, agent = fleet(instances_restart_limit=2)
    created = http(
        "POST",
        "/api/v1/instances",
        expect=201,
        json={
            "name": "loop",
            "command": [PY, "-c", "import sys; sys.exit(126)"],
            "resources": {"gpus": 1},
            "restart": "always",
        },
    ).json()
    instance_id = created["id"]
    restarting = wait_state(http, instance_id, "restarting")
    assert (
        restarting["last_exit"]["exit_code"] == 126
        and restarting["last_exit"]["reason"] == "exit code 126"
    )
    assert restarting["last_exit"]["backoff_seconds"] in (1, 2) and restarting["next_start_at"]
    assert restarting["runtime"]["uptime_seconds"] == 0
    failed = wait_state(http, instance_id, "failed")
    assert (
        "gave up after 2 restarts" in failed["status_reason"]
        and failed["last_exit"]["exit_code"] == 126
    )
    states = [
        e["to_status"]
        for e in http("GET", f"/api/v1/instances/{instance_id}/events", expect=200).json()["items"]
        if e["to_status"]
    ]
    # One restarting per exit the limit allowed, then failed. Whether "running" shows between them
    # depends on whether the agent saw the process up before it exited (it exits at once).
    assert states[-1] == "failed" and states.count("restarting") == 2, states


def test_a_container_instance_is_served_through_its_published_port(fleet, tmp_path):
    env = prepare_podman(str(tmp_path))
    http, agent = fleet(
        env={"CONTAINERS_CONF": env["CONTAINERS_CONF"]}, containers_command=" ".join(PODMAN)
    )
    created = http(
        "POST",
        "/api/v1/instances",
        expect=201,
        json={
            "name": "box",
            "image": IMAGE,
            "command": ["/bin/httpd", "-f", "-p", "8000", "-h", "/workspace"],
            "resources": {"gpus": 1},
            "ports": [{"port": 8000, "protocol": "http"}],
        },
    ).json()
    instance_id = created["id"]
    volume = agent.state_dir / "volumes" / instance_id
    wait_until(volume.is_dir, timeout=60, message="the volume made by the agent")
    (volume / "index.html").write_text("inside a container")
    url = connect(http, instance_id)
    assert wait_until(
        lambda: http_get(url + "index.html"), timeout=60, message="the container's URL"
    ) == (200, "inside a container")
    name = f"fleet-{instance_id}-1"
    assert containers_named(env, name) == [name]
    assert (
        http("DELETE", f"/api/v1/instances/{instance_id}", expect=202).json()["state"] == "deleting"
    )
    wait_until(
        lambda: http("GET", f"/api/v1/instances/{instance_id}").status_code == 404,
        timeout=60,
        message="the instance gone once its node removed the volume",
    )
    assert not volume.exists() and containers_named(env, name) == [] and http_get(url) is None


def test_a_stopped_instance_reads_stopped_and_a_daemon_it_started_answers_no_more(fleet):
    http, agent = fleet()
    # The command starts the server in a session of its own (out of its process group), then waits.
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {HTTP_SERVER!r}], start_new_session=True)\n"
        + hold(3600)
    )
    instance_id = http(
        "POST",
        "/api/v1/instances",
        expect=201,
        json={
            "name": "forks",
            "command": [PY, "-c", code],
            "resources": {"gpus": 1},
            "ports": [{"port": 8000, "protocol": "http"}],
        },
    ).json()["id"]
    volume = agent.state_dir / "volumes" / instance_id
    wait_until(volume.is_dir, message="the volume made by the agent")
    (volume / "index.html").write_text("daemon")
    url = connect(http, instance_id)
    assert wait_until(lambda: http_get(url), message="the daemon's URL") == (200, "daemon")
    assert (
        http("POST", f"/api/v1/instances/{instance_id}/stop", expect=200).json()["state"]
        == "stopping"
    )
    wait_state(http, instance_id, "stopped")
    assert http_get(url) is None  # read stopped: nothing of it answers any more


def test_a_container_that_exits_at_every_start_reads_restarting_then_failed(fleet, tmp_path):
    env = prepare_podman(str(tmp_path))
    http, agent = fleet(
        env={"CONTAINERS_CONF": env["CONTAINERS_CONF"]},
        containers_command=" ".join(PODMAN),
        instances_restart_limit=2,
    )
    instance_id = http(
        "POST",
        "/api/v1/instances",
        expect=201,
        json={
            "name": "broken",
            "image": IMAGE,
            "command": ["/bin/sh", "-c", "exit 126"],
            "resources": {"gpus": 1},
            "restart": "always",
        },
    ).json()["id"]
    restarting = wait_state(http, instance_id, "restarting")
    assert restarting["last_exit"]["exit_code"] == 126 and restarting["cost_so_far"] == 0
    failed = wait_state(http, instance_id, "failed")
    assert failed["status_reason"].startswith(
        "exit code 126; restart policy always gave up after 2 restarts"
    )
    assert containers_named(env, f"fleet-{instance_id}-1") == []
