"""An instance's extra container runtime arguments: only those of the allow-list, before the agent's
own flags (so that --user, --cap-drop and its ulimits win), checked again on the node."""

import pytest

from agent.task.container import ContainerError, ContainerRuntime
from fleetwire.assignment import AssignedInstance, runtime_arg_error

ALLOWED = [
    "--shm-size=1g",
    "--ulimit=memlock=-1:-1",
    "--init",
    "--workdir=/srv/app",
    "--entrypoint=/bin/sh",
    "--hostname=box-1",
]
HOSTILE = [
    "--privileged",
    "--cap-add=SYS_ADMIN",
    "--device=/dev/mem",
    "-v=/:/host",
    "--volume=/:/host",
    "--network=host",
    "--pid=host",
    "--user=0",
    "--security-opt=seccomp=unconfined",
    "--ulimit=nofile=1:1",
    "--workdir=/../etc",
    "--entrypoint=sh;reboot",
    "--init=true",
    "--shm-size=1g --privileged",
    "--hostname=a b",
    "--mount=type=bind,src=/,dst=/h",
    "--userns=host",
    "--ipc=host",
    "",
]


@pytest.mark.parametrize("arg", ALLOWED)
def test_allowed_arguments_pass(arg):
    assert runtime_arg_error(arg) is None


@pytest.mark.parametrize("arg", HOSTILE)
def test_arguments_that_reach_the_host_are_refused(arg):
    assert runtime_arg_error(arg) is not None


def test_the_arguments_go_before_the_agents_own_flags_and_a_bad_one_is_refused_on_the_node():
    runtime = ContainerRuntime(["podman"], "podman")
    argv = runtime.run_argv(
        "fleet-x-1",
        "localhost/app:1",
        ["serve"],
        "/v/x",
        "/workspace",
        {},
        "/t/env",
        (61300, 61300),
        [],
        cdi=False,
        extra=("--shm-size=2g", "--init"),
    )
    assert argv[:4] == ["podman", "run", "--shm-size=2g", "--init"]
    assert argv.index("--user") > 3 and argv[-2:] == ["localhost/app:1", "serve"]
    with pytest.raises(ContainerError, match="runtime argument refused"):
        runtime.run_argv(
            "fleet-x-1",
            "localhost/app:1",
            [],
            "/v/x",
            "/workspace",
            {},
            "/t/env",
            (1, 1),
            [],
            cdi=False,
            extra=("--privileged",),
        )


def test_the_wire_takes_allowed_arguments_for_an_image_only():
    spec = {
        "id": "i",
        "name": "n",
        "restart": "never",
        "ports": [],
        "volume_bytes": 0,
        "image": "localhost/a:1",
    }
    assert AssignedInstance.from_wire(dict(spec, runtime_args=["--init"])).runtime_args == (
        "--init",
    )
    with pytest.raises(ValueError, match="runtime_args"):
        AssignedInstance.from_wire(dict(spec, runtime_args=["--privileged"]))
    with pytest.raises(ValueError, match="image only"):
        AssignedInstance.from_wire(dict(spec, image=None, runtime_args=["--init"]))


def test_the_documents_pattern_says_what_the_check_says():
    import re

    from fleetwire.assignment import RUNTIME_ARG_PATTERN

    for arg in ALLOWED + HOSTILE:
        assert (re.match(RUNTIME_ARG_PATTERN, arg) is not None) == (
            runtime_arg_error(arg) is None
        ), arg
