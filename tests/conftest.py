"""Shared fixtures: a fresh SQLite database per test, an injected clock, API helpers, factories."""

import datetime as dt

import pytest

from fleetd import create_app
from fleetd.db import open_database, upgrade
from fleetd.services.tokens import issue_first_admin_token
from fleetd.settings import Settings

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)

GPU_H100 = {
    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    "index": 0,
    "vendor": "nvidia",
    "model": "NVIDIA H100 80GB HBM3",
    "memory_total_bytes": 80 * 1024**3,
    "numa_node": 0,
    "max_tflops": 989.0,
    "healthy": True,
    "health_reason": "",
    "mig_mode": "disabled",
}


def gpus(count, model=GPU_H100["model"]):
    """`count` distinct H100-like GPU reports."""
    return [dict(GPU_H100, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", index=i, model=model) for i in range(count)]


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start=T0):
        self._now = start
        self._mono = 1000.0

    def now(self):
        return self._now

    def monotonic(self):
        return self._mono

    def advance(self, seconds):
        self._now += dt.timedelta(seconds=seconds)
        self._mono += seconds


class ApiClient:
    """The Flask test client with a bearer token and the agent protocol header made easy."""

    def __init__(self, app, token=None):
        self.app = app
        self.http = app.test_client()
        self.token = token

    def call(self, method, path, token=..., agent=False, headers=None, **kwargs):
        headers = dict(headers or {})
        token = self.token if token is ... else token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if agent:
            headers["X-Fleet-Protocol"] = "1"
        return self.http.open(path, method=method, headers=headers, **kwargs)

    def get(self, path, **kw):
        return self.call("GET", path, **kw)

    def post(self, path, json=None, **kw):
        return self.call("POST", path, json={} if json is None else json, **kw)

    def patch(self, path, json=None, **kw):
        return self.call("PATCH", path, json=json, **kw)

    def delete(self, path, **kw):
        return self.call("DELETE", path, **kw)

    # Factories: plain functions over the real API.

    def create_fleet(self, name="gpu-a", **body):
        resp = self.post("/api/v1/fleets", dict(name=name, **body))
        assert resp.status_code == 201, resp.get_json()
        return resp.get_json()

    def create_join_token(self, fleet="gpu-a", **body):
        resp = self.post(f"/api/v1/fleets/{fleet}/join-tokens", body)
        assert resp.status_code == 201, resp.get_json()
        return resp.get_json()["token"]

    def create_token(self, role, name=None):
        resp = self.post("/api/v1/tokens", {"name": name or f"{role}-token", "role": role})
        assert resp.status_code == 201, resp.get_json()
        return resp.get_json()["token"]

    def register(self, join_token, machine_id="machine-1", hostname="gpu-host-1", gpu_count=2, expect=201, **extra):
        body = {
            "hostname": hostname,
            "machine_id": machine_id,
            "agent_version": "0.1.0",
            "address": "10.0.0.1",
            "resources": {"cpu_count": 64, "memory_bytes": 512 * 1024**3},
            "gpus": gpus(gpu_count),
        }
        body.update(extra)
        resp = self.post("/api/v1/agent/register", body, token=join_token, agent=True)
        assert resp.status_code == expect, resp.get_json()
        return resp.get_json()

    def heartbeat(self, session_token, expect=200, **body):
        body.setdefault("tasks", [])
        resp = self.post("/api/v1/agent/heartbeat", body, token=session_token, agent=True)
        assert resp.status_code == expect, resp.get_json()
        return resp.get_json()

    def ready_node(self, join_token, name, gpu_count=2):
        """Register a host as `name` and heartbeat once (it is ready); returns (node id, session token)."""
        reg = self.register(join_token, machine_id=name, hostname=name, gpu_count=gpu_count)
        self.heartbeat(reg["session_token"])
        return reg["node_id"], reg["session_token"]

    def job(self, job_id):
        """The JobStatus of a job."""
        return self.get(f"/api/v1/jobs/{job_id}").get_json()

    def submit(self, expect=201, **spec):
        spec.setdefault("name", "job")
        spec.setdefault("command", ["true"])
        resp = self.post("/api/v1/jobs", spec)
        assert resp.status_code == expect, resp.get_json()
        return resp.get_json()

    def acquire(self, session_token, wait_seconds=0):
        resp = self.post("/api/v1/agent/acquire", {"wait_seconds": wait_seconds}, token=session_token, agent=True)
        assert resp.status_code == 200, resp.get_json()
        return resp.get_json()["assignment"]

    def task_call(self, session_token, assignment, action, expect=204, **body):
        body.setdefault("epoch", assignment["epoch"])
        resp = self.post(f"/api/v1/agent/tasks/{assignment['task_id']}/{action}", body, token=session_token,
                         agent=True)
        assert resp.status_code == expect, resp.get_json()
        return resp

    def start_task(self, session_token):
        """Acquire the node's next assignment and report it started; returns the assignment."""
        assignment = self.acquire(session_token)
        assert assignment is not None
        self.task_call(session_token, assignment, "start", pid=4242)
        return assignment

    def node(self, node_id):
        resp = self.get(f"/api/v1/nodes/{node_id}")
        assert resp.status_code == 200, resp.get_json()
        return resp.get_json()

    def run_task(self, name):
        resp = self.post(f"/api/v1/admin/tasks/{name}/run")
        assert resp.status_code == 200, resp.get_json()
        assert resp.get_json()["last_status"] == "ok", resp.get_json()
        return resp.get_json()["last_result"]


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def make_settings(tmp_path):
    """Settings for a database in this test's directory; overrides as keyword arguments."""

    def make(**overrides):
        overrides.setdefault("data_dir", str(tmp_path / "data"))
        overrides.setdefault("auth_failure_limit", 10_000)
        overrides.setdefault("long_poll_max_seconds", 0.5)  # long polls in tests end quickly
        return Settings.load(environ={}, **overrides)

    return make


@pytest.fixture
def make_app(make_settings, clock):
    """Build an app over this test's database (calling it again is a restart of fleetd)."""
    opened = []

    def make(clock=clock, **overrides):
        settings = make_settings(**overrides)
        db = open_database(settings.database_url, settings.sqlite_synchronous)
        upgrade(db)
        opened.append(db)
        return create_app(settings, clock=clock, db=db)

    yield make
    for db in opened:
        db.close()


@pytest.fixture
def app(make_app):
    return make_app()


def admin_client(app, clock):
    """An ApiClient for `app` holding the first admin token of its database."""
    from fleetd.db import database

    with database.connection_context():
        return ApiClient(app, issue_first_admin_token(clock.now()))


@pytest.fixture
def api(app, clock):
    """An ApiClient holding the first admin token."""
    return admin_client(app, clock)
