"""Podman for the container tests, as root on this host, with no registry.

Podman runs here with runc and the cgroupfs manager (crun refuses hybrid cgroup hosts) and a
containers.conf without default ulimits (refused too); the file lives in the test's own directory
and reaches podman through CONTAINERS_CONF, so nothing under /etc changes. The test image is a
busybox-static root file system imported as localhost/fleet-test-busybox:latest. Where podman
cannot run at all (`podman info` fails, or it is not installed), the tests are skipped and say why.
"""

import os
import shutil
import subprocess
import tarfile

import pytest

IMAGE = "localhost/fleet-test-busybox:latest"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n"
BUSYBOX_APPLETS = ("sh", "httpd", "echo", "cat", "sleep", "ls", "env", "wget")


def podman_env(directory):
    """The environment podman gets in the tests: this process's, with CONTAINERS_CONF in
    `directory`."""
    conf = os.path.join(directory, "containers.conf")
    with open(conf, "w") as fh:
        fh.write(CONTAINERS_CONF)
    return dict(os.environ, CONTAINERS_CONF=conf)


def podman(env, *args, timeout=120, stdin=None):
    """One podman command -> CompletedProcess (output as bytes)."""
    return subprocess.run(
        [*PODMAN, *args], env=env, input=stdin, capture_output=True, timeout=timeout, check=False
    )


def _rootfs_tar(directory):
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox-static is not installed (scripts/setup.sh installs it)")
    with open(busybox, "rb") as fh:
        if b"/ld-linux" in fh.read(
            4096
        ):  # a dynamic busybox (Debian's 'busybox') names its loader early on
            pytest.skip(
                f"{busybox} is linked dynamically: the image needs busybox-static "
                f"(scripts/setup.sh)"
            )
    path = os.path.join(directory, "rootfs.tar")
    with tarfile.open(path, "w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        for name in ("tmp", "workspace"):
            entry = tarfile.TarInfo(name)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(entry)
    return path


def prepare_podman(directory):
    """The environment to run podman with, once `podman info` works and the test image is imported;
    pytest.skip with podman's own words where it cannot run."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (scripts/setup.sh installs it)")
    env = podman_env(directory)
    info = podman(env, "info", "--format", "{{.Host.OCIRuntime.Name}}")
    if info.returncode != 0:
        pytest.skip(
            f"podman cannot run on this host: {info.stderr.decode(errors='replace').strip()[-500:]}"
        )
    with open(_rootfs_tar(directory), "rb") as fh:
        imported = podman(env, "import", "-", IMAGE, stdin=fh.read())
    assert imported.returncode == 0, imported.stderr
    return env


def containers_named(env, name):
    """Names of the containers (running or not) called `name`."""
    listed = podman(env, "ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.Names}}")
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.decode().split()
