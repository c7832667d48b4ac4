"""Real `fleetd` processes on loopback (tests/support/server.py, whose fixtures tests/conftest.py
exposes) and a PostgreSQL server for the tests that need one."""

import glob
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile

import pytest

# Imported from here by tests and benches (and test_cli_instances.py takes the fixtures from here).
from tests.support.http import Http  # noqa: F401
from tests.support.server import (  # noqa: F401
    FleetdProcess,
    admin,
    data_dir,
    fleetd_cmd,
    fleetd_init,
    server,
    server_factory,
)


def _pg_bin(name):
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    return found


def _as_postgres(args):
    """Run a PostgreSQL tool as the postgres user when we are root (initdb refuses root)."""
    if os.geteuid() == 0:
        # runuser is in /usr/sbin (util-linux): found there even on a PATH without the sbin
        # directories
        runuser = (
            shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin") or "runuser"
        )
        return [runuser, "-u", "postgres", "--", *args]
    return args


@pytest.fixture(scope="session")
def postgres_url():
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries are not installed (scripts/setup.sh installs them)")
    # Not under pytest's tmp dir: that is private to root, and the server runs as postgres.
    base = pathlib.Path(tempfile.mkdtemp(prefix="fleetd-pg-"))
    data = base / "data"
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(
        _as_postgres([initdb, "-D", str(data), "-A", "trust", "-U", "fleetd", "--no-sync"]),
        check=True,
        capture_output=True,
        timeout=120,
    )
    opts = f"-h 127.0.0.1 -p {port} -k {base} -c fsync=off"
    subprocess.run(
        _as_postgres(
            [
                pg_ctl,
                "-D",
                str(data),
                "-o",
                opts,
                "-l",
                str(base / "log"),
                "-w",
                "-t",
                "60",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        yield f"postgresql://fleetd@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(base, ignore_errors=True)
