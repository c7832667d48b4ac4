"""`fleetd rollout start --wait` against a real `fleetd serve`, for CI: an exit status per state the
rollout ends or pauses in, and `--rollout ID` driving one whose driver stopped. The nodes are
stand-ins registered over HTTP whose SSH port refuses connections, so each node's upgrade fails at
once (the SSH test hosts of tests/provision show real upgrades)."""

import json
import socket
import subprocess

import pytest
import requests

from tests.integration.conftest import admin, data_dir, server, server_factory  # noqa: F401 - fixtures
from tests.integration.test_cli import run  # noqa: F401 - the fixture
from tests.support.gpus import gpus
from tests.support.server import fleetd_cmd

pytestmark = pytest.mark.integration


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def enrol(run, fleet, names, heartbeat=True):
    """Nodes of `fleet` named `names`, ready (or pending without a heartbeat), at 127.0.0.1."""
    run("fleet", "create", fleet, "--no-validation")
    token = json.loads(
        run("join-token", "create", "--fleet", fleet, "--uses", "10", "--json").stdout
    )["token"]
    for name in names:
        reg = requests.post(
            run.url + "/api/v1/agent/register",
            json={
                "hostname": name,
                "machine_id": name,
                "agent_version": "0.1.0",
                "address": "127.0.0.1",
                "resources": {"cpu_count": 8, "memory_bytes": 2**35},
                "gpus": gpus(1),
            },
            headers={"Authorization": f"Bearer {token}", "X-Fleet-Protocol": "1"},
            timeout=30,
        )
        assert reg.status_code == 201, reg.text
        if heartbeat:
            beat = requests.post(
                run.url + "/api/v1/agent/heartbeat",
                json={"tasks": []},
                headers={
                    "Authorization": f"Bearer {reg.json()['session_token']}",
                    "X-Fleet-Protocol": "1",
                },
                timeout=30,
            )
            assert beat.status_code == 200, beat.text


def start(run, bundle, tmp_path, *args):
    """`fleetd rollout start --wait --json ...`; the CompletedProcess (any exit status)."""
    (tmp_path / "known_hosts").touch()
    return subprocess.run(
        fleetd_cmd(
            "rollout",
            "start",
            "--bundle",
            str(bundle.path),
            "--port",
            str(closed_port()),
            "--known-hosts",
            str(tmp_path / "known_hosts"),
            "--connect-timeout",
            "5",
            "--wait",
            "--json",
            *args,
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env=run.env,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A bundle of this checkout (the driver reads its version and SHA-256; no host installs it)."""
    from fleetd.provision.bundle import build_bundle
    from tests.provision.conftest import REPO

    return build_bundle(tmp_path_factory.mktemp("bundle"), source=REPO)


def test_rollout_start_wait_exits_with_a_status_per_end_and_drives_a_rollout_again_by_id(
    run, bundle, tmp_path
):
    # Done: every node of the fleet is skipped (pending: it never heartbeat).
    enrol(run, "ci-done", ["done-1"], heartbeat=False)
    done = start(run, bundle, tmp_path, "--fleet", "ci-done")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["state"] == "done"

    # Failed: the only node, the canary, fails, and no node is left to try.
    enrol(run, "ci-failed", ["failed-1"])
    failed = start(run, bundle, tmp_path, "--fleet", "ci-failed")
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert json.loads(failed.stdout)["state"] == "failed"
    assert "is failed (failed: canary node" in failed.stderr, failed.stderr

    # Paused: the canary fails with a node left to try. A driver for CI stops there, at once.
    enrol(run, "ci-paused", ["paused-1", "paused-2"])
    paused = start(run, bundle, tmp_path, "--fleet", "ci-paused")
    assert paused.returncode == 5, paused.stdout + paused.stderr
    rollout = json.loads(paused.stdout)
    assert rollout["state"] == "paused", rollout
    assert [n["state"] for n in rollout["nodes"]] == ["failed", "pending"], rollout
    assert f"`fleetd rollout start --rollout {rollout['id']} --bundle ...`" in paused.stderr

    # Retried, it is driven again by its id (the canary fails again: paused again); aborted, the
    # driver ends at once with the status of an abort.
    run("rollout", "retry", rollout["id"])
    again = start(run, bundle, tmp_path, "--rollout", rollout["id"])
    assert again.returncode == 5, again.stdout + again.stderr
    assert f"rollout {rollout['id']} (running): fleet ci-paused" in again.stderr, again.stderr
    run("rollout", "abort", rollout["id"])
    aborted = start(run, bundle, tmp_path, "--rollout", rollout["id"])
    assert aborted.returncode == 4, aborted.stdout + aborted.stderr
    assert json.loads(aborted.stdout)["state"] == "aborted"

    # Another bundle than the rollout's is refused; neither --fleet nor --rollout is a usage error.
    from tests.provision.conftest import repack_bundle

    rebuilt = repack_bundle(bundle, tmp_path / "rebuilt")
    other = start(run, rebuilt, tmp_path, "--rollout", rollout["id"])
    assert other.returncode == 1, other.stdout + other.stderr
    assert f"rolls out bundle {bundle.sha256[:12]}" in other.stderr, other.stderr
    refused = subprocess.run(
        fleetd_cmd("rollout", "start", "--bundle", str(bundle.path)),
        capture_output=True,
        text=True,
        timeout=60,
        env=run.env,
    )
    assert refused.returncode == 2 and "--fleet is required (or --rollout)" in refused.stderr
