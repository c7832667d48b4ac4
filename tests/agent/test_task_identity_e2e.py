"""Tasks as their owners' own accounts (a fleet's task_identity nss), end to end: host users made
for the test with `useradd` own a 0700 directory and share a group's dataset, a real `fleetd serve`
places each user's job, a real `fleet-agent run` resolves the login through NSS and runs it as
that account with its groups; a user whose account does not resolve on the node waits, stage
`identity`."""

import grp
import os
import pwd
import shutil
import subprocess
import tempfile

import pytest

from tests.agent.conftest import AgentProcess, Http, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("useradd"),
        reason="host users and switching to them need root, useradd and setpriv (CI runs as root)",
    ),
]

FAST = {"FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1", "FLEETD_NODE_TTL_SECONDS": "5"}
READ = "import os, sys; print(os.getuid(), sorted(os.getgroups())); print(open(sys.argv[1]).read())"


@pytest.fixture
def accounts():
    """Two host users (the first in a group that owns a dataset) and a login no host has."""
    tag = f"{os.getpid() % 100000}"
    users = [f"fltnss{tag}a", f"fltnss{tag}b"]
    group = f"fltnss{tag}g"
    made = []
    try:
        subprocess.run(["groupadd", group], check=True, timeout=30)
        for user in users:
            subprocess.run(
                ["useradd", "--no-create-home", "-s", "/bin/sh", user], check=True, timeout=30
            )
            made.append(user)
        subprocess.run(["usermod", "-aG", group, users[0]], check=True, timeout=30)
        yield users[0], users[1], f"fltnss{tag}c", group
    finally:
        for user in made:
            subprocess.run(["userdel", user], check=False, timeout=30)
        subprocess.run(["groupdel", group], check=False, timeout=30)


@pytest.fixture
def lab(server_factory, admin, accounts):
    """fleetd and one ready agent on fleet `lab`, which runs tasks as their owners' accounts."""
    top = tempfile.mkdtemp(prefix="fleet-nss-")
    os.chmod(top, 0o711)
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http("POST", "/api/v1/fleets", expect=201, json={"name": "lab", "task_identity": "nss"})
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 1}).json()
    agent = AgentProcess(top, "nss-host", shape="l4_x4")
    try:
        agent.join(join["token"], server.url)
        agent.start()
        node_id = agent.node()["node_id"]
        wait_until(
            lambda: (lambda n: n if n["status"] == "ready" else None)(
                http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()
            ),
            timeout=60,
            message="the node ready",
        )
        yield http, top
    finally:
        agent.kill()
        agent.remove_task_cgroups()
        shutil.rmtree(top, ignore_errors=True)


def user_token(http, login):
    body = {"name": f"{login} laptop", "role": "member", "user": login}
    return http("POST", "/api/v1/tokens", expect=201, json=body).json()["token"]


def submit(http, token, path):
    body = {
        "name": "read",
        "command": ["/usr/bin/python3", "-c", READ, path],
        "resources": {"gpus": 0},
    }
    return http("POST", "/api/v1/jobs", expect=201, token=token, json=body).json()


def ended(http, job):
    return wait_until(
        lambda: (lambda j: j if j["state"] in ("succeeded", "failed") else None)(
            http("GET", f"/api/v1/jobs/{job['id']}", expect=200).json()
        ),
        timeout=90,
        message="the job's end",
    )


def stdout(http, job):
    logs = http("GET", f"/api/v1/jobs/{job['id']}/logs", expect=200).json()
    items = logs["items"] if isinstance(logs, dict) else logs
    return [line["text"] for line in items if line["stream"] == "stdout"]


def test_each_job_runs_as_its_users_own_account_and_groups(lab, accounts):
    http, top = lab
    alice, bob, nobody_here, group = accounts
    home = os.path.join(top, "home-a")
    os.mkdir(home, 0o700)
    a = pwd.getpwnam(alice)
    os.chown(home, a.pw_uid, a.pw_gid)
    secret = os.path.join(home, "secret")
    with open(secret, "w") as f:
        f.write("alice's data")
    os.chown(secret, a.pw_uid, a.pw_gid)
    os.chmod(secret, 0o600)
    dataset = os.path.join(top, "datasets")
    os.mkdir(dataset, 0o750)
    gid = grp.getgrnam(group).gr_gid
    os.chown(dataset, 0, gid)
    with open(os.path.join(dataset, "vision"), "w") as f:
        f.write("shared")
    os.chmod(os.path.join(dataset, "vision"), 0o640)
    os.chown(os.path.join(dataset, "vision"), 0, gid)

    alice_token = user_token(http, alice)
    done = ended(http, submit(http, alice_token, secret))
    assert done["state"] == "succeeded", done
    assert done["tasks"][0]["run_as"]["source"] == "nss"
    assert stdout(http, done)[-1] == "alice's data"
    assert stdout(http, done)[0].startswith(f"{a.pw_uid} ")
    shared = ended(http, submit(http, alice_token, os.path.join(dataset, "vision")))
    assert shared["state"] == "succeeded" and stdout(http, shared)[-1] == "shared"

    bob_token = user_token(http, bob)
    refused = ended(http, submit(http, bob_token, secret))  # another user's 0700 directory
    assert refused["state"] == "failed", refused
    assert (
        ended(http, submit(http, bob_token, os.path.join(dataset, "vision")))["state"] == "failed"
    )

    waiting = submit(http, user_token(http, nobody_here), secret)
    held = wait_until(
        lambda: (lambda j: j if "identity" in j["pending_reason"] else None)(
            http("GET", f"/api/v1/jobs/{waiting['id']}", expect=200).json()
        ),
        timeout=60,
        message="the job waiting at stage identity",
    )
    assert held["state"] == "queued", held
    assert "account does not resolve on this node" in held["pending_reason"], held
