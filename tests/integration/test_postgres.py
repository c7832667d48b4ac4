"""The PostgreSQL path: a throwaway real PostgreSQL server, the same services and guarantees."""

import contextlib

import pytest

from tests.conftest import ApiClient, gpus
from tests.support.concurrency import all_at_once

pytestmark = pytest.mark.integration


@pytest.fixture
def pg_api(make_app, postgres_url, clock):
    from fleetd.db import database
    from fleetd.models import MODELS, InventoryVersion, LeaderLease
    from fleetd.services.identity.tokens import issue_first_admin_token

    app = make_app(db_url=postgres_url)
    with database.connection_context():
        # Each test starts from empty tables on the shared server.
        for model in reversed(MODELS):
            if model not in (
                InventoryVersion,
                LeaderLease,
            ):  # one row each, kept (migrations made them)
                model.delete().execute()
        token = issue_first_admin_token(clock.now())
    return ApiClient(app, token)


def test_migrations_are_recorded_and_idempotent_on_postgres(pg_api, postgres_url):
    from fleetd.db import open_database, pending_migrations, upgrade

    db = open_database(postgres_url)
    try:
        assert upgrade(db) == [] and pending_migrations(db) == []
    finally:
        db.close()


@contextlib.contextmanager
def own_database(postgres_url, name):
    """A database of its own (the shared one is already at the newest migration), dropped
    afterwards."""
    import psycopg2

    from fleetd.db import open_database

    admin = psycopg2.connect(postgres_url)
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        cursor.execute(f"CREATE DATABASE {name}")
    db = open_database(postgres_url.rsplit("/", 1)[0] + "/" + name)
    try:
        yield db
    finally:
        db.close_all()
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {name}")
        admin.close()


def test_duplicate_instance_names_are_renamed_by_the_upgrade_on_postgres(postgres_url):
    from tests.fleetd.test_migrations import check_duplicate_names_are_renamed_by_the_upgrade

    with own_database(postgres_url, "fleetd_names") as db:
        check_duplicate_names_are_renamed_by_the_upgrade(db)


def test_0043_adds_a_watched_topology_column_and_goes_down_cleanly_on_postgres(postgres_url):
    from playhouse.migrations import Runner

    from fleetd.db import MIGRATIONS_DIR, upgrade

    with own_database(postgres_url, "fleetd_0043") as db:
        upgrade(db)
        with db.connection_context():
            version = "SELECT version FROM inventory_version"
            db.execute_sql(
                "INSERT INTO fleet (name, description, labels, created_at) "
                "VALUES ('f', '', '{}', now())"
            )
            db.execute_sql(
                "INSERT INTO node (id, fleet, machine_id, hostname, address, labels, "
                "agent_version, bundle_sha256, gpu_status_reason, status, status_reason, "
                "registered_at, cpu_count, memory_bytes, drain_repair) VALUES ('n', 'f', "
                "'m', 'h', '', '{}', '', '', '', 'ready', '', now(), 0, 0, false)"
            )
            before = db.execute_sql(version).fetchone()[0]
            db.execute_sql("""UPDATE node SET topology = '{"gpus": []}' WHERE id = 'n'""")
            assert db.execute_sql(version).fetchone()[0] == before + 1
            Runner(db, MIGRATIONS_DIR, table_name="schema_migration").down("0043_node_topology")
            assert "topology" not in {column.name for column in db.get_columns("node")}
        assert upgrade(db)[0] == "0043_node_topology"  # and the later ones it took down with it


def test_0017_keeps_artifact_names_per_owner_and_renames_ambiguous_token_names_on_postgres(
    postgres_url,
):
    from tests.fleetd import test_migrations as m

    with own_database(postgres_url, "fleetd_0017") as db:
        m.check_0017_gives_artifact_names_to_their_uploader_and_renames_ambiguous_token_names(db)


def test_concurrent_creates_of_one_token_name_make_exactly_one_on_postgres(pg_api):
    def create(_i):
        return ApiClient(pg_api.app, pg_api.token).post(
            "/api/v1/tokens", {"name": "ci-bot", "role": "submitter"}
        )

    assert all_at_once(10, create) == [201] + [409] * 9
    assert [t["name"] for t in pg_api.get("/api/v1/tokens").get_json()["items"]].count(
        "ci-bot"
    ) == 1


def test_concurrent_creates_of_one_instance_name_make_exactly_one_on_postgres(pg_api):
    from tests.fleetd.services.workloads.test_instances import check_concurrent_creates_make_one

    check_concurrent_creates_make_one(pg_api)


def test_the_index_refuses_a_create_of_a_taken_name_whose_check_passed_on_postgres(
    pg_api, monkeypatch
):
    from tests.fleetd.services.workloads.test_instances import (
        check_the_index_refuses_a_create_whose_check_passed,
    )

    check_the_index_refuses_a_create_whose_check_passed(pg_api, monkeypatch)


def test_single_use_token_admits_one_host_under_concurrency_on_postgres(pg_api):
    pg_api.create_fleet("gpu-a")
    join = pg_api.create_join_token("gpu-a", max_uses=1)

    def register(i):
        return ApiClient(pg_api.app).post(
            "/api/v1/agent/register",
            {
                "hostname": f"h{i}",
                "machine_id": f"m-{i}",
                "agent_version": "0.1.0",
                "address": "10.0.0.1",
                "resources": {"cpu_count": 1, "memory_bytes": 1},
                "gpus": gpus(1),
            },
            token=join,
            agent=True,
        )

    assert all_at_once(20, register) == [201] + [401] * 19
    assert len(pg_api.get("/api/v1/nodes").get_json()["items"]) == 1


def test_node_lifecycle_on_postgres(pg_api, clock):
    pg_api.create_fleet("gpu-a", labels={"zone": "a"})
    reg = pg_api.register(pg_api.create_join_token("gpu-a"), gpu_count=8)
    pg_api.heartbeat(reg["session_token"])
    node_id = reg["node_id"]
    assert (
        pg_api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "r"}).get_json()["status"]
        == "drained"
    )
    assert pg_api.post(f"/api/v1/nodes/{node_id}/undrain").get_json()["status"] == "ready"
    assert pg_api.get("/api/v1/fleets/gpu-a").get_json()["gpu_count"] == 8
    page = pg_api.get(f"/api/v1/nodes/{node_id}/events?limit=2").get_json()
    rest = pg_api.get(f"/api/v1/nodes/{node_id}/events?cursor={page['next_cursor']}").get_json()
    assert (
        len(page["items"]) == 2
        and rest["items"]
        and rest["items"][0]["id"] != page["items"][-1]["id"]
    )
    assert (
        pg_api.post("/api/v1/fleets", {"name": "bad", "description": "nul\x00"}).status_code == 400
    )
    assert pg_api.delete(f"/api/v1/nodes/{node_id}").status_code == 204


def test_the_inventory_version_moves_on_postgres_with_what_placement_reads(pg_api):
    from fleetd.db import database
    from fleetd.models import InventoryVersion

    def version():
        with database.connection_context():
            return InventoryVersion.get_by_id(1).version

    pg_api.create_fleet("gpu-a")
    before = version()
    reg = pg_api.register(pg_api.create_join_token("gpu-a"), gpu_count=2)
    registered = version()
    assert registered > before
    pg_api.heartbeat(reg["session_token"])  # pending -> ready: a status change
    ready = version()
    assert ready > registered
    with database.connection_context():  # what a heartbeat flush writes is not inventory
        database.execute_sql("UPDATE node SET last_heartbeat_at = now()")
    assert version() == ready
    pg_api.post(f"/api/v1/nodes/{reg['node_id']}/cordon")
    assert version() > ready


def test_a_reload_reads_only_the_changed_nodes_on_postgres_and_equals_a_full_read(pg_api):
    from fleetd.db import database
    from fleetd.services.placement.inventory import load_inventory

    pg_api.create_fleet("gpu-a")
    join = pg_api.create_join_token("gpu-a", max_uses=10)
    first, second = (
        pg_api.register(join, machine_id=f"m{n}", hostname=f"h{n}", gpu_count=2) for n in range(2)
    )
    rt = pg_api.app.extensions["fleetd"]
    with database.connection_context():
        before = rt.inventory.get()
    pg_api.post(
        "/api/v1/agent/heartbeat",
        {"tasks": [], "gpus": gpus(3)},
        token=first["session_token"],
        agent=True,
    )
    pg_api.delete(f"/api/v1/nodes/{second['node_id']}")
    with database.connection_context():
        after = rt.inventory.get()
        full = load_inventory()
    assert after.history[-1] == (before.version, {first["node_id"], second["node_id"]})
    assert [n.id for n in after.nodes] == [n.id for n in full.nodes] == [first["node_id"]]
    assert (
        after.gpus == full.gpus
        and after.models == full.models
        and after.nodes[0].status == full.nodes[0].status
    )


def test_an_instance_runs_stops_and_resumes_on_its_node_on_postgres(pg_api):
    from tests.fleetd.services.workloads.test_instances import create, finish, show, start

    pg_api.create_fleet("gpu-a")
    node, session = pg_api.ready_node(pg_api.create_join_token("gpu-a"), "host-1", gpu_count=2)
    pg_api.heartbeat(
        session, capabilities={"container_runtime": "podman"}
    )  # a node column the inventory reads
    inst = create(pg_api, ports=[{"port": 8888}])
    run = start(pg_api, session, [(8888, 40001)])
    assert show(pg_api, inst["id"])["runtime"]["ports"][0]["public_port"] == 40001
    pg_api.post(f"/api/v1/instances/{inst['id']}/stop")
    finish(pg_api, session, run)
    resumed = pg_api.post(f"/api/v1/instances/{inst['id']}/resume", {}).get_json()
    assert resumed["state"] == "starting" and resumed["node_id"] == node


def test_a_replica_whose_write_fails_keeps_what_it_heard_and_writes_it_next_round(
    pg_api, postgres_url, clock
):
    # A registration storm can hold every pooled connection: the replica's round (and the liveness
    # sweep) that writes down the heartbeats it heard fails. It must keep them for the next round
    # (the leader reads them to tell live nodes from lost ones) and go on renewing its lease, not
    # stop its loop.
    import threading

    from fleetd.background import liveness_sweep
    from fleetd.db import bind, database, open_database
    from fleetd.models import Node
    from fleetd.services.fleet_ops.replication import sync

    rt = pg_api.app.extensions["fleetd"]
    pg_api.create_fleet("gpu-a")
    node_id, session = pg_api.ready_node(pg_api.create_join_token("gpu-a"), "gpu-1")
    sync(rt)
    clock.advance(5)
    pg_api.heartbeat(session)  # heard: kept in memory until the next round writes it down
    heard_at = rt.liveness.get(node_id).at

    def stored():
        with database.connection_context():
            return Node.get_by_id(node_id).last_heartbeat_at

    before = stored()
    assert before < heard_at
    shared = database.obj
    small = bind(open_database(postgres_url, pool_size=2, pool_wait_seconds=1))
    release, holding = threading.Event(), threading.Barrier(3, timeout=30)

    def hold():
        with database.connection_context():
            database.execute_sql("SELECT 1")
            holding.wait()
            release.wait(30)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    try:
        try:
            for holder in holders:
                holder.start()
            holding.wait()
            # Every connection is held: the writes fail after their wait, and nothing raises.
            assert liveness_sweep.run(rt) == {"lost": 0, "heartbeats_saved": 0}
            sync(rt)
            assert rt.leader.leading()
        finally:
            release.set()
            for holder in holders:
                holder.join(30)
        assert stored() == before  # not written yet
        sync(rt)
        assert stored() == heard_at
    finally:
        small.close_all()
        bind(shared)


def test_a_node_another_replica_registered_is_not_lost_before_that_replica_writes_its_heartbeats(
    pg_api, clock
):
    # The leader has never heard a node that registered (and heartbeated) on another replica: until
    # that replica's next round writes down what it heard, the leader knows the node only from its
    # row, whose heartbeat time the registration wrote. In a registration storm the other replica's
    # rounds run late; a row without that time read as silent since forever, and the node was lost.
    from fleetd.background import liveness_sweep
    from fleetd.replicas import Leadership

    rt = pg_api.app.extensions["fleetd"]
    rt.leader = Leadership(rt.settings.leader_lease_seconds, shared=True)  # one of several replicas
    assert rt.leader.tick()
    try:
        clock.advance(
            rt.liveness.failover_grace + rt.liveness.limit() + 5
        )  # the leader has run for long
        pg_api.create_fleet("gpu-a")
        node_id, _ = pg_api.ready_node(pg_api.create_join_token("gpu-a"), "gpu-1")
        rt.liveness.forget(
            node_id
        )  # heard by the other replica only: nothing here, nothing written down yet
        assert liveness_sweep.run(rt) == {"lost": 0, "heartbeats_saved": 0}
        assert pg_api.node(node_id)["status"] == "ready"
        # A node that really went silent is still declared lost once its time is older than the TTL.
        clock.advance(rt.liveness.limit() + 1)
        assert liveness_sweep.run(rt)["lost"] == 1
        assert pg_api.node(node_id)["status"] == "lost"
    finally:
        rt.leader.resign()


def test_a_registration_under_way_holds_up_no_other_registration_on_postgres(pg_api, monkeypatch):
    # A registration storm with one join token on replicas: a registration's transaction locked the
    # token's row from its first statement, and the inventory version's row from its node's insert,
    # each until commit, so every other registration (on any replica) queued behind it, each holding
    # a pooled connection. Now the token is used last and the inventory triggers run at commit.
    import threading

    from fleetd.services.agents import sessions as agents

    pg_api.create_fleet("gpu-a")
    join = pg_api.create_join_token("gpu-a")
    paused, resume = threading.Event(), threading.Event()
    original = agents.replace_gpus

    def slow_for_one(node, reported, now):
        changed = original(node, reported, now)  # its node and GPU rows are written, uncommitted
        if node.hostname == "slow":
            paused.set()
            resume.wait(30)
        return changed

    monkeypatch.setattr(agents, "replace_gpus", slow_for_one)
    answers = {}

    def register(name):
        answers[name] = (
            ApiClient(pg_api.app)
            .post(
                "/api/v1/agent/register",
                {
                    "hostname": name,
                    "machine_id": f"m-{name}",
                    "agent_version": "0.1.0",
                    "address": "10.0.0.1",
                    "resources": {"cpu_count": 1, "memory_bytes": 1},
                    "gpus": gpus(2),
                },
                token=join,
                agent=True,
            )
            .status_code
        )

    slow = threading.Thread(target=register, args=("slow",))
    slow.start()
    try:
        assert paused.wait(30)
        fast = threading.Thread(target=register, args=("fast",))
        fast.start()
        fast.join(10)
        assert answers.get("fast") == 201, (
            "the second registration waited for the first one's commit"
        )
    finally:
        resume.set()
        slow.join(30)
    assert answers == {"slow": 201, "fast": 201}
    assert [
        t["uses"] for t in pg_api.get("/api/v1/fleets/gpu-a/join-tokens").get_json()["items"]
    ] == [2]
    nodes = pg_api.get("/api/v1/nodes").get_json()["items"]
    assert sorted(n["hostname"] for n in nodes) == ["fast", "slow"]
    assert all(len(n["gpus"]) == 2 for n in nodes)


def test_a_kicked_pass_leaves_parked_groups_unread_on_postgres(pg_api, monkeypatch):
    """The parked groups' condition is one row value IN a VALUES list, made as text with the
    driver's placeholder: PostgreSQL reads it as SQLite does."""
    from fleetd.db import database
    from fleetd.services.placement import scheduling
    from tests.fleetd.services.placement.test_scheduling_scale import _jobs_each_pass_reads

    pg_api.create_fleet("gpu-a")
    pg_api.ready_node(pg_api.create_join_token("gpu-a"), "n1", gpu_count=4)
    pg_api.submit(name="hog", resources={"gpus": 3})
    backlog = {pg_api.submit(name=f"b{i}", resources={"gpus": 2})["id"] for i in range(3)}
    never = {
        pg_api.submit(name=f"n{i}", resources={"gpus": 1, "gpu_types": ["NVIDIA B300"]})["id"]
        for i in range(2)
    }
    assert pg_api.run_task("scheduling")["pending"] == 5  # parks both groups; all know why
    rt = pg_api.app.extensions["fleetd"]
    read = _jobs_each_pass_reads(rt, monkeypatch)
    late = pg_api.submit(name="late", resources={"gpus": 2})
    with pg_api.app.app_context(), database.connection_context():
        assert scheduling.run_pass(rt, full=False)["pending"] == 6
    assert read and late["id"] in read[0]
    assert not any((backlog | never) & set(ids) for ids in read)


def test_output_batches_chunks_pages_and_search_on_postgres(pg_api):
    from tests.fleetd.services.workloads.test_output import (
        _all,
        _batch,
        _chunk,
        _lines,
        _node,
        _running,
        _upload,
    )

    pg_api.create_fleet("gpu-a")
    session = _node(pg_api)
    job_id, assignment = _running(pg_api, session)
    _batch(pg_api, session, assignment, 0, 100)
    _batch(pg_api, session, assignment, 100, 3000, _lines(3000, 100))
    _upload(pg_api, session, assignment, 0, _chunk(0, 3100), 3100)
    logs = f"/api/v1/jobs/{job_id}/logs"
    assert [i["text"] for i in _all(pg_api, logs)] == _lines(0, 3100)
    assert [i["line"] for i in _all(pg_api, logs, q="line 2999$", q_regex="true")] == [2999]
    whole = pg_api.get(f"/api/v1/jobs/{job_id}/output").get_data().decode().splitlines()
    assert whole == _lines(0, 3100)
