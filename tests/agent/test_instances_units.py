"""The pieces of instances on their own: the config keys, the `instance` of an assignment, the
container runtime's command lines and CDI detection, the restart back-off, the idle watch, the port
allocator."""

import json
import resource
import socket

import pytest

from agent.config import ConfigError, load_config
from agent.ports import NoFreePort, PortAllocator, listening
from agent.task.container import ContainerRuntime, cdi_has_nvidia, container_name, ulimit_flags
from agent.task.instance import Backoff, restarts_after
from agent.task.monitor import IdleWatch
from fleetwire.assignment import Assignment
from tests.agent.instance_support import instance_assignment, port_range


def test_ports_range_and_containers_command_come_from_the_file_or_the_environment(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text(
        '[ports]\nrange = "41000-41010"\n[containers]\ncommand = "podman --runtime runc"\n'
    )
    config = load_config(str(path), environ={})
    assert (
        config.ports_bounds == (41000, 41010)
        and config.containers_command == "podman --runtime runc"
    )
    config = load_config(
        str(path),
        environ={
            "FLEET_AGENT_PORTS_RANGE": "50000-50000",
            "FLEET_AGENT_CONTAINERS_COMMAND": "none",
        },
    )
    assert config.ports_bounds == (50000, 50000) and config.containers_command == "none"
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    defaults = load_config(str(empty), environ={})
    assert defaults.ports_bounds == (40000, 41000) and defaults.containers_command == ""


@pytest.mark.parametrize("value", ["40000", "41000-40000", "0-10", "1-65536", "a-b", "-5-10"])
def test_a_bad_ports_range_is_refused(tmp_path, value):
    path = tmp_path / "agent.toml"
    path.write_text(f'[ports]\nrange = "{value}"\n')
    with pytest.raises(ConfigError, match="ports.range"):
        load_config(str(path), environ={})


def test_an_unbalanced_containers_command_is_refused(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('[containers]\ncommand = "podman --root \'/x"\n')
    with pytest.raises(ConfigError, match="containers.command"):
        load_config(str(path), environ={})


def test_the_instance_of_an_assignment_is_validated_field_by_field():
    wire = instance_assignment(
        "t-1",
        [],
        image="localhost/app:1",
        restart="always",
        ports=[{"port": 8888, "protocol": "http"}, {"port": 22}],
        idle_stop={"gpu_util_below_percent": 5, "for_seconds": 600},
    )
    spec = Assignment.from_wire(wire).instance
    assert (spec.id, spec.restart, spec.ports, spec.image) == (
        "inst-1",
        "always",
        ((8888, "http"), (22, "tcp")),
        "localhost/app:1",
    )
    assert (spec.idle_below_percent, spec.idle_for_seconds, spec.volume_mount_path) == (
        5.0,
        600.0,
        "/workspace",
    )
    assert Assignment.from_wire(dict(wire, instance=None, command=["true"])).instance is None
    bad = [
        ({"id": ".."}, "instance.id"),
        ({"id": "a/b"}, "instance.id"),
        ({"restart": "sometimes"}, "restart"),
        ({"ports": [{"port": 80}, {"port": 80}]}, "twice"),
        ({"ports": [{"port": 70000}]}, "ports"),
        ({"ports": [{"port": 80, "protocol": "udp"}]}, "ports"),
        ({"volume_mount_path": "work"}, "mount"),
        ({"volume_mount_path": "/a:b"}, "mount"),
        ({"image": "-v /:/host"}, "image"),
        ({"idle_stop": {"gpu_util_below_percent": 5}}, "idle_stop"),
        ({"volume_bytes": -1}, "volume_bytes"),
    ]
    for change, message in bad:
        with pytest.raises(ValueError, match=message):
            Assignment.from_wire(dict(wire, instance=dict(wire["instance"], **change)))
    with pytest.raises(ValueError, match="command"):
        Assignment.from_wire(dict(wire, instance=dict(wire["instance"], image=None)))


def test_the_runtime_is_found_on_path_or_named_and_its_run_line_runs_as_the_user_with_no_privilege(
    tmp_path,
):
    found = {"podman": None, "docker": "/usr/bin/docker"}
    runtime = ContainerRuntime.detect("", which=found.get)
    assert (runtime.argv, runtime.name) == (["/usr/bin/docker"], "docker")
    assert ContainerRuntime.detect("", which=lambda name: None) is None
    assert ContainerRuntime.detect("none", which=found.get) is None
    named = ContainerRuntime.detect("/opt/podman/bin/podman --runtime runc", which=found.get)
    assert (named.argv, named.name) == (["/opt/podman/bin/podman", "--runtime", "runc"], "podman")
    argv = named.run_argv(
        container_name("team:nb", 3),
        "localhost/app:1",
        ["serve", "--now"],
        "/v/team:nb",
        "/workspace",
        {8888: 40001, 22: 40002},
        "/state/tasks/t.3/container.env",
        (61300, 61301),
        ["GPU-a", "GPU-b"],
        cdi=True,
    )
    assert argv == [
        "/opt/podman/bin/podman",
        "--runtime",
        "runc",
        "run",
        "--rm",
        "--name",
        "fleet-team_nb-3",
        "--pull=never",
        "--user",
        "61300:61301",
        "--security-opt=no-new-privileges",
        "--cap-drop=all",
        *ulimit_flags(),
        "--env-file",
        "/state/tasks/t.3/container.env",
        "-v",
        "/v/team:nb:/workspace",
        "-p",
        "40002:22/tcp",
        "-p",
        "40001:8888/tcp",
        "--device",
        "nvidia.com/gpu=GPU-a",
        "--device",
        "nvidia.com/gpu=GPU-b",
        "localhost/app:1",
        "serve",
        "--now",
    ]
    assert not any(arg in ("-e", "--env", "--privileged") for arg in argv)
    hard_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert ulimit_flags()[:2] == ["--ulimit", f"nofile={hard_nofile}:{hard_nofile}"]
    assert named.gpu_flags(["GPU-a"], cdi=False) == []
    assert runtime.gpu_flags(["GPU-a", "GPU-b"], cdi=False) == ["--gpus", '"device=GPU-a,GPU-b"']


def test_a_cdi_spec_for_nvidia_gpus_is_recognised(tmp_path):
    (tmp_path / "other.yaml").write_text("cdiVersion: 0.5.0\nkind: vendor.com/fpga\n")
    assert not cdi_has_nvidia([str(tmp_path), str(tmp_path / "missing")])
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    assert cdi_has_nvidia([str(tmp_path)])
    (tmp_path / "nvidia.yaml").unlink()
    (tmp_path / "nvidia.json").write_text(
        json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu"})
    )
    assert cdi_has_nvidia([str(tmp_path)])


def test_the_back_off_doubles_to_a_minute_and_starts_again_after_a_long_run():
    backoff = Backoff()
    assert [backoff.next(0.5) for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.next(61) == 1 and backoff.next(3) == 2
    limited = Backoff(limit=2)
    assert [limited.next(0.5), limited.next(0.5), limited.next(0.5)] == [
        1,
        2,
        None,
    ]  # the policy gives up
    assert limited.next(61) == 1  # a long run: the count starts again
    assert [
        restarts_after(p, o)
        for p in ("always", "on-failure", "never")
        for o in ("succeeded", "failed")
    ] == [True, True, False, True, False, False]


def test_the_idle_watch_needs_every_gpu_below_the_threshold_for_the_whole_time():
    watch = IdleWatch(5, 10)
    assert not watch.observe(0, [1, 2])
    assert not watch.observe(9, [1, 2])
    assert watch.observe(10, [1, 4.9])
    assert not watch.observe(
        11, [1, 5]
    )  # one GPU at the threshold: not idle, the count starts again
    assert not watch.observe(12, [1, None]) and not watch.observe(30, [])  # unknown is not idle
    assert not watch.observe(31, [0]) and watch.observe(41, [0])
    assert watch.reason().startswith("idle: GPU utilisation below 5% on every GPU for 10s")


def test_ports_are_kept_per_instance_never_shared_and_a_full_range_says_so(tmp_path):
    low, high = port_range(4)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", low))
        busy.listen()
        assert listening(low)
        ports = PortAllocator(str(tmp_path), low, high)
        assert ports.allocate("a", [8000, 9000]) == {8000: low + 1, 9000: low + 2}
    again = PortAllocator(str(tmp_path), low, high)  # read back from ports.json
    assert again.allocate("a", [8000]) == {8000: low + 1}  # 9000 is no longer declared: freed
    assert again.allocate("b", [80, 81]) == {80: low, 81: low + 2}
    with pytest.raises(NoFreePort, match=f"{low}-{high}"):
        again.allocate("c", [1, 2])
    again.release("a")
    assert again.allocate("c", [1]) == {1: low + 1} and again.get("a") == {}


def test_a_volume_fits_when_the_file_system_has_what_it_still_needs(tmp_path):
    from agent.task.volumes import Volumes

    volumes = Volumes(str(tmp_path))
    path = volumes.ensure("inst-1")
    with open(f"{path}/data", "wb") as fh:
        fh.write(b"x" * (1 << 20))
    used = volumes.used_bytes("inst-1")
    assert volumes.room_for("inst-1", 0) is None and volumes.room_for("inst-1", used) is None
    assert "does not fit on this host" in volumes.room_for("inst-1", 1 << 60)
