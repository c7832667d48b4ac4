"""SSH for provisioning: host specs, strict host-key checking, Fabric connections, remote commands.

Fabric's `Connection` accepts any host key it has not seen (paramiko's auto-add policy) and reads
no known_hosts file; here every connection, the bastion's included, loads known_hosts and
replaces that policy with `StrictHostKeyPolicy`: an unknown key is refused before
authentication, so no command ever runs on such a host, unless trust on first use was asked for
explicitly, and then the key is recorded. A changed key is always refused (paramiko raises
`BadHostKeyException` before the policy is consulted).
"""

import base64
import dataclasses
import hashlib
import os
import re
import select
import shlex
import socket
import threading
import time
from pathlib import Path

import paramiko
from fabric import Connection

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
_SPEC_RE = re.compile(
    r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:\s@]+)(?::(?P<port>\d{1,5}))?$"
)


class SshError(Exception):
    """Connecting or running a command over SSH failed; the message is meant for the operator."""


class HostKeyRejected(SshError):
    """The host's key is unknown or does not match known_hosts; nothing was sent to the host."""


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """[user@]host[:port] from the command line; user and port may come from defaults."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text):
        """Parse `[user@]host[:port]` (IPv6 addresses in brackets)."""
        match = _SPEC_RE.match(text.strip())
        if not match:
            raise ValueError(f"{text!r} is not [user@]host[:port]")
        port = int(match.group("port")) if match.group("port") else None
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"{text!r}: port out of range")
        return cls(host=match.group("host").strip("[]"), user=match.group("user"), port=port)

    def __str__(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{host}{port}"


def fingerprint(key):
    """OpenSSH-style SHA256 fingerprint of a host key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class StrictHostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys; with `accept_new`, trust on first use and record the key."""

    def __init__(self, known_hosts, accept_new=False, lock=None):
        self.known_hosts = Path(known_hosts)
        self.accept_new = accept_new
        self.lock = lock or threading.Lock()

    def missing_host_key(self, client, hostname, key):
        if not self.accept_new:
            raise HostKeyRejected(
                f"host key of {hostname} is not in {self.known_hosts} ({key.get_name()} "
                f"{fingerprint(key)}); "
                "refused before logging in. Check the fingerprint with the host's owner, then add "
                "it to known_hosts, or run again with --accept-new-host-keys to trust it on first "
                "use"
            )
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with self.lock:
            self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as fh:
                fh.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)


@dataclasses.dataclass
class SshOptions:
    """How to reach hosts: defaults for user and port, keys, bastion, known_hosts, sudo."""

    user: str | None = None
    port: int | None = None  # None: ~/.ssh/config, else 22
    key_filenames: tuple = ()
    jump: HostSpec | None = None
    known_hosts: str = DEFAULT_KNOWN_HOSTS
    accept_new_host_keys: bool = False
    connect_timeout: float = 15.0
    sudo: bool = False
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def known_hosts_path(self):
        return Path(os.path.expanduser(self.known_hosts))


def _describe_connect_error(spec, exc):
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyRejected(
            f"host key of {exc.hostname} CHANGED: known_hosts has {exc.expected_key.get_name()} "
            f"{fingerprint(exc.expected_key)}, the host offered {exc.key.get_name()} "
            f"{fingerprint(exc.key)}; "
            "refused (someone may be intercepting the connection, or the host was reinstalled: "
            "then remove the old key from known_hosts after checking the new one)"
        )
    if isinstance(exc, HostKeyRejected):
        return exc
    if isinstance(exc, paramiko.AuthenticationException):
        return SshError(f"authentication to {spec} failed: {exc}")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return SshError(f"cannot connect to {spec}: timed out")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return SshError(f"cannot connect to {spec}: {exc.strerror or 'connection refused'}")
    if isinstance(exc, OSError):
        return SshError(f"cannot connect to {spec}: {exc.strerror or exc}")
    return SshError(f"SSH to {spec} failed: {exc}")


class Remote:
    """One open SSH connection to a host; runs commands with optional stdin and a time limit."""

    def __init__(self, spec, options):
        self.spec = spec
        self.options = options
        self.conn = None

    def _connection(self, spec, gateway=None):
        kwargs: dict[str, object] = {
            "look_for_keys": not self.options.key_filenames,
            "allow_agent": True,
        }
        if self.options.key_filenames:
            kwargs["key_filename"] = [os.path.expanduser(k) for k in self.options.key_filenames]
        conn = Connection(
            spec.host,
            user=spec.user or self.options.user,
            port=spec.port or self.options.port,
            connect_timeout=int(self.options.connect_timeout),
            connect_kwargs=kwargs,
            gateway=gateway if gateway is not None else False,
        )
        # Fabric's default would accept any key: replace it before anything connects.
        conn.client.set_missing_host_key_policy(
            StrictHostKeyPolicy(
                self.options.known_hosts_path, self.options.accept_new_host_keys, self.options.lock
            )
        )
        if os.path.isfile(SYSTEM_KNOWN_HOSTS):
            conn.client.load_system_host_keys(SYSTEM_KNOWN_HOSTS)
        path = self.options.known_hosts_path
        if path.is_file():
            conn.client.get_host_keys().load(str(path))
        return conn

    def open(self):
        """Connect (through the bastion if any); raises HostKeyRejected or SshError."""
        gateway = self._connection(self.options.jump) if self.options.jump else None
        self.conn = self._connection(self.spec, gateway)
        try:
            self.conn.open()
        except (
            Exception
        ) as exc:  # paramiko raises many unrelated types; each becomes one readable message
            self.close()
            target = (
                self.options.jump if gateway is not None and not gateway.is_connected else self.spec
            )
            raise _describe_connect_error(target, exc) from None
        return self

    def _connected(self):
        """The connection open() made (every command comes after it: Remote(...).open(), or
        `with`)."""
        if self.conn is None:
            raise SshError(f"{self.spec}: not connected")
        return self.conn

    def close(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except (OSError, paramiko.SSHException, EOFError):
                pass
            gateway = self.conn.gateway
            if isinstance(gateway, Connection):
                try:
                    gateway.close()
                except (OSError, paramiko.SSHException, EOFError):
                    pass

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    def privileged(self, command):
        """`command` as root: prefixed with non-interactive sudo when --sudo was given."""
        return f"sudo -n -- {command}" if self.options.sudo else command

    def run(self, command, stdin=None, timeout=300.0, check=True):
        """Run `command` (a shell command line); returns (exit code, stdout, stderr)."""
        try:
            chan = self._connected().transport.open_session(timeout=self.options.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SshError(f"{self.spec}: cannot open a session: {exc}") from None
        out, err = bytearray(), bytearray()
        try:
            chan.exec_command(command)  # nosec B601  # fleetd's own command lines; callers shlex.quote every value in them
            if stdin is not None:
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            chan.shutdown_write()
            deadline = time.monotonic() + timeout
            # Bounded by the deadline; the count only guards against a clock that stands still.
            for _ in range(50_000_000):
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if (
                    chan.exit_status_ready()
                    and not chan.recv_ready()
                    and not chan.recv_stderr_ready()
                ):
                    break
                if time.monotonic() > deadline:
                    raise SshError(f"{self.spec}: command did not finish within {timeout:.0f}s")
                if not got:
                    select.select([chan], [], [], 0.02)
                    time.sleep(0.005)
            code = chan.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SshError(f"{self.spec}: connection lost: {exc}") from None
        finally:
            chan.close()
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        if check and code != 0:
            detail = (stderr.strip() or stdout.strip()).splitlines()[-5:]
            if self.options.sudo and "sudo:" in stderr and "password" in stderr:
                detail.append("(--sudo needs passwordless sudo for this user: sudo -n)")
            raise SshError(f"`{_short(command)}` exited {code}: " + " | ".join(detail))
        return code, stdout, stderr

    def run_script(
        self, text, args=(), privileged=True, stdin_extra=None, timeout=300.0, check=True
    ):
        """Run a shell script sent on stdin (`sh -s -- ARGS`): nothing lands on disk, args are
        quoted."""
        command = "sh -s -- " + " ".join(shlex.quote(str(a)) for a in args)
        if privileged:
            command = self.privileged(command)
        return self.run(
            command,
            stdin=text if stdin_extra is None else text + stdin_extra,
            timeout=timeout,
            check=check,
        )

    def put(self, local_path, remote_path):
        """Upload a file over SFTP."""
        try:
            sftp = self._connected().sftp()
            sftp.put(str(local_path), remote_path)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise SshError(
                f"{self.spec}: upload of {Path(local_path).name} failed: {exc}"
            ) from None

    def put_text(self, text, remote_path, mode=0o600):
        """Write a small text file over SFTP with `mode`."""
        try:
            sftp = self._connected().sftp()
            with sftp.open(remote_path, "w") as fh:
                fh.chmod(mode)
                fh.write(text.encode())
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise SshError(f"{self.spec}: writing {remote_path} failed: {exc}") from None


def _short(command, limit=80):
    return command if len(command) <= limit else command[: limit - 3] + "..."
