"""Replicas: several real `fleetd serve` processes on one real PostgreSQL database.

One leader at a time, elected through the lease row; followers answer every route and their long
polls wake when the leader assigns (LISTEN/NOTIFY); kill -9 of the leader hands the lead over and
work goes on; a leader paused past its lease is fenced off; SQLite refuses a second process.
"""

import signal
import subprocess
import threading
import uuid

import psycopg2
import pytest
import requests

from fleetd.services.identity.tokens import issue_first_admin_token
from tests.support import wait_until
from tests.support.gpus import gpus
from tests.support.http import ApiClient, Http
from tests.support.server import FleetdProcess, fleetd_cmd, fleetd_init

pytestmark = pytest.mark.integration

LEASE = "2"  # seconds: failover within a few seconds keeps the test short


@pytest.fixture
def replica_db(postgres_url):
    """A fresh database on the test PostgreSQL server; dropped afterwards."""
    name = f"fleetd_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(postgres_url)
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    try:
        yield postgres_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


@pytest.fixture
def cluster(replica_db, tmp_path):
    """start(n) -> n replicas on one database, and the first admin token."""
    env = {
        "FLEETD_DB_URL": replica_db,
        "FLEETD_LEADER_LEASE_SECONDS": LEASE,
        "FLEETD_NODE_TTL_SECONDS": "6",
        "FLEETD_NODE_GRACE_SECONDS": "2",
        "FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1",
        "FLEETD_TASK_LEASE_SECONDS": "8",
        "FLEETD_LONG_POLL_MAX_SECONDS": "30",
    }
    token = fleetd_init(tmp_path / "init", env)
    started = []

    def start(count):
        for _ in range(count):
            started.append(FleetdProcess(tmp_path / f"replica-{len(started)}", env).start())
        return started

    yield start, token
    for proc in started:
        if proc.proc.poll() is None:
            proc.proc.send_signal(signal.SIGCONT)
        proc.kill()


def health(proc):
    try:
        return requests.get(proc.url + "/api/v1/health", timeout=5).json()
    except requests.RequestException:
        return None


def leaders(procs):
    return [p for p in procs if p.proc.poll() is None and (health(p) or {}).get("leader")]


def one_leader(procs, timeout=30):
    found = wait_until(
        lambda: (lambda led: led if len(led) == 1 else None)(leaders(procs)),
        timeout,
        message="exactly one leader",
    )
    return found[0]


class StandIn:
    """A node spoken for by the test over the agent protocol, against one replica."""

    def __init__(self, http, join, name):
        self.http = http
        reply = http(
            "POST",
            "/api/v1/agent/register",
            201,
            agent_token=join,
            json={
                "hostname": name,
                "machine_id": name,
                "agent_version": "0.1.0",
                "address": "10.0.0.9",
                "resources": {"cpu_count": 8, "memory_bytes": 1 << 34},
                "gpus": gpus(2),
            },
        ).json()
        self.node_id, self.session = reply["node_id"], reply["session_token"]
        self.heartbeat([])

    def heartbeat(self, tasks):
        return self.http(
            "POST", "/api/v1/agent/heartbeat", 200, agent_token=self.session, json={"tasks": tasks}
        ).json()

    def acquire(self, wait):
        return self.http(
            "POST",
            "/api/v1/agent/acquire",
            200,
            agent_token=self.session,
            json={"wait_seconds": wait},
        ).json()["assignment"]

    def call(self, assignment, action, **body):
        return self.http(
            "POST",
            f"/api/v1/agent/tasks/{assignment['task_id']}/{action}",
            204,
            agent_token=self.session,
            json=dict(body, epoch=assignment["epoch"]),
        )


def test_replicas_elect_one_leader_and_followers_serve_everything(cluster):
    start, token = cluster
    procs = start(3)
    leader = one_leader(procs)
    followers = [p for p in procs if p is not leader]
    states = [health(p) for p in procs]
    assert len({s["replica_id"] for s in states}) == 3
    assert {s["leader_epoch"] for s in states} == {health(leader)["leader_epoch"]}
    a, b = (Http(f.url, token) for f in followers)
    a("POST", "/api/v1/fleets", 201, json={"name": "gpu-a"})
    join = b("POST", "/api/v1/fleets/gpu-a/join-tokens", 201, json={}).json()["token"]
    node = StandIn(a, join, "host-1")
    # The node's acquire waits on one follower; the job goes to the other; the leader places it.
    # Without a wake-up across replicas the acquire would only find it when its 30 s wait ends.
    found = []
    waiter = threading.Thread(target=lambda: found.append(node.acquire(30)), daemon=True)
    waiter.start()
    job = b(
        "POST",
        "/api/v1/jobs",
        201,
        json={"name": "j", "command": ["true"], "resources": {"gpus": 1}},
    ).json()
    waiter.join(15)
    assert found and found[0] is not None and found[0]["job_id"] == job["id"], found
    node.call(found[0], "start", pid=42)
    node.call(found[0], "finish", outcome="succeeded", exit_code=0)
    done = b("GET", f"/api/v1/jobs/{job['id']}?wait_seconds=10", 200).json()
    assert done["state"] == "succeeded"
    metrics = Http(leader.url, token)("GET", "/metrics", 200).text
    assert (
        "fleetd_leader{" in metrics
        and "} 1.0" in metrics.split("fleetd_leader{")[1].splitlines()[0]
    )


def test_kill_of_the_leader_hands_the_lead_over_and_work_goes_on(cluster):
    start, token = cluster
    procs = start(2)
    leader = one_leader(procs)
    follower = next(p for p in procs if p is not leader)
    http = Http(follower.url, token)
    http("POST", "/api/v1/fleets", 201, json={"name": "gpu-a"})
    join = http("POST", "/api/v1/fleets/gpu-a/join-tokens", 201, json={}).json()["token"]
    node = StandIn(http, join, "host-1")
    epoch = health(leader)["leader_epoch"]
    submitted = [
        http(
            "POST",
            "/api/v1/jobs",
            201,
            json={"name": f"j{i}", "command": ["true"], "resources": {"gpus": 1}},
        ).json()["id"]
        for i in range(3)
    ]
    leader.kill()  # kill -9
    new = one_leader([follower])
    assert health(new)["leader_epoch"] > epoch
    # Every acknowledged job runs exactly once through the survivor; the node is never declared
    # lost.
    finished = {}
    for _ in range(60):
        node.heartbeat([])
        assignment = node.acquire(5)
        if assignment is None:
            if len(finished) == len(submitted):
                break
            continue
        node.call(assignment, "start", pid=42)
        node.call(assignment, "finish", outcome="succeeded", exit_code=0)
        finished[assignment["job_id"]] = finished.get(assignment["job_id"], 0) + 1
    assert finished == {job_id: 1 for job_id in submitted}
    assert {http("GET", f"/api/v1/jobs/{j}", 200).json()["state"] for j in submitted} == {
        "succeeded"
    }
    assert http("GET", f"/api/v1/nodes/{node.node_id}", 200).json()["status"] == "ready"


def test_a_paused_leader_is_fenced_off_and_comes_back_as_a_follower(cluster):
    start, token = cluster
    procs = start(2)
    leader = one_leader(procs)
    other = next(p for p in procs if p is not leader)
    epoch = health(leader)["leader_epoch"]
    leader.signal(signal.SIGSTOP)
    try:
        assert one_leader([other]) is other
    finally:
        leader.signal(signal.SIGCONT)
    wait_until(
        lambda: (health(leader) or {}).get("leader") is False,
        30,
        message="the old leader to see it lost the lead",
    )
    assert health(other)["leader"] and health(other)["leader_epoch"] > epoch
    assert leaders(procs) == [other]
    leader.signal(signal.SIGTERM)  # a restart: it comes back as a follower
    leader.wait(30)
    back = leader.start()
    assert health(back)["leader"] is False and leaders(procs) == [other]


def test_a_stale_leaders_write_is_refused_by_the_fence(replica_db):
    """Two leaderships in one process on the real database: the one whose lease lapsed and was
    taken over cannot write for leadership, even if it still believes it leads (a paused
    process)."""
    from fleetd.db import bind, database, open_database, upgrade
    from fleetd.replicas import Fenced, Leadership

    db = bind(open_database(replica_db))
    upgrade(db)
    try:
        old = Leadership(lease_seconds=1, shared=True, monotonic=lambda: 0.0)
        assert old.tick() and old.epoch == 1
        new = Leadership(lease_seconds=1, shared=True)
        wait_until(new.tick, 10, message="the lease to lapse and the new replica to take it")
        assert new.epoch == 2
        with database.atomic():
            new.fence()  # the holder's write goes through
        with pytest.raises(Fenced, match="fenced off"), database.atomic():
            old.fence()  # still 'valid' by its own stopped clock: the database says no
    finally:
        db.close()


def test_sqlite_serves_one_process(tmp_path):
    data = tmp_path / "data"
    fleetd_init(data)
    first = FleetdProcess(data).start()
    try:
        second = subprocess.run(
            fleetd_cmd("serve", "--bind", "127.0.0.1:0", "--data-dir", str(data)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert (
            "already uses this SQLite database" in second.stderr
            and str(first.proc.pid) in second.stderr
        )
        assert health(first)["leader"] is True
    finally:
        first.kill()


def test_a_deposed_leader_neither_writes_nor_enforces_a_drain_deadline(replica_db, make_app, clock):
    """In-process on the real database: this app's replica still believes it leads (a paused process
    whose clock has not moved), another one took the lease. Its heartbeat path, drain deadlines,
    token clean-up, metric samples and garbage collection commit nothing; the holder's do."""
    from fleetd.db import database
    from fleetd.models import ApiToken, GpuSample, Task
    from fleetd.replicas import Leadership

    app = make_app(db_url=replica_db, failover_grace_seconds=0)
    rt = app.extensions["fleetd"]
    old = rt.leader = Leadership(lease_seconds=1, shared=True, monotonic=lambda: 0.0)
    assert old.tick() and old.epoch == 1
    with database.connection_context():
        api = ApiClient(app, issue_first_admin_token(clock.now()))
    api.create_fleet("gpu-a")
    node, session = api.ready_node(api.create_join_token("gpu-a"), "n1", gpu_count=1)
    job = api.submit(resources={"gpus": 1})
    task = api.start_task(session)
    running = [{"id": task["task_id"], "epoch": task["epoch"], "state": "running"}]
    resp = api.post(
        f"/api/v1/nodes/{node}/drain", {"reason": "maintenance", "deadline_seconds": 30}
    )
    assert resp.status_code == 200 and resp.get_json()["status"] == "draining", resp.get_json()
    revoked = api.post("/api/v1/tokens", {"name": "gone", "role": "submitter"}).get_json()["id"]
    assert api.delete(f"/api/v1/tokens/{revoked}").status_code == 204

    new = Leadership(lease_seconds=1, shared=True)
    wait_until(new.tick, 10, message="the lease to lapse and another replica to take it")
    assert new.epoch == 2 and old.leading()  # by its own stopped clock, the old one still leads
    clock.advance(
        rt.settings.token_retention_seconds + 60
    )  # the drain deadline and the token's retention are past

    def counts():
        with database.connection_context():
            return (
                Task.get_by_id(task["task_id"]).state,
                ApiToken.select().where(ApiToken.id == revoked).count(),
                GpuSample.select().count(),
            )

    # A fence that refuses teaches the replica it lost the lead: each path below comes first.
    def paused():
        old._valid_until = old.lease_seconds - old.margin

    before = counts()
    assert before[:2] == ("running", 1)
    paused()
    api.heartbeat(session, tasks=running)  # the deadline is due: only the leader may act on it
    assert not old.leading()  # its fence refused, and it knows now
    for name in ("drains", "token_cleanup", "metrics_sampler", "gc"):  # each has something to write
        paused()
        result = api.post(f"/api/v1/admin/tasks/{name}/run").get_json()
        assert result["last_status"] == "error" and result["last_error"].startswith("Fenced: "), (
            name,
            result,
        )
    assert counts() == before
    assert api.node(node)["status"] == "draining" and api.job(job["id"])["state"] == "running"

    rt.leader = new  # the holder: the same work goes through
    api.heartbeat(session, tasks=running)
    assert api.node(node)["status"] == "drained"
    assert api.run_task("token_cleanup")["api_tokens"] == 1
    after = counts()
    assert after[0] != "running" and after[1] == 0
