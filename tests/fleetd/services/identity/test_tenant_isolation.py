"""Tenant isolation, fleetd's side, over the real API with the agent side spoken by the test:
tokens' unix_user, fleets' rules (allow_root_tasks, require_isolation, allowed_images), node
capabilities, the placement conditions they make (and the per-owner port cap, MPS per owner, the
slice floor), and the run_as each task is delivered with."""

import pytest

from fleetd.db import database
from fleetd.models import InventoryVersion, OwnerUid, User
from tests.conftest import ApiClient
from tests.support.gpus import gpus

MIB = 1024**2
FIRST_UID = 61184


def client(api, name, role="submitter", **body):
    """An ApiClient for a new token of this role (and unix_user, team...)."""
    resp = api.post("/api/v1/tokens", dict(name=name, role=role, **body))
    assert resp.status_code == 201, resp.get_json()
    return ApiClient(api.app, resp.get_json()["token"])


def node(api, fleet, name, capabilities=None, gpu_count=1, **extra):
    """A ready node of `fleet` (registered, one heartbeat); returns (node id, session)."""
    reg = api.register(
        api.create_join_token(fleet),
        machine_id=name,
        hostname=name,
        gpu_count=gpu_count,
        capabilities=capabilities,
        **extra,
    )
    api.heartbeat(reg["session_token"])
    return reg["node_id"], reg["session_token"]


def instance(api, expect=201, **spec):
    spec.setdefault("name", "nb")
    spec.setdefault("command", ["sleep", "1d"])
    resp = api.post("/api/v1/instances", spec)
    assert resp.status_code == expect, resp.get_json()
    return resp.get_json()


def error(resp, status):
    assert resp.status_code == status, resp.get_json()
    return resp.get_json()["error"]


# ---------------------------------------------------------------- tokens


def test_a_token_takes_a_posix_unix_user_never_root_and_lists_it(api):
    made = api.post("/api/v1/tokens", {"name": "alice", "role": "submitter", "unix_user": "alice"})
    assert made.status_code == 201 and made.get_json()["unix_user"] == "alice"
    listed = {t["name"]: t for t in api.get("/api/v1/tokens").get_json()["items"]}
    assert listed["alice"]["unix_user"] == "alice" and listed["admin"]["unix_user"] is None
    assert "root" in str(
        error(api.post("/api/v1/tokens", {"name": "r", "role": "admin", "unix_user": "root"}), 400)[
            "details"
        ]
    )
    for bad in ("Alice", "1x", "a" * 33, "a b", "../etc", "alice\n"):
        error(api.post("/api/v1/tokens", {"name": "b", "role": "submitter", "unix_user": bad}), 400)


@pytest.mark.parametrize(
    "system_user", ["daemon", "bin", "nobody"]
)  # uid 1, 2 and 65534 on every Debian
def test_a_unix_user_that_is_a_system_account_is_refused_unless_the_operator_allows_it(
    make_app, clock, system_user
):
    from tests.conftest import admin_client

    api = admin_client(make_app(), clock)
    err = error(
        api.post("/api/v1/tokens", {"name": "svc", "role": "submitter", "unix_user": system_user}),
        400,
    )
    assert err["code"] == "invalid_request" and "tokens_allow_system_users" in err["message"], err
    assert err["details"]["fields"]["json"]["unix_user"]
    assert [t["name"] for t in api.get("/api/v1/tokens").get_json()["items"]] == ["admin"]

    api = ApiClient(
        make_app(tokens_allow_system_users=f"ci-runner, {system_user}"), api.token
    )  # a restart
    api.create_fleet("gpu-a")
    _, session = node(api, "gpu-a", "host", gpu_count=1)
    client(api, "svc", unix_user=system_user).submit(resources={"gpus": 1})
    # The node is told, so that its own check at launch lets this user through too.
    assert _run_as(api, session) == {
        "source": "unix_user",
        "user": system_user,
        "uid": None,
        "gid": None,
        "allow_system_user": True,
    }


def test_a_bad_allow_list_of_system_users_is_refused_at_start(make_settings):
    with pytest.raises(ValueError, match="tokens_allow_system_users"):
        make_settings(tokens_allow_system_users="daemon, root")


def test_two_live_tokens_share_a_unix_user_only_when_the_request_says_they_are_one_tenant(api):
    first = api.post(
        "/api/v1/tokens", {"name": "alice-ci", "role": "submitter", "unix_user": "alice"}
    ).get_json()
    err = error(
        api.post("/api/v1/tokens", {"name": "alice-2", "role": "submitter", "unix_user": "alice"}),
        409,
    )
    assert err["code"] == "conflict" and "share_unix_user" in err["message"]
    assert err["details"] == {"unix_user": "alice", "token_id": first["id"]}
    shared = api.post(
        "/api/v1/tokens",
        {"name": "alice-2", "role": "submitter", "unix_user": "alice", "share_unix_user": True},
    )
    assert shared.status_code == 201 and "share_unix_user" not in shared.get_json()
    assert (
        api.post(
            "/api/v1/tokens", {"name": "bob", "role": "submitter", "unix_user": "bob"}
        ).status_code
        == 201
    )
    # Once no live token has the user, a new one takes it without saying so.
    for token_id in (first["id"], shared.get_json()["id"]):
        assert api.delete(f"/api/v1/tokens/{token_id}").status_code == 204
    assert (
        api.post(
            "/api/v1/tokens", {"name": "alice-3", "role": "submitter", "unix_user": "alice"}
        ).status_code
        == 201
    )


def _cli(api, monkeypatch, *args):
    """Run a `fleetd` command whose REST calls reach the real API (through the Flask test
    client)."""
    from click.testing import CliRunner

    from fleetd.cli import cli, remote

    class Client:
        def __init__(self, url, token):
            pass

        def _call(self, method, path, body):
            resp = api.call(method, path, json=body)
            assert resp.status_code < 300, resp.get_json()
            return resp.get_json()

        def post(self, path, body):
            return self._call("POST", path, body)

        def patch(self, path, body):
            return self._call("PATCH", path, body)

    monkeypatch.setattr(remote, "Client", Client)
    out = CliRunner().invoke(cli, [*args, "--url", "http://x", "--token", "t", "--json"])
    assert out.exit_code == 0, out.output
    return out.output


def test_the_cli_creates_a_token_with_a_unix_user(api, monkeypatch):
    out = _cli(
        api,
        monkeypatch,
        "token",
        "create",
        "--name",
        "bob",
        "--role",
        "submitter",
        "--unix-user",
        "bob",
    )
    assert '"unix_user": "bob"' in out
    out = _cli(
        api,
        monkeypatch,
        "token",
        "create",
        "--name",
        "bob-ci",
        "--role",
        "submitter",
        "--unix-user",
        "bob",
        "--share-unix-user",
    )
    assert '"unix_user": "bob"' in out and '"name": "bob-ci"' in out


def test_the_cli_sets_a_fleets_isolation_rules(api, monkeypatch):
    _cli(
        api,
        monkeypatch,
        "fleet",
        "create",
        "lab",
        "--allow-root-tasks",
        "--allowed-image",
        "quay.io/*",
        "--allowed-image",
        "docker.io/library/*",
    )
    _cli(api, monkeypatch, "fleet", "update", "lab", "--require-isolation", "--no-allow-root-tasks")
    shown = api.get("/api/v1/fleets/lab").get_json()
    assert (shown["allow_root_tasks"], shown["require_isolation"], shown["allowed_images"]) == (
        False,
        True,
        ["quay.io/*", "docker.io/library/*"],
    )


# ---------------------------------------------------------------- fleets


def test_a_fleet_keeps_its_isolation_rules_through_create_patch_and_show(api):
    made = api.create_fleet(
        "gpu-a", allow_root_tasks=True, allowed_images=["registry.example.com/*"]
    )
    assert (made["allow_root_tasks"], made["require_isolation"], made["allowed_images"]) == (
        True,
        False,
        ["registry.example.com/*"],
    )
    patched = api.patch(
        "/api/v1/fleets/gpu-a", {"require_isolation": True, "allow_root_tasks": False}
    ).get_json()
    assert (
        patched["allow_root_tasks"],
        patched["require_isolation"],
        patched["allowed_images"],
    ) == (False, True, ["registry.example.com/*"])
    assert api.get("/api/v1/fleets/gpu-a").get_json()["require_isolation"] is True
    error(api.patch("/api/v1/fleets/gpu-a", {"allowed_images": ["x"] * 65}), 400)
    error(api.patch("/api/v1/fleets/gpu-a", {"allowed_images": ["x" * 256]}), 400)
    error(api.patch("/api/v1/fleets/gpu-a", {"allowed_images": [""]}), 400)


def test_an_image_its_fleet_does_not_allow_is_refused_at_create_naming_image_and_patterns(api):
    api.create_fleet(
        "gpu-a", allowed_images=["registry.example.com/*", "docker.io/library/python:*"]
    )
    refused = error(
        api.post(
            "/api/v1/instances",
            {
                "name": "x",
                "image": "docker.io/evil/miner:latest",
                "node_selector": {"fleet": "gpu-a"},
            },
        ),
        400,
    )
    assert (
        "docker.io/evil/miner:latest" in refused["message"]
        and "registry.example.com/*" in refused["message"]
    )
    assert refused["details"]["allowed_images"] == {
        "gpu-a": ["registry.example.com/*", "docker.io/library/python:*"]
    }
    instance(
        api, name="ok", image="docker.io/library/python:3.12", node_selector={"fleet": "gpu-a"}
    )


def test_an_image_that_names_no_fleet_is_refused_only_by_every_fleet_and_runs_only_where_allowed(
    api,
):
    api.create_fleet("gpu-a", allowed_images=["registry.example.com/*"])
    api.create_fleet("gpu-b")  # any image
    a, _ = node(
        api,
        "gpu-a",
        "host-a",
        resources={"cpu_count": 64, "memory_bytes": 1 << 39, "container_runtime": "podman"},
    )
    b, _ = node(
        api,
        "gpu-b",
        "host-b",
        resources={"cpu_count": 64, "memory_bytes": 1 << 39, "container_runtime": "podman"},
    )
    placed = [instance(api, name=f"i{i}", image="docker.io/library/python:3.12") for i in range(3)]
    assert {p["node_id"] for p in placed} == {b}  # never on host-a, whose fleet refuses the image
    api.patch("/api/v1/fleets/gpu-b", {"allowed_images": ["quay.io/*"]})
    refused = error(
        api.post("/api/v1/instances", {"name": "x", "image": "docker.io/library/python:3.12"}), 400
    )
    assert "any fleet" in refused["message"] and set(refused["details"]["allowed_images"]) == {
        "gpu-a",
        "gpu-b",
    }
    assert a != b


def test_a_queued_image_its_fleet_stopped_allowing_waits_and_says_which_fleet_refuses_it(api):
    api.create_fleet("gpu-a")  # any image, no node yet: the instance is queued
    inst = instance(api, image="docker.io/library/python:3.12", node_selector={"fleet": "gpu-a"})
    assert (
        inst["state"] == "pending"
        and inst["pending_reason"] == "no node is enrolled in fleet gpu-a"
    )
    api.patch("/api/v1/fleets/gpu-a", {"allowed_images": ["quay.io/*"]})
    node(
        api,
        "gpu-a",
        "host-a",
        resources={"cpu_count": 64, "memory_bytes": 1 << 39, "container_runtime": "podman"},
    )
    shown = api.get(f"/api/v1/instances/{inst['id']}").get_json()
    assert shown["state"] == "pending" and shown["pending_reason"] == (
        "no enrolled node of fleet gpu-a can run its image: their fleet's allowed_images do not "
        "admit docker.io/library/python:3.12 (gpu-a)"
    )


# ---------------------------------------------------------------- node capabilities


def test_a_node_shows_what_its_agent_reported_and_an_older_agent_reads_as_no_isolation(api):
    api.create_fleet("gpu-a")
    new, session = node(
        api,
        "gpu-a",
        "new",
        capabilities={
            "isolation": "none",
            "isolation_reason": "agent not running as root",
            "containers": "ready",
            "host_uids": [1000, 1001],
            "container_runtime": "podman",
        },
    )
    shown = api.node(new)["capabilities"]
    assert shown == {
        "isolation": "none",
        "isolation_reason": "agent not running as root",
        "containers": "ready",
        "container_runtime": "podman",
    }  # host_uids are not shown
    old, _ = node(
        api,
        "gpu-a",
        "old",
        resources={"cpu_count": 8, "memory_bytes": 1 << 34, "container_runtime": "docker"},
    )
    assert api.node(old)["capabilities"] == {
        "isolation": "none",
        "containers": "ready",
        "container_runtime": "docker",
    }
    bare, _ = node(api, "gpu-a", "bare")
    assert api.node(bare)["capabilities"]["containers"].startswith("unavailable: ")
    # A heartbeat that says the same writes nothing; a change is written.
    with database.connection_context():
        before = InventoryVersion.get_by_id(1).version
    api.heartbeat(
        session,
        capabilities={
            "isolation": "none",
            "isolation_reason": "agent not running as root",
            "containers": "ready",
            "host_uids": [1001, 1000],
            "container_runtime": "podman",
        },
    )
    with database.connection_context():
        assert InventoryVersion.get_by_id(1).version == before
    api.heartbeat(
        session,
        capabilities={
            "isolation": "uid",
            "containers": "unavailable: podman info failed",
            "container_runtime": "podman",
        },
    )
    assert api.node(new)["capabilities"] == {
        "isolation": "uid",
        "containers": "unavailable: podman info failed",
        "container_runtime": "podman",
    }
    error(
        api.post(
            "/api/v1/agent/heartbeat",
            {"capabilities": {"containers": "maybe"}},
            token=session,
            agent=True,
        ),
        400,
    )
    error(
        api.post(
            "/api/v1/agent/heartbeat",
            {"capabilities": {"host_uids": list(range(4097))}},
            token=session,
            agent=True,
        ),
        400,
    )


# ---------------------------------------------------------------- placement


def test_a_fleet_that_requires_isolation_gives_no_work_to_a_node_without_it(api):
    api.create_fleet("gpu-a", require_isolation=True)
    _, session = node(
        api,
        "gpu-a",
        "laptop",
        capabilities={"isolation": "none", "isolation_reason": "agent not running as root"},
    )
    job = api.submit(resources={"gpus": 1})
    reason = api.job(job["id"])["pending_reason"]
    assert "requires isolation" in reason and "agent not running as root" in reason, reason
    status = api.get("/api/v1/cluster/status").get_json()["gpu"]
    assert status["blocked"] == 1 and status["blocked_notes"][0]["code"] == "isolation_required"
    api.heartbeat(session, capabilities={"isolation": "uid"})
    assert api.job(job["id"])["state"] == "running"


def test_an_image_instance_waits_for_a_node_whose_containers_are_ready(api):
    api.create_fleet("gpu-a")
    _, session = node(
        api,
        "gpu-a",
        "host",
        capabilities={
            "containers": "unavailable: error setting rlimit type 7",
            "container_runtime": "podman",
            "isolation": "uid",
        },
    )
    inst = instance(api, image="docker.io/library/python:3.12")
    assert inst["state"] == "pending" and "error setting rlimit type 7" in inst["pending_reason"], (
        inst
    )
    api.heartbeat(
        session,
        capabilities={"containers": "ready", "container_runtime": "podman", "isolation": "uid"},
    )
    assert api.get(f"/api/v1/instances/{inst['id']}").get_json()["state"] == "starting"


def test_an_older_agent_that_reported_a_container_runtime_still_runs_images(api):
    api.create_fleet("gpu-a")
    node(
        api,
        "gpu-a",
        "host",
        resources={"cpu_count": 8, "memory_bytes": 1 << 34, "container_runtime": "podman"},
    )
    assert instance(api, image="docker.io/library/python:3.12")["state"] == "starting"


def test_one_owner_holds_at_most_the_cap_of_host_ports_on_a_node_and_another_owner_still_gets_ports(
    api,
):
    api.create_fleet("gpu-a")
    host, session = node(api, "gpu-a", "host", gpu_count=0)
    alice, bob = client(api, "alice"), client(api, "bob")
    ports = [{"port": 8000 + i} for i in range(32)]
    first = [instance(alice, name=f"a{i}", ports=ports) for i in range(2)]
    assert [i["node_id"] for i in first] == [host, host]  # 64 ports: at the cap
    third = instance(alice, name="a2", ports=ports)
    assert third["state"] == "pending"
    assert (
        "hold 64 host port(s)" in third["pending_reason"]
        and "cap per owner and node is 64" in third["pending_reason"]
    ), third["pending_reason"]
    assert instance(bob, name="b0", ports=ports)["node_id"] == host
    # A stopped instance keeps its ports (its volume stays); a deleted one gives them back.
    alice.post(f"/api/v1/instances/{first[0]['id']}/stop")
    assert alice.get(f"/api/v1/instances/{third['id']}").get_json()["state"] == "pending"
    # Deleting, it holds them until its node has removed its volume (which frees them on the node).
    assert alice.delete(f"/api/v1/instances/{first[0]['id']}").get_json()["state"] == "deleting"
    assert alice.get(f"/api/v1/instances/{third['id']}").get_json()["state"] == "pending"
    api.heartbeat(session, volumes=[])  # placed at once, by the pass that heartbeat kicks
    assert alice.get(f"/api/v1/instances/{third['id']}").get_json()["node_id"] == host


def test_the_port_cap_is_a_setting(make_app, clock):
    from tests.conftest import admin_client

    api = admin_client(make_app(instances_max_host_ports_per_owner_per_node=3), clock)
    api.create_fleet("gpu-a")
    node(api, "gpu-a", "host", gpu_count=0)
    assert instance(api, name="a", ports=[{"port": 1}, {"port": 2}])["state"] == "starting"
    assert instance(api, name="b", ports=[{"port": 1}, {"port": 2}])["state"] == "pending"
    assert instance(api, name="c", ports=[{"port": 1}])["state"] == "starting"


def test_two_owners_mps_slices_never_share_a_gpu(api):
    api.create_fleet("gpu-a")
    node(api, "gpu-a", "host", gpu_count=1)
    alice, bob = client(api, "alice"), client(api, "bob")
    first = alice.submit(resources={"gpus": 0.25}, isolation="mps")
    assert alice.job(first["id"])["state"] == "running"
    other = bob.submit(resources={"gpus": 0.25}, isolation="mps")
    assert "another owner's MPS work" in bob.job(other["id"])["pending_reason"]
    assert (
        alice.job(alice.submit(resources={"gpus": 0.25}, isolation="mps")["id"])["state"]
        == "running"
    )
    assert (
        bob.job(bob.submit(resources={"gpus": 0.25})["id"])["state"] == "running"
    )  # not MPS: shares


@pytest.mark.parametrize("gpus_asked", [1e-300, 0.005, 0.0099])
def test_a_fraction_under_one_percent_is_refused(api, gpus_asked):
    assert "at least 0.01" in str(
        error(
            api.post(
                "/api/v1/jobs",
                {"name": "j", "command": ["true"], "resources": {"gpus": gpus_asked}},
            ),
            400,
        )["details"]
    )
    error(
        api.post(
            "/api/v1/instances",
            {"name": "i", "command": ["true"], "resources": {"gpus": gpus_asked}},
        ),
        400,
    )


def test_a_slice_memory_under_256_mib_is_refused_and_no_gpu_gives_a_smaller_share(api):
    details = error(
        api.post(
            "/api/v1/jobs",
            {
                "name": "j",
                "command": ["true"],
                "resources": {"gpus": 1, "gpu_memory_bytes": 255 * MIB},
            },
        ),
        400,
    )["details"]
    assert "256 MiB" in str(details)
    api.submit(resources={"gpus": 1, "gpu_memory_bytes": 256 * MIB})  # the floor itself is fine
    api.create_fleet("gpu-a")
    small = [dict(g, memory_total_bytes=16 * 1024**3) for g in gpus(1)]  # 1% of it is 164 MiB
    node(api, "gpu-a", "host", gpus=small)
    tiny = api.submit(resources={"gpus": 0.01})
    assert "under 256 MiB" in api.job(tiny["id"])["pending_reason"]
    assert api.job(api.submit(resources={"gpus": 0.02})["id"])["state"] == "running"  # 328 MiB


# ---------------------------------------------------------------- run_as


def _run_as(api, session):
    assignment = api.acquire(session)
    assert assignment is not None
    return assignment["run_as"]


def test_each_owner_runs_as_its_own_uid_the_same_on_every_node_and_for_ever(api):
    api.create_fleet("gpu-a")
    _, s1 = node(api, "gpu-a", "host-1", gpu_count=1)
    _, s2 = node(api, "gpu-a", "host-2", gpu_count=1)
    alice, bob = client(api, "alice"), client(api, "bob")
    a1 = alice.submit(resources={"gpus": 1})
    a2 = alice.submit(resources={"gpus": 1})
    runs = {_run_as(api, s1)["uid"], _run_as(api, s2)["uid"]}
    assert runs == {FIRST_UID}
    assert alice.job(a1["id"])["tasks"][0]["run_as"] == {
        "source": "dynamic",
        "user": None,
        "uid": FIRST_UID,
        "gid": FIRST_UID,
    }
    result = alice.get(f"/api/v1/jobs/{a2['id']}/result").get_json()
    assert result["tasks"][0]["run_as"]["uid"] == FIRST_UID
    rows = api.get("/api/v1/cluster/allocation").get_json()["allocations"]
    assert {r["run_as"]["uid"] for r in rows} == {FIRST_UID}
    _, s3 = node(api, "gpu-a", "host-3", gpu_count=1)  # the only one with a free GPU
    bob.submit(resources={"gpus": 1})
    assert _run_as(api, s3) == {
        "source": "dynamic",
        "user": None,
        "uid": FIRST_UID + 1,
        "gid": FIRST_UID + 1,
    }
    with database.connection_context():
        assert {r.uid for r in OwnerUid.select()} == {FIRST_UID, FIRST_UID + 1}


def test_an_allocated_uid_skips_the_uids_of_host_users(api):
    api.create_fleet("gpu-a")
    _, session = node(
        api,
        "gpu-a",
        "host",
        gpu_count=1,
        capabilities={"host_uids": [FIRST_UID, FIRST_UID + 1], "isolation": "uid"},
    )
    client(api, "alice").submit(resources={"gpus": 1})
    assert _run_as(api, session)["uid"] == FIRST_UID + 2


def test_a_unix_user_token_runs_as_that_user_and_root_needs_an_admin_in_a_fleet_that_allows_it(api):
    api.create_root_fleet("root-ok")
    api.create_fleet("plain")
    _, root_ok = node(api, "root-ok", "host-r", gpu_count=2)
    _, plain = node(api, "plain", "host-p", gpu_count=2)
    alice = client(api, "alice", unix_user="alice")
    alice.submit(resources={"gpus": 1}, node_selector={"fleet": "plain"})
    assert _run_as(api, plain) == {"source": "unix_user", "user": "alice", "uid": None, "gid": None}
    api.submit(resources={"gpus": 1}, node_selector={"fleet": "root-ok"})
    assert _run_as(api, root_ok) == {"source": "root", "user": "root", "uid": 0, "gid": 0}
    client(api, "bob").submit(resources={"gpus": 1}, node_selector={"fleet": "root-ok"})
    assert _run_as(api, root_ok)["source"] == "dynamic"  # a submitter: never root
    api.submit(resources={"gpus": 1}, node_selector={"fleet": "plain"})
    assert (
        _run_as(api, plain)["source"] == "dynamic"
    )  # an admin in a fleet without allow_root_tasks


def test_a_job_whose_owner_can_get_no_uid_waits_and_says_why(make_app, clock):
    from tests.conftest import admin_client

    api = admin_client(make_app(task_uid_range="61184-61184"), clock)
    api.create_fleet("gpu-a")
    node(api, "gpu-a", "host", gpu_count=2)
    alice, bob = client(api, "alice"), client(api, "bob")
    assert alice.job(alice.submit(resources={"gpus": 1})["id"])["state"] == "running"
    waiting = bob.job(bob.submit(resources={"gpus": 1})["id"])
    assert (
        waiting["state"] == "queued"
        and "no uid" in waiting["pending_reason"]
        and "task_uid_range" in waiting["pending_reason"]
    ), waiting["pending_reason"]


def test_a_bad_uid_range_is_refused_at_start(make_settings):
    for bad in ("x", "65519-61184", "0-100", "61184"):
        with pytest.raises(ValueError, match="task_uid_range"):
            make_settings(task_uid_range=bad)


def test_a_claims_fleet_runs_a_user_as_its_providers_uid_gid_and_groups(api):
    """task_identity claims: the uid, gid and groups the identity provider's claims gave the user
    (kept on the user at its sign-in); a user without them runs as its allocated uid."""
    api.post("/api/v1/fleets", {"name": "lab", "task_identity": "claims"})
    _, session = node(api, "lab", "host-1", gpu_count=2)
    carol = client(api, "carol laptop", role="member", user="carol")
    dave = client(api, "dave laptop", role="member", user="dave")
    with database.connection_context():
        User.update(posix={"uid": 5001, "gid": 5000, "groups": [5000, 7001]}).where(
            User.login == "carol"
        ).execute()
    carol.submit(resources={"gpus": 1})
    assert _run_as(api, session) == {
        "source": "claims",
        "user": "carol",
        "uid": 5001,
        "gid": 5000,
        "groups": [5000, 7001],
    }
    dave.submit(resources={"gpus": 1})
    assert _run_as(api, session)["source"] == "dynamic"
