"""JSON that no schema may let through: NaN, ±Infinity, 1e400, unpaired surrogates, NUL, 5000-digit
integers and 1000-deep nesting, anywhere in the body of every JSON-taking route.

Each one must be answered 400 `invalid_request` (never 2xx, never 5xx); afterwards no text or
number in any table holds such a value, and a scheduling pass still runs and places work.
The routes come from the app's own OpenAPI document, so a new route is covered without a
change here; BASE_BODIES gives each known route a valid body to hide the hostile value in.

Run: .venv/bin/pytest tests/fleetd/api/test_hostile_input.py -v
"""

import json
import math
import re
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import GPU_H100, admin_client, gpus
from tests.support.examples import examples

DEEP = 1000
# Raw JSON text, spliced into bodies as written: json.dumps cannot write most of these.
HOSTILE = {
    "nan": "NaN",
    "infinity": "Infinity",
    "-infinity": "-Infinity",
    "1e400": "1e400",
    "-1e400": "-1e400",
    "high surrogate": '"\\ud800"',
    "low surrogate": '"x\\udfffy"',
    "nul": '"\\u0000"',
    "nul inside": '"ab\\u0000cd"',
    "5000 digits": "9" * 5000,
    "-5000 digits": "-" + "9" * 5000,
    "deep list": "[" * DEEP + "]" * DEEP,
    "deep object": '{"a":' * DEEP + "1" + "}" * DEEP,
}
# Hostile object keys (a key is always a string, so only the string cases apply).
HOSTILE_KEYS = {"high surrogate key": '"\\ud800"', "nul key": '"k\\u0000"'}
SLOT = "\x01hostile\x01"  # placeholder replaced by the raw token after json.dumps
KEY_SLOT = "\x01hostile-key\x01"

TASK_EPOCH = "{epoch}"  # filled in from the seeded assignment
GPU_REPORT = dict(
    GPU_H100,
    uuid="GPU-hostile-0",
    serial="1650924060001",
    board_part_number="699-2G520-0200-000",
    vbios="96.00.74.00.01",
    xids=[79],
    ecc_uncorrected=0,
)
JOB_SPEC = {
    "name": "hostile",
    "command": ["sleep", "1"],
    "env": {"A": "b"},
    "workdir": "w",
    "num_nodes": 1,
    "resources": {
        "gpus": 1,
        "gpu_memory_bytes": 256 * 1024**2,
        "gpu_compute_percent": 50.0,
        "gpu_types": [GPU_H100["model"]],
        "cpus": 1.5,
        "memory_bytes": 1024,
    },
    "isolation": "shared",
    "priority_class": "spot",
    "bid": 1.5,
    "team": "team-a",
    "labels": {"k": "v"},
    "node_selector": {"fleet": "gpu-a", "labels": {"k": "v"}},
    "max_runtime_seconds": 60,
    "retry": {"max_attempts": 2, "on": ["failed"]},
}
# A valid body per route, so that the hostile value is the only thing wrong with it.
BASE_BODIES = {
    ("POST", "/api/v1/tokens"): {
        "name": "t",
        "role": "submitter",
        "team": "team-a",
        "expires_in_seconds": 3600,
        "unix_user": "alice",
        "limits": {
            "max_active_jobs": 10,
            "max_instances": 2,
            "max_spec_bytes": 4096,
            "max_artifact_bytes": 2**30,
            "requests_per_second": 50.5,
        },
    },
    ("PUT", "/api/v1/auth/providers/{name}"): {
        "kind": "oidc",
        "issuer": "http://127.0.0.1:9/idp",
        "client_id": "fleetd",
        "client_secret": "s",
        "audience": "fleetd",
        "jwks_url": "http://127.0.0.1:9/idp/jwks",
        "scopes": ["openid", "groups"],
        "claims": {
            "login": "preferred_username",
            "display_name": "name",
            "email": "email",
            "groups": "groups",
            "uid": "uid_number",
            "gid": "gid_number",
            "groups_gids": "gids",
        },
    },
    ("PUT", "/api/v1/auth/bindings"): [
        {
            "provider": "lab",
            "claim": "groups",
            "contains": "ml",
            "equals": None,
            "role": "member",
            "team": "team-a",
            "projects": [{"project": "{key}", "role": "member"}],
        }
    ],
    ("POST", "/api/v1/auth/device"): {"provider": "lab"},
    ("POST", "/api/v1/auth/device/token"): {"device_code": "dc", "provider": "lab"},
    ("POST", "/api/v1/auth/login"): {"provider": "lab", "id_token": "a.b.c"},
    ("POST", "/api/v1/auth/refresh"): {"refresh_token": "flr_x"},
    ("POST", "/api/v1/projects"): {
        "key": "vision",
        "name": "Vision",
        "display_name": "Vision lab",
        "team": "team-a",
        "description": "d",
    },
    ("PATCH", "/api/v1/projects/{key}"): {
        "name": "p",
        "display_name": "P",
        "team": "team-a",
        "description": "d",
    },
    ("PUT", "/api/v1/projects/{key}/members/{login}"): {"role": "member"},
    ("POST", "/api/v1/projects/{key}/service-accounts"): {"name": "ci", "expires_in_seconds": 3600},
    ("PATCH", "/api/v1/users/{login}"): {"role": "member", "default_project": "{key}"},
    ("PATCH", "/api/v1/tokens/{token_id}"): {
        "limits": {"max_active_jobs": 10, "max_instances": None, "requests_per_second": 2}
    },
    ("POST", "/api/v1/jobs/{job_id}/share"): {"expires_in_seconds": 3600},
    ("POST", "/api/v1/me/notifications/read"): {"up_to": 1},
    ("POST", "/api/v1/fleets"): {
        "name": "gpu-z",
        "description": "d",
        "labels": {"k": "v"},
        "availability": {"timezone": "UTC", "windows": [{"start": "08:00", "end": "18:00"}]},
        "health_policy": {
            "cordon_on_gpu_fault": True,
            "drain_after_seconds": 600,
            "uncordon_when_healthy": False,
        },
        "allow_root_tasks": True,
        "require_isolation": False,
        "allowed_images": ["quay.io/*"],
        "validation": {
            "checks": ["pcie_link"],
            "dcgm_level": 2,
            "command": ["nccl", "-g", "8"],
            "timeout_seconds": 60,
            "command_as_root": False,
            "expected_gpus": 8,
            "driver_version": "550.54.15",
            "cuda_version": "12.4",
            "mig_mode": "disabled",
            "max_temperature_c": 80,
            "pcie_width": 16,
        },
    },
    ("PATCH", "/api/v1/fleets/{name}"): {
        "description": "d",
        "labels": {"k": "v"},
        "health_policy": {"drain_after_seconds": None},
    },
    ("POST", "/api/v1/fleets/{name}/join-tokens"): {
        "ttl_seconds": 3600,
        "max_uses": 5,
        "description": "d",
    },
    ("POST", "/api/v1/nodes/{node_id}/cordon"): {"reason": "r"},
    ("POST", "/api/v1/nodes/{node_id}/drain"): {
        "reason": "r",
        "deadline_seconds": 60,
        "repair": True,
    },
    ("POST", "/api/v1/gpus/{serial}/rma"): {"reason": "r", "deadline_seconds": 60},
    ("POST", "/api/v1/agent/validations/{validation_id}"): {
        "checks": [
            {
                "name": "pcie_link",
                "gpu": 0,
                "uuid": "u",
                "serial": "s",
                "status": "failed",
                "detail": "d",
                "output": "o",
            }
        ],
        "system": {"driver_version": "550.54.15", "cuda_version": "12.4"},
    },
    ("PATCH", "/api/v1/nodes/{node_id}"): {"labels": {"rack": "r1"}},
    ("POST", "/api/v1/nodes/{node_id}/upgrade"): {"reason": "r", "deadline_seconds": 60},
    ("POST", "/api/v1/nodes/{node_id}/upgrade/end"): {"outcome": "failed", "detail": "d"},
    ("POST", "/api/v1/nodes/{node_id}/events"): {
        "kind": "node.bootstrap",
        "host": "h",
        "outcome": "enrolled",
    },
    ("POST", "/api/v1/rollouts"): {
        "fleet": "gpu-a",
        "bundle_version": "0.2.0",
        "bundle_sha256": "ab" * 32,
        "batch": "10%",
        "canary": 1,
        "max_failures": 0,
        "drain_deadline_seconds": 60,
        "window": {"timezone": "UTC", "windows": [{"start": "22:00", "end": "06:00"}]},
    },
    ("PATCH", "/api/v1/rollouts/{rollout_id}/nodes/{node_id}"): {
        "state": "upgrading",
        "detail": "d",
    },
    ("POST", "/api/v1/jobs"): JOB_SPEC,
    ("POST", "/api/v1/instances"): {
        "name": "nb",
        "command": ["sleep", "1d"],
        "env": {"A": "b"},
        "resources": {"gpus": 1, "gpu_types": ["x"]},
        "volume_bytes": 1024,
        "volume_mount_path": "/workspace",
        "ports": [{"port": 8888, "protocol": "http"}],
        "node_selector": {"fleet": "gpu-a", "labels": {"k": "v"}},
        "restart": "always",
        "idle_stop": {"gpu_util_below_percent": 5, "for_seconds": 600},
    },
    ("POST", "/api/v1/instances/{instance_id}/resume"): {"gpus": 1},
    ("POST", "/api/v1/cluster/simulate-schedule"): JOB_SPEC,
    ("PUT", "/api/v1/gpu-types/{model}"): {"price_per_hour": 1.5, "spot_min_bid": 0.5},
    ("PUT", "/api/v1/quotas/{team}"): {"priority_class": "spot", "max_gpus": 4.5},
    ("PUT", "/api/v1/budgets/{team}"): {
        "limit_cost": 100.0,
        "limit_gpu_hours": 10.0,
        "on_exceed": "block",
    },
    ("PUT", "/api/v1/budgets/project/{key}"): {"limit_cost": 50.0, "limit_gpu_hours": 5.0},
    ("PUT", "/api/v1/prices/storage"): {"per_gb_month": 0.1},
    ("POST", "/api/v1/admin/gc"): {
        "older_than_seconds": 3600,
        "delete_jobs": False,
        "dry_run": True,
    },
    ("POST", "/api/v1/webhooks"): {
        "url": "https://hooks.example.com/fleetd",
        "secret": "0123456789abcdef",
        "events": ["node.lost", "job.failed"],
    },
    ("POST", "/api/v1/agent/register"): {
        "hostname": "h",
        "machine_id": "m-hostile",
        "agent_version": "0.1.0",
        "address": "10.0.0.9",
        "labels": {"k": "v"},
        "resources": {"cpu_count": 8, "memory_bytes": 1024},
        "gpus": [GPU_REPORT],
        "topology": {
            "gpus": [GPU_REPORT["uuid"]],
            "links": [["self"]],
            "nvlink_count": [[0]],
            "nics": [
                {
                    "name": "mlx5_0",
                    "kind": "infiniband",
                    "pci_bus_id": "0000:19:00.0",
                    "links": ["pcie_switch"],
                }
            ],
        },
    },
    ("POST", "/api/v1/agent/heartbeat"): {
        "gpus": gpus(2),
        "metrics": {"gpu_util": [50.0, 1.5], "host": {"load": 0.5}},
        "tasks": [{"id": "{task_id}", "epoch": TASK_EPOCH, "state": "running"}],
        "capabilities": {
            "container_runtime": "podman",
            "isolation": "uid",
            "isolation_reason": "r",
            "containers": "unavailable: r",
            "host_uids": [1000],
        },
        "instances": [
            {
                "task_id": "{task_id}",
                "epoch": TASK_EPOCH,
                "uptime_seconds": 1.5,
                "restarts": 0,
                "ports": [{"port": 8888, "host_port": 40001, "state": "taken_by_other_process"}],
            }
        ],
    },
    ("POST", "/api/v1/agent/acquire"): {"wait_seconds": 0, "max_assignments": 1},
    ("POST", "/api/v1/agent/tasks/{task_id}/start"): {"epoch": TASK_EPOCH, "pid": 42},
    ("POST", "/api/v1/agent/tasks/{task_id}/restart"): {
        "epoch": TASK_EPOCH,
        "exit_code": 3,
        "signal": None,
        "reason": "exit code 3",
        "backoff_seconds": 1.0,
    },
    ("POST", "/api/v1/agent/tasks/{task_id}/rendezvous"): {
        "epoch": TASK_EPOCH,
        "addr": "10.0.0.1",
        "port": 29500,
    },
    ("POST", "/api/v1/agent/tasks/{task_id}/logs"): {
        "epoch": TASK_EPOCH,
        "lines": [["stdout", "a"], ["stderr", "b", 0]],
    },
    ("POST", "/api/v1/agent/tasks/{task_id}/finish"): {
        "epoch": TASK_EPOCH,
        "outcome": "succeeded",
        "exit_code": 0,
        "reason": "r",
    },
    ("POST", "/api/v1/agent/finish"): {
        "finishes": [
            {
                "task_id": "{task_id}",
                "epoch": TASK_EPOCH,
                "outcome": "succeeded",
                "exit_code": 0,
                "reason": "r",
            }
        ]
    },
}


class World:
    """An app with a fleet, a node running a task, and the tokens each kind of route needs."""

    def __init__(self, make_app, clock):
        self.app = make_app(long_poll_max_seconds=0)
        self.api = admin_client(self.app, clock)
        self.api.create_fleet("gpu-a")
        self.join = self.api.create_join_token("gpu-a")
        registered = self.api.register(self.join, gpu_count=2)
        self.session = registered["session_token"]
        self.node_id = registered["node_id"]
        self.api.heartbeat(self.session)
        seed = self.api.submit(name="seed", resources={"gpus": 1})
        self.api.run_task("scheduling")
        self.assignment = self.api.start_task(self.session)
        instance = self.api.post(
            "/api/v1/instances", {"name": "nb", "command": ["true"]}
        ).get_json()
        self.api.post(f"/api/v1/instances/{instance['id']}/stop")
        limited = self.api.post("/api/v1/tokens", {"name": "limited", "role": "metrics"}).get_json()
        self.api.post("/api/v1/projects", {"key": "proj-a", "team": "team-a"})
        self.api.put(
            "/api/v1/auth/providers/lab",
            {"kind": "oidc", "issuer": "http://127.0.0.1:9/idp", "client_id": "fleetd"},
        )
        self.api.post("/api/v1/tokens", {"name": "alice's", "role": "submitter", "user": "alice"})
        self.api.put("/api/v1/projects/proj-a/members/alice", {"role": "member"})
        rollout = self.api.post(
            "/api/v1/rollouts",
            {"fleet": "gpu-a", "bundle_version": "0.2.0", "bundle_sha256": "cd" * 32},
        ).get_json()
        self.values = {
            "name": "gpu-a",
            "node_id": self.node_id,
            "job_id": seed["id"],
            "task_id": self.assignment["task_id"],
            "rollout_id": rollout["id"],
            "serial": "1650924060001",
            "validation_id": "v-none",
            "instance_id": instance["id"],
            "token_id": limited["id"],
            "model": GPU_H100["model"],
            "team": "team-a",
            "key": "proj-a",
            "login": "alice",
            "epoch": self.assignment["epoch"],
        }
        self.routes = json_routes(self.app)

    def url(self, path):
        return re.sub(r"\{(\w+)\}", lambda m: str(self.values[m.group(1)]), path)

    def base(self, method, path, spec_fields):
        """The route's valid body with the seeded ids filled in; {} plus its fields for an unknown
        route."""
        body = BASE_BODIES.get((method, path))
        if body is None:
            return {name: None for name in spec_fields}
        return _fill(body, self.values)

    def send(self, method, path, raw):
        agent = path.startswith("/api/v1/agent/")
        token = (
            self.join
            if path == "/api/v1/agent/register"
            else self.session
            if agent
            else self.api.token
        )
        return self.api.call(
            method,
            self.url(path),
            token=token,
            agent=agent,
            data=raw,
            headers={"Content-Type": "application/json"},
        )


def _fill(value, values):
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    if value == TASK_EPOCH:
        return values["epoch"]
    if (
        isinstance(value, str)
        and value.startswith("{")
        and value.endswith("}")
        and value[1:-1] in values
    ):
        return values[value[1:-1]]
    return value


def json_routes(app):
    """[(method, path, top-level body fields)] of every operation whose request body is JSON."""
    spec = app.test_client().get("/api/openapi.json").get_json()
    schemas = spec.get("components", {}).get("schemas", {})
    out = []
    for path, item in sorted(spec["paths"].items()):
        for method, op in sorted(item.items()):
            if method not in ("post", "put", "patch", "delete", "get"):
                continue  # path-level "parameters"
            content = (op.get("requestBody") or {}).get("content", {})
            if "application/json" not in content:
                continue
            schema = content["application/json"].get("schema", {})
            if "$ref" in schema:
                schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
            out.append((method.upper(), path, sorted(schema.get("properties", {}))))
    return out


def places(body, prefix=()):
    """Every path in a body at which a value can be replaced: each key and each list element."""
    out = []
    if isinstance(body, dict):
        for key, value in body.items():
            out.append(prefix + (key,))
            out += places(value, prefix + (key,))
    elif isinstance(body, list):
        for i, value in enumerate(body):
            out.append(prefix + (i,))
            out += places(value, prefix + (i,))
    return out


def plant(body, where, key=False):
    """A copy of body with SLOT at `where` (or, with key, a KEY_SLOT key added to the object
    there)."""
    body = json.loads(json.dumps(body))
    if key:
        target = body
        for step in where:
            target = target[step]
        target[KEY_SLOT] = 1
        return body
    if not where:
        return SLOT
    target = body
    for step in where[:-1]:
        target = target[step]
    target[where[-1]] = SLOT
    return body


def raw_json(body, token):
    text = json.dumps(body)
    text = text.replace(json.dumps(SLOT), token).replace(json.dumps(KEY_SLOT), token)
    assert token in text
    return text


def objects_in(body, prefix=()):
    """Paths of every JSON object in a body (where a hostile key can be added)."""
    out = [prefix] if isinstance(body, dict) else []
    if isinstance(body, dict):
        for k, v in body.items():
            out += objects_in(v, prefix + (k,))
    elif isinstance(body, list):
        for i, v in enumerate(body):
            out += objects_in(v, prefix + (i,))
    return out


def refusal_problem(resp):
    """None when resp is 400 invalid_request in the envelope, else what is wrong with it."""
    body = resp.get_json(silent=True)
    ok = (
        resp.status_code == 400
        and isinstance(body, dict)
        and set(body) == {"error"}
        and body["error"].get("code") == "invalid_request"
    )
    return None if ok else f"{resp.status_code} {resp.get_data(as_text=True)[:200]}"


# --- the database scan -----------------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def _bad_text(text):
    if "\x00" in text:
        return "NUL"
    if _SURROGATE.search(text):
        return "unpaired surrogate"
    return None


def _bad_json(value):
    """What is wrong inside a decoded JSON value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"non-finite number {value!r}"
    if isinstance(value, str):
        return _bad_text(value)
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for k, v in items:
        found = (_bad_text(k) if isinstance(k, str) else None) or _bad_json(v)
        if found:
            return found
    return None


def _bad_stored(value):
    """What is wrong with one stored column value, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"non-finite REAL {value!r}"
    if not isinstance(value, bytes):
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "text that is not valid UTF-8 (an encoded surrogate?)"
    found = _bad_text(text)
    if found:
        return found
    if text[:1] in '[{"' or text in ("NaN", "Infinity", "-Infinity"):
        try:
            decoded = json.loads(
                text
            )  # NaN and Infinity decode to floats here: _bad_json finds them
        except ValueError:
            return None
        return _bad_json(decoded)
    return None


def poisoned_cells(db_path):
    """[(table, column, rowid, problem)] for every stored value holding NaN, ±Inf, a surrogate or
    NUL."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    con.text_factory = bytes
    found = []
    try:
        tables = [
            r[0].decode()
            for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        for table in tables:
            cur = con.execute(f'SELECT * FROM "{table}"')
            columns = [d[0] for d in cur.description]
            for n, row in enumerate(cur):
                for column, value in zip(columns, row):
                    problem = _bad_stored(value)
                    if problem:
                        found.append((table, column, n, problem, repr(value)[:120]))
    finally:
        con.close()
    return found


def _db_path(app):
    url = app.extensions["fleetd"].settings.database_url
    assert url.startswith("sqlite:///"), url
    return url[len("sqlite:///") :]


def scheduling_problem(world):
    """None when a scheduling pass runs and places a new job on the node's free GPU."""
    api = world.api
    resp = api.post("/api/v1/admin/tasks/scheduling/run")
    if resp.status_code != 200 or resp.get_json().get("last_status") != "ok":
        return f"scheduling pass: {resp.status_code} {resp.get_data(as_text=True)[:300]}"
    job = api.post("/api/v1/jobs", {"name": "after", "command": ["true"], "resources": {"gpus": 1}})
    if job.status_code != 201:
        return f"submit after the attack: {job.status_code} {job.get_data(as_text=True)[:300]}"
    api.post("/api/v1/admin/tasks/scheduling/run")
    state = api.get(f"/api/v1/jobs/{job.get_json()['id']}").get_json()
    if state["state"] == "pending":
        return f"a new job is not placed after the attack: {state.get('pending_reason')}"
    return None


@pytest.fixture
def world(make_app, clock):
    return World(make_app, clock)


def test_every_json_route_is_covered(world):
    """The sweep is only as good as its list: every JSON-taking route has a valid base body here."""
    found = {(method, path) for method, path, _ in world.routes}
    assert found, "no JSON-taking route found in the OpenAPI document"
    assert found - set(BASE_BODIES) == set(), "routes without a base body in BASE_BODIES"
    refused = {}
    for method, path, spec_fields in world.routes:
        resp = world.send(method, path, json.dumps(world.base(method, path, spec_fields)))
        if resp.status_code == 400:
            refused[(method, path)] = resp.get_json()
    assert refused == {}, (
        "base bodies must be valid, or the hostile value is not the only thing wrong"
    )


@pytest.mark.sweep  # every field of every route: full tier only (test.sh --fast skips it)
def test_hostile_json_at_every_field_of_every_route_is_refused_and_never_stored(world):
    """Each hostile value at each field (and as a key of each object) of each route's body: 400,
    nothing stored."""
    problems = []
    sent = 0
    for method, path, spec_fields in world.routes:
        base = world.base(method, path, spec_fields)
        cases = [(where, False) for where in [()] + places(base)] + [
            (where, True) for where in objects_in(base)
        ]
        for where, as_key in cases:
            tokens = HOSTILE_KEYS if as_key else HOSTILE
            for name, token in tokens.items():
                resp = world.send(method, path, raw_json(plant(base, where, key=as_key), token))
                sent += 1
                problem = refusal_problem(resp)
                if problem:
                    at = "/".join(map(str, where)) or "(whole body)"
                    problems.append(
                        f"{method} {path} {name} {'as a key in' if as_key else 'at'} {at}: "
                        f"{problem}"
                    )
    assert sent > 500
    stored = poisoned_cells(_db_path(world.app))
    scheduling = scheduling_problem(world)
    report = [
        f"{len(problems)} of {sent} hostile bodies not refused with 400 invalid_request:",
        *problems,
        f"{len(stored)} poisoned cells in the database:",
        *map(str, stored),
        f"scheduling after the attack: {scheduling or 'ok'}",
    ]
    assert not problems and not stored and scheduling is None, "\n".join(report)


@pytest.mark.sweep  # a fuzzer over every route: full tier only (test.sh --fast skips it)
def test_hostile_json_anywhere_in_any_body_is_refused(world):
    """Hypothesis picks the route, the place (any depth, value or key) and the hostile value."""
    routes = world.routes
    bases = {(m, p): world.base(m, p, f) for m, p, f in routes}

    @st.composite
    def attacks(draw):
        method, path, _ = draw(st.sampled_from(routes))
        base = bases[(method, path)]
        if draw(st.booleans()) and objects_in(base):
            where, tokens, as_key = draw(st.sampled_from(objects_in(base))), HOSTILE_KEYS, True
        else:
            where, tokens, as_key = draw(st.sampled_from([()] + places(base))), HOSTILE, False
        name = draw(st.sampled_from(sorted(tokens)))
        body = plant(base, where, key=as_key)
        # Sometimes wrap the hostile value one or two levels deeper, in a list or an object.
        wrap = draw(st.sampled_from(["", "list", "object"]))
        token = tokens[name]
        if not as_key and wrap == "list":
            token = f"[1, {token}]"
        elif not as_key and wrap == "object":
            token = f'{{"x": {token}}}'
        return method, path, name, where, as_key, raw_json(body, token)

    @settings(
        max_examples=examples(500),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(attack=attacks())
    def check(attack):
        method, path, name, where, as_key, raw = attack
        problem = refusal_problem(world.send(method, path, raw))
        assert problem is None, (method, path, name, where, as_key, raw[:300], problem)

    check()
    stored = poisoned_cells(_db_path(world.app))
    assert stored == [], stored
    assert scheduling_problem(world) is None


def test_the_database_scan_finds_each_kind_of_poison(tmp_path):
    """The scan above must be able to fail: values written past the API are all found."""
    path = tmp_path / "poisoned.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a, b)")
    poison = [
        (float("inf"), None),
        (float("-inf"), None),
        ("ab\x00cd", None),
        ("\ud800".encode("utf-8", "surrogatepass"), None),  # what a lone surrogate becomes on disk
        ('{"x": [1, NaN]}', None),
        ('{"x": "\\ud800"}', None),
        ('["\\u0000"]', None),
        ('{"\\udfff": 1}', None),
        (None, "Infinity"),
    ]
    con.executemany("INSERT INTO t VALUES (?, ?)", poison)
    con.executemany(
        "INSERT INTO t VALUES (?, ?)", [("fine", 1.5), ('{"x": [1, 2.5, "\\u00e9"]}', "NaNa")]
    )
    con.commit()
    con.close()
    found = poisoned_cells(path)
    assert sorted(row for _, _, row, _, _ in found) == list(range(len(poison))), found
