"""Provisioning fixtures: SSH test hosts, fleetd listening where the hosts reach it, a built
bundle."""

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.provision.hosts import SshLab
from tests.support import wait_until
from tests.support.http import Http
from tests.support.oidc_provider import OidcProvider, approve_device
from tests.support.server import FleetdProcess, fleetd_cmd, fleetd_init

REPO = Path(__file__).resolve().parent.parent.parent
FAST = {
    "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1",
    "FLEETD_NODE_TTL_SECONDS": "5",
    "FLEETD_NODE_GRACE_SECONDS": "2",
    "FLEETD_LIVENESS_SWEEP_SECONDS": "0.5",
    "FLEETD_DRAIN_CHECK_SECONDS": "0.5",
    "FLEETD_FAILOVER_GRACE_SECONDS": "2",
}
FLEET = "lab"


def missing_tools():
    """Why SSH test hosts cannot be made here, or ''."""
    if os.geteuid() != 0:
        return "SSH test hosts need root (network and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter", "ssh-keygen", "/usr/sbin/sshd"):
        if not shutil.which(tool):
            return f"{tool} is not installed (Debian: iproute2, util-linux, openssh-server)"
    try:
        from tests.provision.hosts import systemctl_stand_in

        systemctl_stand_in()
    except RuntimeError as exc:
        return str(exc)
    return ""


class BoundFleetd(FleetdProcess):
    """`fleetd serve --bind ADDRESS:0`: on the lab's bridge, where the test hosts reach it."""

    def __init__(self, data_dir, address, env=None):
        super().__init__(data_dir, env, bind=f"{address}:0")
        self.address = address


class Api(Http):
    """Admin calls to fleetd, and the look-ups the provisioning tests make."""

    def nodes(self):
        return self("GET", "/api/v1/nodes", expect=200).json()["items"]

    def node(self, node_id):
        resp = self("GET", f"/api/v1/nodes/{node_id}")
        return resp.json() if resp.status_code == 200 else None

    def join_tokens(self, fleet=FLEET):
        return self("GET", f"/api/v1/fleets/{fleet}/join-tokens", expect=200).json()["items"]

    def events(self, node_id):
        return self("GET", f"/api/v1/nodes/{node_id}/events", expect=200).json()["items"]

    def wait_status(self, node_id, status, timeout=60):
        return wait_until(
            lambda: (lambda n: n if n and n["status"] == status else None)(self.node(node_id)),
            timeout,
            interval=0.2,
            message=f"node {node_id} to be {status}",
        )


class Lab:
    """Test hosts plus a fleetd on their bridge with a fleet and an admin token."""

    def __init__(self, ssh_lab, fleetd, api):
        self.ssh = ssh_lab
        self.fleetd = fleetd
        self.api = api

    @property
    def hosts(self):
        return self.ssh.hosts

    def admin_token(self, name):
        """A new admin API token named `name` (a tool's own); returns {id, name, token}."""
        body = {"name": name, "role": "admin"}
        return self.api("POST", "/api/v1/tokens", expect=201, json=body).json()

    def sign_in(self, login):
        """Sign `login` in as an admin the way an operator does: `fleetd login --provider lab` at a
        real OpenID provider (started for this, and stopped once the session is saved), the
        device code approved at the provider's own pages. The session is saved in the lab's HOME
        (as every CLI call here reads it); returns its token."""
        provider = OidcProvider(self.ssh.root, {login: {"name": login, "groups": ["ops"]}})
        provider.start()
        try:
            self.api("PUT", "/api/v1/auth/providers/lab", expect=200, json=provider.provider_body())
            rule = {"provider": "lab", "claim": "groups", "contains": "ops", "role": "admin"}
            self.api("PUT", "/api/v1/auth/bindings", expect=200, json=[rule])
            env = {k: v for k, v in self.env().items() if k != "FLEETD_TOKEN"}
            proc = subprocess.Popen(
                fleetd_cmd("login", "--provider", "lab"),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            try:
                shown = proc.stdout.readline()
                where = re.search(r"Open (\S+) and enter the code", shown)
                assert where, shown
                approve_device(where.group(1), login)
                out, _ = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
            assert proc.returncode == 0 and f"as user:{login} (admin)" in out, shown + out
        finally:
            provider.kill()
        config = self.ssh.root / "home" / ".config" / "fleetd" / "config.toml"
        return re.search(r'^token = "([^"]+)"', config.read_text(), re.M).group(1)

    def env(self, **extra):
        """Environment for `fleetd bootstrap`: the admin token travels here, never in arguments."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETD_", "FLEET_AGENT_"))}
        env.update(
            FLEETD_URL=self.fleetd.url,
            FLEETD_TOKEN=self.api.token,
            HOME=str(self.ssh.root / "home"),
        )
        env.update(extra)
        return env

    def ssh_args(self):
        """How the CLI reaches the lab's hosts over SSH."""
        return [
            "--user",
            "root",
            "--key",
            str(self.ssh.client_key),
            "--known-hosts",
            str(self.ssh.known_hosts),
        ]

    def rollout(self, bundle, *extra):
        """`fleetd rollout start --json` of the lab's fleet to `bundle`, no canary; the
        CompletedProcess."""
        return self.fleetd_cli(
            "rollout",
            "start",
            "--fleet",
            FLEET,
            "--bundle",
            str(bundle.path),
            "--canary",
            "0",
            *self.ssh_args(),
            "--wait-timeout",
            "60",
            "--drain-deadline",
            "60",
            "--json",
            *extra,
        )

    def bootstrap_args(self, bundle, *hosts, extra=()):
        """Arguments of `fleetd bootstrap`; bundle None: no --bundle (the CLI builds one)."""
        return [
            "bootstrap",
            *[h.address for h in hosts],
            "--fleet",
            FLEET,
            *self.ssh_args(),
            *(["--bundle", str(bundle.path)] if bundle is not None else []),
            "--devices-backend",
            "fake:/opt/fake-gpus/shape.json",
            "--wait-timeout",
            "90",
            "--drain-deadline",
            "60",
            "--json",
            *extra,
        ]

    def fleetd_cli(self, *args, timeout=300, env=None, cwd=None):
        """Run the `fleetd` CLI (with cwd: the fleetd of that source tree); returns the
        CompletedProcess."""
        return subprocess.run(
            fleetd_cmd(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env or self.env(),
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )

    def bootstrap(self, bundle, *hosts, extra=(), timeout=300, cwd=None, env=None):
        """`fleetd bootstrap --json` on hosts; returns (exit code, {address: result}, stderr)."""
        result = self.fleetd_cli(
            *self.bootstrap_args(bundle, *hosts, extra=extra), timeout=timeout, cwd=cwd, env=env
        )
        try:
            rows = json.loads(result.stdout)
        except ValueError:
            raise AssertionError(
                f"no JSON from fleetd bootstrap (exit {result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}"
            ) from None
        return result.returncode, {row["host"]: row for row in rows}, result.stderr


@pytest.fixture(scope="session")
def bundle(tmp_path_factory):
    """The offline bundle of this checkout, built once per test session."""
    why = missing_tools()
    if why:
        pytest.skip(why)
    from fleetd.provision.bundle import build_bundle

    return build_bundle(tmp_path_factory.mktemp("bundle"), source=REPO)


def copy_source(source):
    """A copy of this checkout's sources into directory `source`: what building a bundle reads."""
    # Every top-level package (fleetd, agent, fleetconf, ...) and what building needs.
    packages = sorted(
        p.name for p in REPO.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"
    )
    for name in (
        *packages,
        "setup.cfg",
        "pyproject.toml",
        "README.md",
        "templates",
        "constraints.txt",
    ):
        path = REPO / name
        if path.is_dir():
            shutil.copytree(
                path,
                source / name,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
            )
        elif path.exists():
            shutil.copy2(path, source / name)
    return source


def extract(archive, dest):
    """Extract a tar archive's regular files and folders under dest, on every Python fleetd
    supports: `extractall(filter=...)` came in 3.12 (and 3.10.12, 3.11.4), so a member that is a
    link, a device or a path leaving dest is refused here first, and the filter is added where it
    exists."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for member in members:
            parts = Path(member.name).parts
            if (
                not (member.isfile() or member.isdir())
                or Path(member.name).is_absolute()
                or ".." in parts
            ):
                raise ValueError(f"{archive}: refusing to extract {member.name!r}")
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **safe)  # nosec B202  # every member checked above


@pytest.fixture(scope="session")
def next_bundle(tmp_path_factory, bundle):
    """A bundle of the same code with a higher version, for upgrades (dependencies from
    `bundle`)."""
    from fleetd.provision.bundle import build_bundle

    source = copy_source(tmp_path_factory.mktemp("next-source"))
    init = source / "fleetd" / "__init__.py"
    init.write_text(
        re.sub(r'__version__ = "([^"]+)"', r'__version__ = "\1.post1"', init.read_text())
    )
    wheels = tmp_path_factory.mktemp("deps")
    extract(bundle.path, wheels)
    links = [str(p) for p in wheels.glob("*/wheels")]
    return build_bundle(tmp_path_factory.mktemp("next-bundle"), source=source, find_links=links)


@pytest.fixture
def lab_factory(tmp_path):
    """lab_factory(shapes) -> Lab: test hosts (one per fake-GPU shape) and a fleetd they reach."""
    why = missing_tools()
    if why:
        pytest.skip(why)
    made = []

    def make(shapes, env=None):
        ssh_lab = SshLab(tmp_path / f"lab{len(made)}")
        made.append((ssh_lab, None))
        ssh_lab.open()
        (ssh_lab.root / "home").mkdir()
        ssh_lab.add_hosts(shapes)
        data_dir = ssh_lab.root / "fleetd-data"
        token = fleetd_init(data_dir)
        fleetd = BoundFleetd(data_dir, ssh_lab.gateway, dict(FAST, **(env or {})))
        made[-1] = (ssh_lab, fleetd)
        fleetd.start()
        api = Api(fleetd.url, token)
        api("POST", "/api/v1/fleets", expect=201, json={"name": FLEET})
        return Lab(ssh_lab, fleetd, api)

    yield make
    errors = []
    for ssh_lab, fleetd in made:
        try:
            ssh_lab.close()
        except RuntimeError as exc:
            errors.append(str(exc))
        if fleetd is not None:
            fleetd.kill()
    assert not errors, errors


def python_for_tools():
    """The Python whose bin/ holds ansible-playbook, ansible-lint (this venv)."""
    return Path(sys.executable).parent


BROKEN_AGENT = "fleet-agent: this build is broken on purpose"


def _break_agent(wheel):
    """The fleetd wheel `wheel` (bytes) with an agent that exits at once when it is run, saying
    BROKEN_AGENT (`fleet-agent --help`, the installer's check, still works: it breaks on start)."""
    import io
    import zipfile

    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(wheel)) as old,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as new,
    ):
        for info in old.infolist():
            data = old.read(info)
            if info.filename == "agent/__main__.py":
                data = (
                    "import sys\n"
                    f"if sys.argv[1:2] == ['run']:\n    raise SystemExit({BROKEN_AGENT!r})\n"
                ).encode() + data
            new.writestr(info, data)
    return out.getvalue()


def repack_bundle(source, directory, drop_pip=False, break_agent=False):
    """A copy of bundle `source` with the same version and another SHA-256 (a rebuilt bundle): a
    note added at its top; with drop_pip, its pip wheel left out (and out of its manifest), so that
    the controller accepts it and the install on the host fails; with break_agent, an agent that
    installs and then exits at once when run (BROKEN_AGENT), so that its restart fails."""
    import hashlib
    import io
    import tarfile

    from fleetd.provision.bundle import read_bundle

    directory.mkdir(parents=True, exist_ok=True)
    target = directory / source.path.name
    top = f"fleet-agent-bundle-{source.version}"
    with tarfile.open(source.path, "r:gz") as old:
        members = [(m, old.extractfile(m).read() if m.isfile() else None) for m in old.getmembers()]
    changed = {}
    for member, data in members:
        name = member.name.rsplit("/", 1)[-1]
        if break_agent and name.startswith("fleetd-") and name.endswith(".whl"):
            changed[name] = _break_agent(data)
    with tarfile.open(target, "w:gz") as new:
        for member, data in members:
            name = member.name.rsplit("/", 1)[-1]
            if drop_pip and member.isfile() and name.startswith("pip-") and name.endswith(".whl"):
                continue
            if name in changed:
                data = changed[name]
                member.size = len(data)
            if member.name == f"{top}/manifest.json" and (drop_pip or changed):
                manifest = json.loads(data)
                manifest["wheels"] = {
                    k: v
                    for k, v in manifest["wheels"].items()
                    if not (drop_pip and k.startswith("pip-"))
                }
                manifest["wheels"].update(
                    {k: hashlib.sha256(v).hexdigest() for k, v in changed.items()}
                )
                data = json.dumps(manifest, indent=2, sort_keys=True).encode()
                member.size = len(data)
            new.addfile(member, io.BytesIO(data) if data is not None else None)
        note = (
            f"rebuilt from {source.sha256}{' without pip' if drop_pip else ''}"
            f"{' with a broken agent' if break_agent else ''}\n".encode()
        )
        info = tarfile.TarInfo(f"{top}/REBUILT")
        info.size, info.mode = len(note), 0o644
        new.addfile(info, io.BytesIO(note))
    return read_bundle(target)
