"""The HTTP clients of the tests: `ApiClient` (the JSON API through Flask's test client), `UiClient`
(the admin UI through Flask's test client, like a browser) and `Http` (requests to a real
`fleetd serve`)."""

import re

import requests

from tests.support.gpus import gpus
from tests.support.polling import wait_until

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


def register_body(machine_id="machine-1", hostname="gpu-host-1", gpu_count=2, **extra):
    """The body of an agent's registration of a host with `gpu_count` H100s."""
    body = {
        "hostname": hostname,
        "machine_id": machine_id,
        "agent_version": "0.1.0",
        "address": "10.0.0.1",
        "resources": {"cpu_count": 64, "memory_bytes": 512 * 1024**3},
        "gpus": gpus(gpu_count),
    }
    body.update(extra)
    return body


class ApiClient:
    """The Flask test client with a bearer token and the agent protocol header made easy."""

    def __init__(self, app, token=None):
        self.app = app
        self.http = app.test_client()
        self.token = token
        self.default_names = {}  # role -> tokens named by default so far

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

    def put(self, path, json=None, **kw):
        return self.call("PUT", path, json=json, **kw)

    def delete(self, path, **kw):
        return self.call("DELETE", path, **kw)

    # Factories: plain functions over the real API.

    def create_fleet(self, name="gpu-a", **body):
        resp = self.post("/api/v1/fleets", dict(name=name, **body))
        assert resp.status_code == 201, resp.get_json()
        return resp.get_json()

    def create_root_fleet(self, name="gpu-a", **body):
        """A fleet whose admins' work runs as root on its nodes (`allow_root_tasks`), for tests that
        are not about isolation and need the agent's own privileges."""
        return self.create_fleet(name, allow_root_tasks=True, **body)

    def create_join_token(self, fleet="gpu-a", **body):
        resp = self.post(f"/api/v1/fleets/{fleet}/join-tokens", body)
        assert resp.status_code == 201, resp.get_json()
        return resp.get_json()["token"]

    def create_token(self, role, name=None):
        """A new API token; its name by default `<role>-token`, then `<role>-token-2`, ... (names of
        live tokens are unique)."""
        if name is None:
            self.default_names[role] = self.default_names.get(role, 0) + 1
            count = self.default_names[role]
            name = f"{role}-token" if count == 1 else f"{role}-token-{count}"
        resp = self.post("/api/v1/tokens", {"name": name, "role": role})
        assert resp.status_code == 201, resp.get_json()
        return resp.get_json()["token"]

    def register(
        self,
        join_token,
        machine_id="machine-1",
        hostname="gpu-host-1",
        gpu_count=2,
        expect=201,
        **extra,
    ):
        body = register_body(machine_id, hostname, gpu_count, **extra)
        resp = self.post("/api/v1/agent/register", body, token=join_token, agent=True)
        assert resp.status_code == expect, resp.get_json()
        return resp.get_json()

    def heartbeat(self, session_token, expect=200, **body):
        body.setdefault("tasks", [])
        resp = self.post("/api/v1/agent/heartbeat", body, token=session_token, agent=True)
        assert resp.status_code == expect, resp.get_json()
        return resp.get_json()

    def ready_node(self, join_token, name, gpu_count=2):
        """Register a host as `name` and heartbeat once (it is ready); returns (node id, session
        token)."""
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
        resp = self.post(
            "/api/v1/agent/acquire", {"wait_seconds": wait_seconds}, token=session_token, agent=True
        )
        assert resp.status_code == 200, resp.get_json()
        return resp.get_json()["assignment"]

    def task_call(self, session_token, assignment, action, expect=204, **body):
        body.setdefault("epoch", assignment["epoch"])
        resp = self.post(
            f"/api/v1/agent/tasks/{assignment['task_id']}/{action}",
            body,
            token=session_token,
            agent=True,
        )
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


class UiClient:
    """A cookie-keeping test client that signs in like a browser and sends the page's CSRF token."""

    def __init__(self, app, base_url="http://localhost"):
        self.http = app.test_client()
        self.base_url = base_url
        self.csrf = None

    def get(self, path, **kw):
        resp = self.http.get(path, base_url=self.base_url, **kw)
        match = CSRF_RE.search(resp.get_data(as_text=True))
        if match:
            self.csrf = match.group(1)
        return resp

    def post(self, path, data=None, csrf=True, **kw):
        data = dict(data or {})
        if csrf:
            data.setdefault("csrf_token", self.csrf)
        resp = self.http.post(path, data=data, base_url=self.base_url, **kw)
        match = CSRF_RE.search(resp.get_data(as_text=True))
        if match:
            self.csrf = match.group(1)
        return resp

    def login(self, token, expect=302):
        self.get("/ui/login")
        resp = self.post("/ui/login", {"token": token})
        assert resp.status_code == expect, resp.get_data(as_text=True)
        return resp

    def text(self, path, expect=200):
        resp = self.get(path)
        assert resp.status_code == expect, resp.get_data(as_text=True)[:2000]
        return resp.get_data(as_text=True)


class Http:
    """requests against a real fleetd with a bearer token; `token` and `session` for callers that
    need them."""

    def __init__(self, url, token):
        self.url = url
        self.token = token
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def __call__(
        self, method, path, expect=None, agent_token=None, *, token=None, agent=False, **kw
    ):
        """One request: with `token` instead of this client's; `agent` adds the agent protocol
        header; `agent_token` is both. Headers given in `headers` come last. `expect`: the status it
        must answer."""
        if agent_token:
            token, agent = agent_token, True
        headers = {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if agent:
            headers["X-Fleet-Protocol"] = "1"
        headers.update(kw.pop("headers", None) or {})
        resp = self.session.request(method, self.url + path, headers=headers, timeout=30, **kw)
        if expect is not None:
            assert resp.status_code == expect, f"{method} {path}: {resp.status_code} {resp.text}"
        return resp

    def wait_node_ready(self, node_id, timeout=60):
        """Wait until the node reads `ready` (AssertionError after `timeout` seconds)."""
        wait_until(
            lambda: self("GET", f"/api/v1/nodes/{node_id}", expect=200).json()["status"] == "ready",
            timeout=timeout,
            message="the node ready",
        )

    def create_root_fleet(self, name="lab", **body):
        """A fleet whose admins' work runs as root on its nodes (`allow_root_tasks`): for tests of
        real agents that are not about isolation. Returns the fleet."""
        return self(
            "POST", "/api/v1/fleets", expect=201, json=dict(body, name=name, allow_root_tasks=True)
        ).json()
