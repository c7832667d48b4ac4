"""Containers for instances: which runtime runs them (podman, else docker), whether it works, and
its command lines.

An instance with an `image` runs as ``<containers command> run --rm --name fleet-<instance
id>-<epoch>
...`` in the foreground, under the same supervisor as a host process: the runtime's client is the
process the agent watches, and the container's output reaches the instance's output files
through it. The client runs as root with the agent's own fixed environment (`client_env`), never
anything of the spec's: a CONTAINERS_CONF, PATH, LD_PRELOAD or CONTAINER_HOST in a spec would
otherwise steer the root client. The spec's variables and the injected ones reach the container
through an env file (`write_env_file`: 0600 root in the root-owned task directory, removed once
the container exists), so that no value shows on a command line or in the client's environment.
The container runs as the task's uid (`--user uid:gid`), with no-new-privileges and every
capability dropped, with the host's own limit on open files (`ulimit_flags`), which podman's
defaults exceed on hosts with a low hard RLIMIT_NOFILE, and the task's bounds (`limit_flags`): its
pid limit (--pids-limit, and RLIMIT_NPROC to match) and its memory (--memory, no swap), the spec's
or its fleet's defaults. The runtime puts the container's processes in a cgroup of its own, not the
task's, so it is the runtime that bounds them.

A stop also asks the runtime to stop and remove the container by name, since SIGKILL to the
client alone would leave the container running. GPUs are handed in as CDI devices
(``--device nvidia.com/gpu=<uuid>``) when a CDI spec for NVIDIA GPUs is installed, else with
docker's ``--gpus``.
"""

import json
import logging
import os
import pwd
import re
import resource
import shlex
import shutil
import subprocess
import time

from agent.procfs import find_processes, read_command, read_pid_max
from agent.state import write_private
from fleetwire.assignment import runtime_arg_error

log = logging.getLogger("agent.runner")

RUNTIMES = ("podman", "docker")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
CDI_NVIDIA_RE = re.compile(rb"""kind["']?\s*:\s*["']?nvidia\.com/gpu\b""")
MAX_CDI_FILES = 64
COMMAND_TIMEOUT_SECONDS = 60
PROBE_TIMEOUT_SECONDS = (
    15  # `<runtime> info` at start and on each detection: the heartbeat waits for it
)
PROBE_AGAIN_SECONDS = (
    30.0  # an image instance that finds the runtime unavailable asks again after this
)
NOT_FOUND_WORDS = ("no such image", "image not known", "not found", "no such object")
READY = "ready"
NO_RUNTIME = "unavailable: no container runtime (neither podman nor docker found)"
CLIENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_ENV_LINE_BYTES = 65535  # the runtimes read an env file line by line into a 64 KiB buffer
DOCKER_PROXY = "docker-proxy"


class ContainerError(Exception):
    """The runtime cannot do what was asked; the message says why (for the task's reason)."""


def container_name(instance_id, epoch):
    """fleet-<instance id>-<epoch>, with the characters a container name cannot hold (':') as
    '_'."""
    return f"fleet-{re.sub(r'[^A-Za-z0-9_.-]', '_', instance_id)}-{epoch}"


def client_env(environ=None):
    """The runtime client's environment: a fixed PATH, the agent's user's HOME, LANG=C.UTF-8 and the
    agent's XDG_RUNTIME_DIR where it has one; nothing else of the agent's, nothing of a task's."""
    environ = os.environ if environ is None else environ
    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir or "/"
    except KeyError:
        home = "/root" if os.geteuid() == 0 else "/"
    env = {"PATH": CLIENT_PATH, "HOME": home, "LANG": "C.UTF-8"}
    if environ.get("XDG_RUNTIME_DIR"):
        env["XDG_RUNTIME_DIR"] = environ["XDG_RUNTIME_DIR"]
    return env


def env_file_text(env):
    """The lines NAME=value of an env file; ValueError for what one line cannot carry."""
    lines = []
    for name in sorted(env):
        value = env[name]
        if not ENV_NAME_RE.fullmatch(name):
            raise ValueError(f"variable name {name!r} cannot go into a container")
        if any(char in value for char in "\n\r\0"):
            raise ValueError(
                f"variable {name} holds a line break or NUL, which a container's env file cannot "
                f"carry"
            )
        line = f"{name}={value}"
        if len(line.encode()) > MAX_ENV_LINE_BYTES:
            raise ValueError(
                f"variable {name} is longer than a container's env file line ({MAX_ENV_LINE_BYTES} "
                f"bytes)"
            )
        lines.append(line + "\n")
    return "".join(lines)


def write_env_file(path, env):
    """Write the container's variables to `path`, 0600 (the agent's alone); ValueError as
    env_file_text."""
    write_private(path, env_file_text(env))


def remove_env_file(path):
    """Remove an env file; quiet when it is gone already."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove %s: %s", path, exc)


def ulimit_flags(pids=None):
    """--ulimit for open files and processes at the host's own hard limits (nproc at most
    pid_max, as podman lowers its own to, and at most the task's pid limit `pids`): podman's
    defaults (1048576) exceed a low hard limit, which the container's start cannot raise
    (`error setting rlimit type 7`). podman and docker take both."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    pid_max = read_pid_max()
    for ceiling in (pid_max, pids):
        if ceiling and (nproc == resource.RLIM_INFINITY or nproc > ceiling):
            nproc = ceiling
    nofile, nproc = (-1 if limit == resource.RLIM_INFINITY else limit for limit in (nofile, nproc))
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def limit_flags(memory_bytes=None, pids=None):
    """The task's bounds as podman's and docker's flags: its pids (processes and threads of the
    container) and its memory, swap included (--memory-swap equal to --memory: none)."""
    flags = [f"--pids-limit={int(pids)}"] if pids else []
    if memory_bytes:
        flags += [f"--memory={int(memory_bytes)}", f"--memory-swap={int(memory_bytes)}"]
    return flags


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
    """A container runtime's command line (`argv`, e.g. ["podman", "--runtime", "runc"]) and its
    kind."""

    def __init__(self, argv, name):
        self.argv = list(argv)
        self.name = name  # "podman" or "docker": what the node's capabilities say
        self.env = client_env()
        self.status = None  # "ready" or "unavailable: <why>" from the last probe; None before one
        self._probed_at = (
            0.0  # time.monotonic() at the last probe (meaningless while status is None)
        )

    def __repr__(self):
        return f"ContainerRuntime({self.name}: {shlex.join(self.argv)})"

    @classmethod
    def detect(cls, setting, which=shutil.which):
        """The runtime `containers.command` names: "" looks for podman, then docker, on PATH; "none"
        is none."""
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
            log.warning(
                "containers.command %r: %s is not on PATH; instances with an image cannot run",
                setting,
                argv[0],
            )
            return None
        base = os.path.basename(program)
        return cls([program, *argv[1:]], "docker" if "docker" in base else "podman")

    @staticmethod
    def capability(runtime):
        """The node capability `containers` of `runtime` (None: there is none): "ready", or
        "unavailable: <why>" (probed once if it never was)."""
        if runtime is None:
            return NO_RUNTIME
        return runtime.status or runtime.probe()

    def probe(self, timeout=PROBE_TIMEOUT_SECONDS):
        """`<runtime> info`: "ready", or "unavailable: <its last words>"; kept as `status`."""
        try:
            code, _out, err = self._call(["info"], timeout=timeout)
        except ContainerError as exc:
            status = (
                f"unavailable: {' '.join(str(exc).split())[:300]}"  # one line, as fleetd takes it
            )
        else:
            words = [line.strip() for line in err.splitlines() if line.strip()]
            status = (
                READY
                if code == 0
                else (
                    f"unavailable: {self.name} info: "
                    f"{words[-1][-200:] if words else f'exit code {code}'}"
                )
            )
        if status != self.status:
            (log.info if status == READY else log.warning)("containers (%s): %s", self.name, status)
        self.status, self._probed_at = status, time.monotonic()
        return status

    def readiness(self):
        """The last probe's status; probed first when there was none, or it said unavailable a while
        ago."""
        if self.status is None or (
            self.status != READY and time.monotonic() - self._probed_at >= PROBE_AGAIN_SECONDS
        ):
            return self.probe()
        return self.status

    def run_argv(
        self,
        name,
        image,
        command,
        volume,
        mount_path,
        ports,
        env_file,
        user,
        gpus,
        cdi=None,
        extra=(),
        memory_bytes=None,
        pids=None,
    ):
        """`run` in the foreground as `user` ((uid, gid)): removed at its end, no privilege, the
        host's limits and the task's (`memory_bytes`, `pids`), its variables from `env_file`, its
        volume and ports, its GPUs. `extra`: the instance's runtime arguments (fleetwire's
        allow-list, checked again here), before the agent's own flags so that those win."""
        uid, gid = user
        for arg in extra:
            error = runtime_arg_error(arg)
            if error is not None:
                raise ContainerError(f"runtime argument refused: {error}")
        argv = [
            *self.argv,
            "run",
            *extra,
            "--rm",
            "--name",
            name,
            "--pull=never",
            "--user",
            f"{uid}:{gid}",
            "--security-opt=no-new-privileges",
            "--cap-drop=all",
            *ulimit_flags(pids),
            *limit_flags(memory_bytes, pids),
            "--env-file",
            env_file,
            "-v",
            f"{volume}:{mount_path}",
        ]
        for port, host_port in sorted(ports.items()):
            argv += ["-p", f"{host_port}:{port}/tcp"]
        argv += self.gpu_flags(gpus, cdi_has_nvidia() if cdi is None else cdi)
        return [*argv, image, *command]

    def gpu_flags(self, uuids, cdi):
        """How the GPUs reach the container: CDI devices, docker's --gpus, or nothing (said in the
        log)."""
        if not uuids:
            return []
        if cdi:
            return [arg for uuid in uuids for arg in ("--device", f"nvidia.com/gpu={uuid}")]
        if self.name == "docker":
            return ["--gpus", f'"device={",".join(uuids)}"']
        return []

    def _call(self, args, timeout=COMMAND_TIMEOUT_SECONDS):
        """(exit status, stdout, stderr) of one runtime command; ContainerError when it cannot run
        at all."""
        try:
            done = subprocess.run(
                [*self.argv, *args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ContainerError(f"{self.name} {args[0]}: {exc}") from None
        return (
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace").strip(),
        )

    def check_image(self, image):
        """ContainerError unless the host has `image` (nothing is pulled)."""
        code, _out, err = self._call(["image", "inspect", image])
        if code == 0:
            return
        if any(word in err.lower() for word in NOT_FOUND_WORDS):
            raise ContainerError(f"image {image} not found on this host")
        raise ContainerError(
            f"cannot inspect image {image} with {self.name}: {err[-300:] or f'exit code {code}'}"
        )

    def state(self, name):
        """The runtime's `State` of a container ({Status, Pid, ConmonPid (podman), ...}), or None
        when there is none of that name (or the runtime cannot say now)."""
        try:
            code, out, _err = self._call(
                ["container", "inspect", "--format", "{{json .State}}", name], timeout=30
            )
        except ContainerError:
            return None
        if code != 0:
            return None
        try:
            state = json.loads(out)
        except ValueError:
            return None
        return state if isinstance(state, dict) else None

    def forwarder_pids(self, name, state):
        """The processes that hold a container's published host ports open on the host: podman's
        conmon of it (rootful podman binds them there), docker's docker-proxy for its addresses."""
        if self.name == "podman":
            return [pid for pid in (state.get("ConmonPid"),) if isinstance(pid, int) and pid > 0]
        addresses = self._addresses(name)
        pids = []
        for pid in find_processes(DOCKER_PROXY) if addresses else ():
            words = read_command(pid).split()
            if any(
                words[i] == "-container-ip" and words[i + 1] in addresses
                for i in range(len(words) - 1)
            ):
                pids.append(pid)
        return pids

    def _addresses(self, name):
        try:
            code, out, _err = self._call(
                [
                    "container",
                    "inspect",
                    "--format",
                    "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                    name,
                ],
                timeout=30,
            )
        except ContainerError:
            return set()
        return set(out.split()) if code == 0 else set()

    def stop(self, name, grace):
        """Stop a container (SIGKILL after `grace`) and remove it; quiet when it is gone already."""
        try:
            self._call(
                ["stop", "-t", str(max(0, int(round(grace)))), name],
                timeout=grace + COMMAND_TIMEOUT_SECONDS,
            )
            self.remove(name)
        except ContainerError as exc:
            log.warning("container %s: %s", name, exc)

    def remove(self, name):
        """Remove a container, running or not; quiet when there is none of that name."""
        try:
            # podman's rm -f first waits 10 s for a stop; -t 0 kills at once, as docker's rm -f does
            code, _out, err = self._call(
                ["rm", "-f", *(["-t", "0"] if self.name == "podman" else []), name]
            )
        except ContainerError as exc:
            log.warning("container %s: %s", name, exc)
            return
        if (
            code != 0
            and "no such container" not in err.lower()
            and "no container with name" not in err.lower()
        ):
            log.warning("container %s: %s rm -f: %s", name, self.name, err[-300:])

    def writable_bytes(self, name):
        """Bytes the container's own writable layer holds (`inspect --size`: SizeRw), or None when
        it cannot be read now."""
        try:
            code, out, _err = self._call(
                ["container", "inspect", "--size", "--format", "{{.SizeRw}}", name], timeout=30
            )
        except ContainerError:
            return None
        value = out.strip()
        return int(value) if code == 0 and value.isdigit() else None

    def stats(self, name):
        """(cpu percent, memory percent) of a running container, or None when it cannot be read
        now."""
        try:
            code, out, _err = self._call(
                ["stats", "--no-stream", "--format", "{{.CPUPerc}} {{.MemPerc}}", name], timeout=30
            )
        except ContainerError:
            return None
        fields = out.strip().replace("%", "").split()
        if code != 0 or len(fields) != 2:
            return None
        try:
            return float(fields[0]), float(fields[1])
        except ValueError:
            return None
