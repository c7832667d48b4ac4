"""Containers for instances: which runtime runs them (podman, else docker), and its command lines.

An instance with an `image` runs as ``<containers command> run --rm --name fleet-<instance id>-<epoch>
...`` in the foreground, under the same supervisor as a host process: the runtime's client is the
process the agent watches, and the container's output reaches the instance's output files
through it. Variables go in as ``-e NAME`` (the value from the client's environment), so that no
value appears on a command line. A stop also asks the runtime to stop and remove the container by
name, since SIGKILL to the client alone would leave the container running. GPUs are handed in
as CDI devices (``--device nvidia.com/gpu=<uuid>``) when a CDI spec for NVIDIA GPUs is
installed, else with docker's ``--gpus``.
"""

import logging
import os
import re
import shlex
import shutil
import subprocess

log = logging.getLogger("agent.runner")

RUNTIMES = ("podman", "docker")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
CDI_NVIDIA_RE = re.compile(rb"""kind["']?\s*:\s*["']?nvidia\.com/gpu\b""")
MAX_CDI_FILES = 64
COMMAND_TIMEOUT_SECONDS = 60
NOT_FOUND_WORDS = ("no such image", "image not known", "not found", "no such object")


class ContainerError(Exception):
    """The runtime cannot do what was asked; the message says why (for the task's reason)."""


def container_name(instance_id, epoch):
    """fleet-<instance id>-<epoch>, with the characters a container name cannot hold (':') as '_'."""
    return f"fleet-{re.sub(r'[^A-Za-z0-9_.-]', '_', instance_id)}-{epoch}"


def client_env(task_env, environ=None):
    """The runtime client's environment: the agent's own (CONTAINERS_CONF, DOCKER_HOST, ...) without its
    FLEET_AGENT_* settings, with the task's variables over it."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if not k.startswith("FLEET_AGENT_")}
    env.update(task_env)
    return env


def cdi_has_nvidia(dirs=CDI_DIRS):
    """True when a CDI spec in `dirs` declares the kind nvidia.com/gpu."""
    looked = 0
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".yaml", ".yml", ".json")) or looked >= MAX_CDI_FILES:
                continue
            looked += 1
            try:
                with open(os.path.join(directory, name), "rb") as fh:
                    if CDI_NVIDIA_RE.search(fh.read(1 << 20)):
                        return True
            except OSError:
                continue
    return False


class ContainerRuntime:
    """A container runtime's command line (`argv`, e.g. ["podman", "--runtime", "runc"]) and its kind."""

    def __init__(self, argv, name):
        self.argv = list(argv)
        self.name = name  # "podman" or "docker": what the node's capabilities say

    def __repr__(self):
        return f"ContainerRuntime({self.name}: {shlex.join(self.argv)})"

    @classmethod
    def detect(cls, setting, which=shutil.which):
        """The runtime `containers.command` names: "" looks for podman, then docker, on PATH; "none" is none."""
        setting = (setting or "").strip()
        if setting.lower() == "none":
            return None
        if not setting:
            for name in RUNTIMES:
                found = which(name)
                if found:
                    return cls([found], name)
            return None
        argv = shlex.split(setting)
        program = which(argv[0]) if "/" not in argv[0] else argv[0]
        if not program:
            log.warning("containers.command %r: %s is not on PATH; instances with an image cannot run", setting,
                        argv[0])
            return None
        base = os.path.basename(program)
        return cls([program, *argv[1:]], "docker" if "docker" in base else "podman")

    def run_argv(self, name, image, command, volume, mount_path, ports, env_names, gpus, cdi=None):
        """`run` in the foreground: removed at its end, its volume and ports, its variables by name, its GPUs."""
        argv = [*self.argv, "run", "--rm", "--name", name, "--pull=never", "-v", f"{volume}:{mount_path}"]
        for port, host_port in sorted(ports.items()):
            argv += ["-p", f"{host_port}:{port}/tcp"]
        for env_name in sorted(env_names):
            argv += ["-e", env_name]
        argv += self.gpu_flags(gpus, cdi_has_nvidia() if cdi is None else cdi)
        return [*argv, image, *command]

    def gpu_flags(self, uuids, cdi):
        """How the GPUs reach the container: CDI devices, docker's --gpus, or nothing (said in the log)."""
        if not uuids:
            return []
        if cdi:
            return [arg for uuid in uuids for arg in ("--device", f"nvidia.com/gpu={uuid}")]
        if self.name == "docker":
            return ["--gpus", f'"device={",".join(uuids)}"']
        return []

    def _call(self, args, env, timeout=COMMAND_TIMEOUT_SECONDS):
        """(exit status, stdout, stderr) of one runtime command; ContainerError when it cannot run at all."""
        try:
            done = subprocess.run([*self.argv, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ContainerError(f"{self.name} {args[0]}: {exc}") from None
        return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace").strip()

    def check_image(self, image, env):
        """ContainerError unless the host has `image` (nothing is pulled)."""
        code, _out, err = self._call(["image", "inspect", image], env)
        if code == 0:
            return
        if any(word in err.lower() for word in NOT_FOUND_WORDS):
            raise ContainerError(f"image {image} not found on this host")
        raise ContainerError(f"cannot inspect image {image} with {self.name}: {err[-300:] or f'exit code {code}'}")

    def stop(self, name, grace, env):
        """Stop a container (SIGKILL after `grace`) and remove it; quiet when it is gone already."""
        try:
            self._call(["stop", "-t", str(max(0, int(round(grace)))), name], env, timeout=grace + COMMAND_TIMEOUT_SECONDS)
            self.remove(name, env)
        except ContainerError as exc:
            log.warning("container %s: %s", name, exc)

    def remove(self, name, env):
        """Remove a container, running or not; quiet when there is none of that name."""
        try:
            # podman's rm -f first waits 10 s for a stop; -t 0 kills at once, as docker's rm -f does
            code, _out, err = self._call(["rm", "-f", *(["-t", "0"] if self.name == "podman" else []), name], env)
        except ContainerError as exc:
            log.warning("container %s: %s", name, exc)
            return
        if code != 0 and "no such container" not in err.lower() and "no container with name" not in err.lower():
            log.warning("container %s: %s rm -f: %s", name, self.name, err[-300:])

    def stats(self, name, env):
        """(cpu percent, memory percent) of a running container, or None when it cannot be read now."""
        try:
            code, out, _err = self._call(["stats", "--no-stream", "--format", "{{.CPUPerc}} {{.MemPerc}}", name], env,
                                         timeout=30)
        except ContainerError:
            return None
        fields = out.strip().replace("%", "").split()
        if code != 0 or len(fields) != 2:
            return None
        try:
            return float(fields[0]), float(fields[1])
        except ValueError:
            return None
