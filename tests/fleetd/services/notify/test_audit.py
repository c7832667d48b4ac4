"""The audit trail: every Event says who caused it (token:<name>, node:<id> or fleetd)."""

import pytest

from tests.conftest import ApiClient, admin_client


def _events(api, path):
    resp = api.get(path)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["items"]


def _enrol(api, name="host-a", gpu_count=1):
    api.create_fleet()
    return api.ready_node(api.create_join_token(), name, gpu_count=gpu_count)


def test_cordon_by_a_named_token_records_that_token(api, app):
    node_id, _ = _enrol(api)
    ops = ApiClient(app, api.create_token("admin", name="night-ops"))
    assert ops.post(f"/api/v1/nodes/{node_id}/cordon").status_code == 200
    events = _events(api, f"/api/v1/nodes/{node_id}/events")
    cordon = [e for e in events if e["to_status"] == "cordoned"]
    assert [e["actor"] for e in cordon] == ["token:night-ops"]
    [night_ops] = [
        t["id"] for t in api.get("/api/v1/tokens").get_json()["items"] if t["name"] == "night-ops"
    ]
    assert [e["actor_token_id"] for e in cordon] == [night_ops]
    assert set(events[0]) == {
        "id",
        "at",
        "kind",
        "subject",
        "from_status",
        "to_status",
        "reason",
        "actor",
        "actor_token_id",
        "actor_via",
    }
    assert [e["actor_via"] for e in cordon] == ["token:night-ops"]
    # registration and the first heartbeat were the node's own doing
    first = [
        e for e in events if e["kind"] == "node.registered" or e["reason"] == "first heartbeat"
    ]
    assert {e["actor"] for e in first} == {f"node:{node_id}"} and len(first) == 2


def test_a_lost_node_is_fleetds_decision_even_when_an_admin_runs_the_sweep(make_app, clock):
    app = make_app(failover_grace_seconds=0)
    api = admin_client(app, clock)
    node_id, session = _enrol(api)
    clock.advance(41)
    assert api.run_task("liveness_sweep")["lost"] == 1
    lost = [e for e in _events(api, f"/api/v1/nodes/{node_id}/events") if e["to_status"] == "lost"]
    assert [e["actor"] for e in lost] == ["fleetd"]
    api.heartbeat(session)
    back = _events(api, f"/api/v1/nodes/{node_id}/events")[-1]
    assert (back["from_status"], back["to_status"], back["actor"]) == (
        "lost",
        "ready",
        f"node:{node_id}",
    )


def test_a_finish_report_is_the_nodes_and_the_submit_the_tokens(api, app):
    node_id, session = _enrol(api)
    ci = ApiClient(app, api.create_token("submitter", name="ci-bot"))
    job = ci.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    events = _events(ci, f"/api/v1/jobs/{job['id']}/events")
    by_kind = {}
    for e in events:
        by_kind.setdefault((e["kind"], e["to_status"]), e["actor"])
    assert by_kind[("job.submitted", "queued")] == "token:ci-bot"
    assert (
        by_kind[("job.state", "running")] == "fleetd"
    )  # the scheduler placed it, though the submit kicked
    assert by_kind[("task.state", "succeeded")] == f"node:{node_id}"
    assert by_kind[("job.state", "succeeded")] == f"node:{node_id}"


class _TestClient:
    """fleetd.client.Client over the Flask test client (the CLI's calls reach the real API)."""

    def __init__(self, api):
        self.api = api

    def __call__(self, url, token):
        return self

    def request(self, method, path, json=None, params=None, expect_json=True):
        resp = self.api.call(method, path, query_string=params, json=json)
        assert resp.status_code == 200, resp.get_json()
        return resp.get_json()

    def get(self, path, **params):  # as fleetd.client.Client.get: the CLI resolves names with it
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def paginate(self, path, **params):
        from fleetd.client import Client

        return Client.paginate(self, path, **params)


def test_node_events_in_the_cli_and_the_ui_show_the_actor(api, app, monkeypatch):
    from click.testing import CliRunner

    from fleetd.cli import cli, remote
    from tests.ui.conftest import UiClient

    node_id, _ = _enrol(api)
    ops = ApiClient(app, api.create_token("admin", name="night-ops"))
    ops.post(f"/api/v1/nodes/{node_id}/cordon")
    monkeypatch.setattr(remote, "Client", _TestClient(api))  # the client of every REST command
    out = CliRunner().invoke(cli, ["node", "events", node_id, "--url", "http://x", "--token", "t"])
    assert out.exit_code == 0, out.output
    assert (
        "ACTOR" in out.output
        and "token:night-ops" in out.output
        and f"node:{node_id}" in out.output
    )
    ui = UiClient(app)
    ui.login(api.token)
    page = ui.text(f"/ui/nodes/{node_id}")
    assert ">by</th>" in page and "<td>token:night-ops</td>" in page


def test_a_bootstrap_run_is_recorded_on_its_node_by_the_operators_token(api, app):
    node_id, _ = _enrol(api)
    ops = ApiClient(app, api.create_token("admin", name="rollout"))
    sha = "ab" * 32
    run = {
        "kind": "node.bootstrap",
        "host": "root@10.0.0.7:22",
        "outcome": "upgraded",
        "bundle_version": "0.1.1",
        "bundle_sha256": sha,
        "detail": "upgraded, restarted",
    }
    resp = ops.post(f"/api/v1/nodes/{node_id}/events", run)
    assert resp.status_code == 201, resp.get_json()
    event = resp.get_json()
    assert (event["kind"], event["subject"], event["actor"]) == (
        "node.bootstrap",
        f"node/{node_id}",
        "token:rollout",
    )
    # The host is named by the node's hostname, however the run reached it.
    assert event["reason"] == (
        f"bootstrap on host-a: upgraded; bundle 0.1.1, sha256 {sha}; upgraded, restarted"
    )
    assert _events(api, f"/api/v1/nodes/{node_id}/events")[-1] == event
    for reached in ("10.0.0.7", "host-a", "[fd00::7]:2222"):
        again = ops.post(f"/api/v1/nodes/{node_id}/events", {**run, "host": reached})
        assert again.get_json()["reason"].startswith("bootstrap on host-a: upgraded;"), reached


@pytest.mark.parametrize(
    "host, address",
    [
        ("root@10.0.0.7:22", "10.0.0.7"),
        ("10.0.0.7", "10.0.0.7"),
        ("ops@gpu-01", "gpu-01"),
        ("[fd00::7]:2222", "fd00::7"),
        ("fd00::7", "fd00::7"),
    ],
)
def test_a_host_without_a_hostname_is_named_by_its_address(host, address):
    from fleetd.services.nodes.nodes import host_address

    assert host_address(host) == address


def _session_of(app, clock, login):
    """The token of a signed-in session of the user `login` (as `fleetd login --provider` gets
    one)."""
    import datetime as dt

    from fleetd.credentials import SESSION_PREFIX, hash_token, make_token
    from fleetd.db import database
    from fleetd.models import AuthSession, User

    with app.app_context(), database.connection_context():
        user = User.get(User.login == login)
        session_id, token = make_token(SESSION_PREFIX)
        AuthSession.create(
            id=session_id,
            user_id=user.id,
            provider="lab",
            token_hash=hash_token(token),
            refresh_hash=hash_token(f"flr_{session_id}"),
            created_at=clock.now(),
            expires_at=clock.now() + dt.timedelta(hours=1),
            refresh_expires_at=clock.now() + dt.timedelta(days=14),
        )
    return token


def test_a_bootstrap_run_says_whether_a_tools_own_token_or_an_operators_session_made_it(
    api, app, clock
):
    api.create_fleet()
    resp = api.post("/api/v1/tokens", {"name": "ansible", "role": "admin"})
    ansible = resp.get_json()
    resp = api.post("/api/v1/tokens", {"name": "laptop", "role": "admin", "user": "alice"})
    laptop = resp.get_json()
    session = _session_of(app, clock, "alice")
    run = {"kind": "node.bootstrap", "host": "root@10.0.0.7:22", "outcome": "upgraded"}
    seen = {}
    for name, token in (
        ("ansible", ansible["token"]),
        ("laptop", laptop["token"]),
        ("session", session),
    ):
        tool = ApiClient(app, token)
        # The tool mints the join token the host enrols with: the registration names its maker.
        join = tool.post("/api/v1/fleets/gpu-a/join-tokens", {"max_uses": 1}).get_json()
        node_id, _ = api.ready_node(join["token"], f"host-{name}")
        recorded = tool.post(f"/api/v1/nodes/{node_id}/events", run)
        assert recorded.status_code == 201, recorded.get_json()
        events = _events(api, f"/api/v1/nodes/{node_id}/events")
        assert events[-1] == recorded.get_json()
        (registered,) = [e["reason"] for e in events if e["kind"] == "node.registered"]
        assert registered.startswith(f"registered in fleet gpu-a with join token {join['id']} ")
        seen[name] = (
            events[-1]["actor"],
            events[-1]["actor_token_id"],
            events[-1]["actor_via"],
            registered.partition(" made by ")[2],
        )
    assert seen == {
        "ansible": ("token:ansible", ansible["id"], "token:ansible", "token:ansible"),
        "laptop": ("user:alice", laptop["id"], "token:laptop", "user:alice (token:laptop)"),
        "session": ("user:alice", None, "session", "user:alice (session)"),
    }
    # Who made each join token is on its record too.
    makers = {
        t["created_by"] for t in api.get("/api/v1/fleets/gpu-a/join-tokens").get_json()["items"]
    }
    assert makers == {"token:ansible", "user:alice (token:laptop)", "user:alice (session)"}


def test_recording_a_bootstrap_run_is_for_admins_and_checks_what_it_records(api, app):
    node_id, _ = _enrol(api)
    good = {"kind": "node.bootstrap", "host": "h", "outcome": "enrolled"}
    submitter = ApiClient(app, api.create_token("submitter", name="ci-bot"))
    assert submitter.post(f"/api/v1/nodes/{node_id}/events", good).status_code == 403
    assert (
        api.post("/api/v1/nodes/no-such-node/events", good).get_json()["error"]["code"]
        == "not_found"
    )
    before = _events(api, f"/api/v1/nodes/{node_id}/events")
    for bad in (
        {**good, "kind": "node.status"},
        {**good, "outcome": "exploded"},
        {**good, "host": ""},
        {**good, "bundle_sha256": "xyz"},
        {**good, "detail": "x" * 1001},
        {"kind": "node.bootstrap"},
    ):
        resp = api.post(f"/api/v1/nodes/{node_id}/events", bad)
        assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "invalid_request", (
            bad,
            resp.get_json(),
        )
    assert _events(api, f"/api/v1/nodes/{node_id}/events") == before
