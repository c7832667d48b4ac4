"""An instance's host port reads "ok" only while the listener on it is the instance's own: another
process (another tenant's, another uid's) listening on it makes it `taken_by_other_process`, so that
fleetd never hands out a URL that serves someone else. Real sockets, real processes, /proc."""

import os
import shutil
import socket
import subprocess
import tempfile

import pytest

from agent.client import FleetClient
from agent.ports import PORT_NOT_LISTENING, PORT_OK, PORT_TAKEN, PortAllocator, port_states
from agent.procfs import socket_inodes, tcp_listeners
from agent.task.output import OutputSettings
from agent.task.runner import Runner
from agent.workers import Workers
from tests.agent.conftest import wait_until
from tests.agent.instance_support import HTTP_SERVER, http_get, instance_assignment, port_range
from tests.support.workloads import hold

PY = "/usr/bin/python3"  # every uid can run it (the venv is root's)
OWNER = {"source": "dynamic", "user": None, "uid": 61320, "gid": 61320}
SQUATTER_UID = 61321
LISTEN = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)\n"
    "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()\n"
    "print('listening', flush=True)\n" + hold(600)
)


def listen_as(uid, address, port):
    """A process of `uid` (this one's uid when None) listening on address:port, once it does."""
    prefix = (
        []
        if uid is None
        else [shutil.which("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    )
    proc = subprocess.Popen(
        [*prefix, PY, "-c", LISTEN, address, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "listening"
    return proc


def stop(proc):
    proc.kill()
    proc.wait(10)


def test_listeners_are_read_from_proc_net_tcp_and_their_holders_from_the_fds():
    low, _high = port_range(4)
    v4 = socket.socket()
    v4.bind(("127.0.0.1", low))
    v4.listen()
    v6 = socket.socket(socket.AF_INET6)
    v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        v6.bind(("::1", low))
        v6.listen()
    except OSError:  # a host without IPv6
        v6.close()
        v6 = None
    try:
        inodes = {os.fstat(s.fileno()).st_ino for s in (v4, v6) if s is not None}
        assert tcp_listeners([low, low + 1]) == {low: inodes, low + 1: set()}
        assert inodes <= socket_inodes(os.getpid())
        assert socket_inodes(2**22 + 12345) == set()  # no such process
    finally:
        for s in (v4, v6):
            if s is not None:
                s.close()


def test_a_port_is_ok_only_while_every_listener_on_it_is_held_by_the_instance():
    low, _high = port_range(4)
    own = socket.socket()
    own.bind(("127.0.0.1", low))
    own.listen()
    try:
        assert port_states([low, low + 1], [os.getpid()]) == {
            low: PORT_OK,
            low + 1: PORT_NOT_LISTENING,
        }
        assert port_states([low + 1], [], published=True) == {
            low + 1: PORT_OK
        }  # the runtime forwards it
        other = listen_as(None, "127.0.0.2", low)  # beside the instance's, on another address
        try:
            assert port_states([low], [os.getpid()]) == {low: PORT_TAKEN}
            assert port_states([low], [os.getpid(), other.pid]) == {low: PORT_OK}
        finally:
            stop(other)
        assert port_states([low], [other.pid]) == {
            low: PORT_TAKEN
        }  # not the instance's, whoever it is
    finally:
        own.close()


# ------------------------------------------------------------------ instances run as their owner


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="switching users needs root and setpriv (CI runs as root)",
)


@pytest.fixture
def node(fleetd):
    """A runner whose state dir other uids may pass through, with a port range of its own."""
    top = tempfile.mkdtemp(prefix="fleet-ports-")
    os.chmod(top, 0o711)
    state_dir = os.path.join(top, "state")
    low, high = port_range()
    runner = Runner(
        state_dir,
        Workers(),
        lambda: FleetClient(fleetd.url, "fln_test", timeout=10),
        "127.0.0.1",
        kill_grace_seconds=1.0,
        backoff_max_seconds=0.2,
        ports=PortAllocator(state_dir, low, high),
        output_settings=OutputSettings(interval_seconds=0.05, backoff_max_seconds=0.2),
    )
    runner.low = low
    yield runner
    runner.shutdown("test over", timeout=15, stop_instances=True)
    shutil.rmtree(top, ignore_errors=True)


def reported_ports(runner, task_id):
    """The `ports` of a task's heartbeat `instances` entry, once its first look at them is in."""
    for entry in runner.instances_report():
        if entry["task_id"] == task_id and all(p["state"] != "unknown" for p in entry["ports"]):
            return entry["ports"]
    return None


@needs_root
def test_the_instances_own_listener_reads_ok_and_another_uids_beside_it_makes_the_port_taken(
    node, fleetd
):
    wire = instance_assignment(
        "t-own",
        [PY, "-c", HTTP_SERVER],
        instance_id="p-own",
        restart="never",
        ports=[{"port": 8000, "protocol": "http"}],
    )
    wire["run_as"] = OWNER
    task = node.submit(wire)
    port = node.low
    wait_until(
        lambda: http_get(f"http://127.0.0.1:{port}/"), timeout=30, message="the instance's server"
    )
    wait_until(
        lambda: task.check_ports() == {port: PORT_OK}, timeout=30, message="its own listener"
    )
    assert wait_until(
        lambda: reported_ports(node, "t-own"), timeout=30, message="the heartbeat's figures"
    ) == [{"port": 8000, "host_port": port, "state": PORT_OK}]
    assert (
        node.get("t-own").worker.instance["ports"][0]["state"] == PORT_OK
    )  # the local API's worker record
    squatter = listen_as(
        SQUATTER_UID, "127.0.0.2", port
    )  # another tenant's server on another loopback address
    try:
        assert task.check_ports() == {port: PORT_TAKEN}
        assert task.worker.instance["ports"] == [
            {"port": 8000, "host_port": port, "protocol": "http", "state": PORT_TAKEN}
        ]
    finally:
        stop(squatter)
    assert task.check_ports() == {port: PORT_OK}


@needs_root
def test_a_port_its_instance_does_not_listen_on_reads_not_listening_until_another_uid_takes_it(
    node, fleetd
):
    wire = instance_assignment(
        "t-idle",
        [PY, "-c", hold(600)],
        instance_id="p-idle",
        ports=[{"port": 8000, "protocol": "http"}],
    )
    wire["run_as"] = OWNER
    task = node.submit(wire)
    fleetd.wait_for(lambda: fleetd.started.get("t-idle"), timeout=30, message="the start")
    port = node.low
    wait_until(
        lambda: task.check_ports() == {port: PORT_NOT_LISTENING},
        timeout=30,
        message="no listener yet",
    )
    squatter = listen_as(SQUATTER_UID, "0.0.0.0", port)
    try:
        assert task.check_ports() == {port: PORT_TAKEN}
        assert (
            wait_until(
                lambda: (
                    lambda ports: ports if ports and ports[0]["state"] == PORT_TAKEN else None
                )(reported_ports(node, "t-idle")),
                timeout=30,
                message="the heartbeat's figures",
            )[0]["host_port"]
            == port
        )
    finally:
        stop(squatter)
    assert task.check_ports() == {port: PORT_NOT_LISTENING}
