"""SSH test hosts: network namespaces on a private bridge, each with its own sshd, host key,
hostname, machine id and private mount namespace: /etc is an overlay of this machine's /etc
(so /etc/fleet-agent and /etc/machine-id are per host and can be created and removed), and
/etc/systemd/system, /opt, /var/lib, /var/log and /run are per-host directories. A `systemctl`
stand-in (docker-systemctl-replacement) replaces /usr/bin/systemctl, since no systemd runs as
PID 1 here, and each host has a fake-GPU shape at /opt/fake-gpus/shape.json.

Addresses come from 10.213.0.0/16, used only by these tests: one /24 per lab, claimed by
creating its bridge (an atomic operation), so that parallel test workers never collide.
Everything made here is removed by `close()`: every process of every namespace (by pid),
the namespaces and the bridge.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from tests.support import wait_until

SUBNET_PREFIX = "10.213"
SHAPES = Path(__file__).resolve().parent.parent / "fixtures" / "nvml"
BIND_DIRS = ("/opt", "/var/lib", "/var/log")  # per-host directories bound over these
SSHD = "/usr/sbin/sshd"
START_TIMEOUT = 20.0


def _run(*cmd, check=True, timeout=30):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


def systemctl_stand_in():
    """Path of the docker-systemctl-replacement script installed beside this Python."""
    candidates = [
        Path(sys.executable).parent / "systemctl3.py",
        Path(sys.executable).parent / "systemctl3",
    ]
    found = shutil.which("systemctl3.py") or shutil.which("systemctl3")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.exists():
            return path
    raise RuntimeError(
        "docker-systemctl-replacement is not installed (pip install docker-systemctl-replacement)"
    )


def _host_uuid(value, host_index):
    parts = value.split("-")
    if len(parts) >= 3:
        parts[-2] = f"{host_index:04x}"
        return "-".join(parts)
    return f"{value}-{host_index:04x}"


def write_shape(name, path, host_index):
    """Copy a fake-GPU shape with UUIDs made unique to this host."""
    data = json.loads((SHAPES / f"{name}.json").read_text())
    for gpu in data.get("gpus", []):
        if gpu.get("uuid"):
            gpu["uuid"] = _host_uuid(gpu["uuid"], host_index)
        for mig in gpu.get("mig_devices") or []:
            if isinstance(mig, dict) and mig.get("uuid"):
                mig["uuid"] = _host_uuid(mig["uuid"], host_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


class TestHost:
    """One test host: a network namespace, a private mount namespace and its sshd."""

    __test__ = False  # not a pytest test class

    def __init__(self, lab, index, shape):
        self.lab = lab
        self.index = index
        self.name = f"fpv{lab.octet}h{index}"
        self.hostname = f"gpu-host-{index}"
        self.address = f"{SUBNET_PREFIX}.{lab.octet}.{10 + index}"
        self.root = lab.root / self.name
        self.shape_name = shape
        self.sshd = None
        self.host_key = None
        self.sshd_log = self.root / "sshd.log"

    def source(self, name):
        """A per-host directory on this machine (bound or overlaid into the host)."""
        return self.root / name.strip("/").replace("/", "_")

    def path(self, inside):
        """The real path of what the host sees at `inside` (through its sshd's root; sshd must
        run)."""
        if self.sshd is None or self.sshd.poll() is not None:
            raise AssertionError(f"{self.name} has no sshd: its files cannot be seen")
        return Path(f"/proc/{self.sshd.pid}/root") / inside.lstrip("/")

    def setup(self):
        """Create the namespace, its link to the bridge and its private directories."""
        for name in (*BIND_DIRS, "etc_upper", "etc_work", "systemd_system"):
            self.source(name).mkdir(parents=True, exist_ok=True)
        (self.source("etc_upper") / "machine-id").write_text(uuid.uuid4().hex + "\n")
        write_shape(
            self.shape_name,
            self.source("/opt") / "fake-gpus" / "shape.json",
            self.index + 1 + self.lab.octet * 16,
        )
        _run(
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            self.hostname,
            "-f",
            str(self.root / "host_key"),
        )
        self.host_key = (self.root / "host_key.pub").read_text().split()[:2]
        veth = f"fpv{self.lab.octet}v{self.index}"
        # This lab owns the octet (it made the bridge): a namespace of that name is a crashed run's.
        _run("ip", "netns", "del", self.name, check=False)
        _run("ip", "netns", "add", self.name)
        self.lab.namespaces.append(self.name)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        _run("ip", "link", "set", veth, "master", self.lab.bridge, "up")
        ns = ("ip", "netns", "exec", self.name)
        _run(*ns, "ip", "addr", "add", f"{self.address}/24", "dev", "eth0")
        _run(*ns, "ip", "link", "set", "eth0", "up")
        _run(*ns, "ip", "link", "set", "lo", "up")
        _run(*ns, "ip", "route", "add", "default", "via", self.lab.gateway)
        self._write_sshd_config()
        return self

    def _write_sshd_config(self):
        config = [
            f"ListenAddress {self.address}:22",
            f"HostKey {self.root / 'host_key'}",
            f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.lab.client_key}.pub",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "LogLevel VERBOSE",
            "MaxStartups 100:30:200",
            "MaxSessions 50",
            "Subsystem sftp internal-sftp",
            # The login environment of a real host: the system PATH (sshd's default), nothing from
            # the tests.
            "SetEnv PIP_CONFIG_FILE=/dev/null",
        ]
        (self.root / "sshd_config").write_text("\n".join(config) + "\n")

    def start_sshd(self):
        """Start sshd in the namespace, in a private mount and UTS namespace; wait until it
        accepts."""
        mounts = [f"mount --bind {self.source(d)} {d}" for d in BIND_DIRS]
        mounts += [
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={self.source('etc_upper')},"
            f"workdir={self.source('etc_work')} /etc",
            f"mount --bind {self.source('systemd_system')} /etc/systemd/system",
            "mount -t tmpfs -o mode=0755 tmpfs /run",
            "mkdir -p /run/sshd",
            f"mount --bind {self.lab.systemctl} /usr/bin/systemctl",
            f"hostname {self.hostname}",
        ]
        script = " && ".join(mounts) + f" && exec {SSHD} -D -e -f {self.root / 'sshd_config'}"
        log = open(self.sshd_log, "ab")
        try:
            self.sshd = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.name,
                    "unshare",
                    "--mount",
                    "--uts",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    script,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        wait_until(self._accepts, START_TIMEOUT, message=f"sshd on {self.address}")
        return self

    def _accepts(self):
        if self.sshd.poll() is not None:
            raise AssertionError(f"sshd of {self.name} exited:\n{self.sshd_log.read_text()}")
        try:
            with socket.create_connection((self.address, 22), timeout=1) as sock:
                return sock.recv(64).startswith(b"SSH-")
        except OSError:
            return False

    def stop_sshd(self):
        """Stop sshd (the host becomes unreachable over SSH; its other processes keep running)."""
        if self.sshd is not None and self.sshd.poll() is None:
            self.sshd.send_signal(signal.SIGKILL)
            self.sshd.wait(timeout=10)
        self.sshd = None

    def exec(self, *cmd, timeout=30, check=False):
        """Run a command inside the host (its network, mount and UTS namespaces)."""
        if self.sshd is None or self.sshd.poll() is not None:
            raise AssertionError(f"{self.name} has no sshd to enter")
        # sshd is exec'd by `sh` in the unshared namespaces: its pid is the Popen pid's namespaces.
        return _run(
            "nsenter",
            "-t",
            str(self.sshd.pid),
            "-n",
            "-m",
            "-u",
            "--",
            *cmd,
            timeout=timeout,
            check=check,
        )

    def accepted_logins(self):
        """How many SSH logins the host's sshd accepted so far."""
        return self.sshd_log.read_text(errors="replace").count("Accepted publickey")

    def known_hosts_line(self):
        return f"{self.address} {self.host_key[0]} {self.host_key[1]}"

    def kill_all(self):
        """Kill every process in the namespace, by pid; bounded."""
        for _ in range(20):
            result = _run("ip", "netns", "pids", self.name, check=False)
            pids = [int(p) for p in result.stdout.split() if p.isdigit()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids), 2, 0.05)
            except AssertionError:
                pass  # zombies or new processes: the next round lists the namespace again
        if self.sshd is not None:
            self.sshd.poll()


class SshLab:
    """N test hosts on one bridge; `close()` removes everything it made."""

    def __init__(self, root):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.hosts = []
        self.namespaces = []
        self.bridge = None
        self.octet = None
        self.systemctl = systemctl_stand_in()
        self.client_key = self.root / "id_ed25519"
        self.known_hosts = self.root / "known_hosts"

    @property
    def gateway(self):
        """The address of this machine on the lab's bridge: where fleetd listens for the hosts."""
        return f"{SUBNET_PREFIX}.{self.octet}.1"

    def open(self):
        """Claim a /24 by creating its bridge; make the client key."""
        start = (os.getpid() % 250) + 1
        for step in range(250):
            octet = (start + step) % 250 + 1
            name = f"fpvbr{octet}"
            if (
                _run("ip", "link", "add", "name", name, "type", "bridge", check=False).returncode
                == 0
            ):
                self.bridge, self.octet = name, octet
                break
        if self.bridge is None:
            raise RuntimeError("no free test subnet in 10.213.0.0/16")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        _run(
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "fleetd-tests",
            "-f",
            str(self.client_key),
        )
        self.known_hosts.write_text("")
        return self

    def add_hosts(self, shapes, start=True, trust=True):
        """Create one host per shape name; start their sshd; record their keys in known_hosts."""
        made = []
        for shape in shapes:
            host = TestHost(self, len(self.hosts), shape)
            self.hosts.append(host)
            host.setup()
            made.append(host)
        if start:
            for host in made:
                host.start_sshd()
        if trust:
            self.trust(*made)
        return made

    def trust(self, *hosts):
        """Add the hosts' real keys to known_hosts."""
        with open(self.known_hosts, "a") as fh:
            for host in hosts:
                fh.write(host.known_hosts_line() + "\n")

    def close(self):
        """Kill every process of every namespace, delete the namespaces and the bridge."""
        errors = []
        for host in self.hosts:
            try:
                host.kill_all()
            except (OSError, subprocess.SubprocessError) as exc:
                errors.append(f"{host.name}: {exc}")
        for name in self.namespaces:
            result = _run("ip", "netns", "del", name, check=False)
            if result.returncode != 0 and "No such file" not in result.stderr:
                errors.append(f"ip netns del {name}: {result.stderr.strip()}")
        self.namespaces = []
        if self.bridge:
            _run("ip", "link", "del", self.bridge, check=False)
            self.bridge = None
        if errors:
            raise RuntimeError("test host clean-up: " + "; ".join(errors))
