"""Node states: liveness with an injected clock, drain, cordon, revoke, delete, restarts."""

import peewee
import pytest

from tests.conftest import ApiClient, admin_client, gpus


@pytest.fixture
def ready_node(api):
    """A registered node that has sent its first heartbeat: (node_id, session_token)."""
    return _enrol(api)


def _statuses(api, node_id):
    return [
        (e["from_status"], e["to_status"])
        for e in api.get(f"/api/v1/nodes/{node_id}/events").get_json()["items"]
        if e["kind"] == "node.status"
    ]


# ---------------------------------------------------------------- liveness


def test_node_silent_for_ttl_plus_grace_becomes_lost_and_returns_on_heartbeat(make_app, clock):
    app = make_app(node_ttl_seconds=30, node_grace_seconds=10, failover_grace_seconds=0)
    api = admin_client(app, clock)
    node_id, session = _enrol(api)
    clock.advance(40)
    assert api.run_task("liveness_sweep")["lost"] == 0  # exactly TTL + grace: not yet
    assert api.node(node_id)["status"] == "ready"
    clock.advance(1)
    assert api.run_task("liveness_sweep")["lost"] == 1
    node = api.node(node_id)
    assert node["status"] == "lost" and node["status_reason"] == "no heartbeat for 41s"
    assert api.heartbeat(session)["status"] == "ready"
    assert _statuses(api, node_id)[-2:] == [("ready", "lost"), ("lost", "ready")]


def test_lost_node_returns_to_its_previous_state(make_app, clock):
    app = make_app(failover_grace_seconds=0)
    api = admin_client(app, clock)
    node_id, session = _enrol(api)
    api.post(f"/api/v1/nodes/{node_id}/cordon")
    clock.advance(41)
    api.run_task("liveness_sweep")
    assert api.node(node_id)["status"] == "lost"
    assert api.heartbeat(session)["status"] == "cordoned"


def test_heartbeats_keep_a_node_ready(make_app, clock):
    app = make_app(failover_grace_seconds=0)
    api = admin_client(app, clock)
    node_id, session = _enrol(api)
    for _ in range(10):
        clock.advance(20)
        api.heartbeat(session)
        assert api.run_task("liveness_sweep")["lost"] == 0
    node = api.node(node_id)
    assert node["status"] == "ready"
    assert node["last_heartbeat_at"] == "2026-01-01T12:03:20.000Z"


def test_no_node_is_declared_lost_during_failover_grace_after_restart(make_app, clock):
    api = admin_client(make_app(), clock)
    node_id, _ = _enrol(api)
    clock.advance(300)  # fleetd is down for five minutes
    restarted = ApiClient(make_app(), api.token)  # failover grace defaults to 2 x TTL = 60 s
    clock.advance(59)
    assert restarted.run_task("liveness_sweep")["lost"] == 0
    assert restarted.node(node_id)["status"] == "ready"
    clock.advance(2)
    assert restarted.run_task("liveness_sweep")["lost"] == 1
    assert restarted.node(node_id)["status"] == "lost"


def test_node_that_heartbeats_during_failover_grace_is_not_lost_after_it(make_app, clock):
    api = admin_client(make_app(), clock)
    node_id, session = _enrol(api)
    restarted = ApiClient(make_app(), api.token)
    clock.advance(50)
    restarted.heartbeat(session)
    clock.advance(30)  # grace over; last heartbeat 30 s ago
    assert restarted.run_task("liveness_sweep")["lost"] == 0
    assert restarted.node(node_id)["status"] == "ready"


def test_sweeper_saves_last_heartbeat_times_in_a_batch(make_app, clock):
    api = admin_client(make_app(), clock)
    node_id, session = _enrol(api)
    clock.advance(5)
    api.heartbeat(session)
    assert api.run_task("liveness_sweep")["heartbeats_saved"] == 1
    assert api.run_task("liveness_sweep")["heartbeats_saved"] == 0
    restarted = ApiClient(make_app(), api.token)
    assert restarted.node(node_id)["last_heartbeat_at"] == "2026-01-01T12:00:05.000Z"


def _enrol_many(api, count):
    """`count` nodes of fleet gpu-a that have sent their first heartbeat: [(node_id, session)]."""
    api.create_fleet("gpu-a")
    join = api.create_join_token("gpu-a")
    nodes = []
    for i in range(count):
        reg = api.register(join, machine_id=f"machine-{i}", hostname=f"gpu-host-{i}")
        api.heartbeat(reg["session_token"])
        nodes.append((reg["node_id"], reg["session_token"]))
    return nodes


def test_a_sweep_that_loses_many_nodes_lets_heartbeats_in_between(make_app, clock):
    app = make_app(failover_grace_seconds=0)
    api = admin_client(app, clock)
    nodes = [node_id for node_id, _ in _enrol_many(api, 3)]
    rt = app.extensions["fleetd"]
    paused = []

    def pause():  # as the event loop would: the other nodes' heartbeats arrive meanwhile
        paused.append(1)
        for node_id in nodes:
            if rt.liveness.get(node_id) is not None:  # a node found lost is forgotten
                rt.liveness.touch(node_id)

    rt.pause = pause
    clock.advance(41)
    assert api.run_task("liveness_sweep")["lost"] == 1
    assert paused == [1, 1]  # before each node after the first one lost
    assert sorted(api.node(node_id)["status"] for node_id in nodes) == ["lost", "ready", "ready"]


def test_heartbeat_times_are_written_down_in_chunks_and_kept_when_one_fails(
    make_app, clock, monkeypatch
):
    from fleetd.services.fleet_ops import replication

    api = admin_client(make_app(), clock)
    nodes = _enrol_many(api, 3)
    assert api.run_task("liveness_sweep")["heartbeats_saved"] == 3
    clock.advance(5)
    for _, session in nodes:
        api.heartbeat(session)
    monkeypatch.setattr(replication, "HEARD_CHUNK", 1)
    write, calls = replication.record_heartbeat_times, []

    def second_write_fails(times):
        calls.append(times)
        if len(calls) == 2:
            raise peewee.OperationalError("database is locked")
        return write(times)

    monkeypatch.setattr(replication, "record_heartbeat_times", second_write_fails)
    assert api.run_task("liveness_sweep")["heartbeats_saved"] == 1  # the first chunk landed
    assert api.run_task("liveness_sweep")["heartbeats_saved"] == 2  # the rest, kept, next round
    restarted = ApiClient(make_app(), api.token)
    for node_id, _ in nodes:
        assert restarted.node(node_id)["last_heartbeat_at"] == "2026-01-01T12:00:05.000Z"


def _enrol(api):
    """A fleet gpu-a with one node that has sent its first heartbeat: (node_id, session_token)."""
    api.create_fleet("gpu-a")
    reg = api.register(api.create_join_token("gpu-a"))
    api.heartbeat(reg["session_token"])
    return reg["node_id"], reg["session_token"]


# ---------------------------------------------------------------- admin actions


def test_cordon_and_uncordon(api, ready_node):
    node_id, session = ready_node
    assert api.post(f"/api/v1/nodes/{node_id}/cordon").get_json()["status"] == "cordoned"
    assert api.heartbeat(session)["status"] == "cordoned"
    assert api.post(f"/api/v1/nodes/{node_id}/uncordon").get_json()["status"] == "ready"
    assert _statuses(api, node_id)[-2:] == [("ready", "cordoned"), ("cordoned", "ready")]


def test_drain_of_an_idle_node_completes_at_once_with_reason_and_deadline(api, ready_node, clock):
    node_id, session = ready_node
    node = api.post(
        f"/api/v1/nodes/{node_id}/drain", {"reason": "BIOS update", "deadline_seconds": 600}
    ).get_json()
    assert node["status"] == "drained"
    assert node["drain"] == {
        "reason": "BIOS update",
        "started_at": "2026-01-01T12:00:00.000Z",
        "deadline": "2026-01-01T12:10:00.000Z",
        "repair": False,
    }
    assert api.heartbeat(session)["drain"]["reason"] == "BIOS update"
    assert _statuses(api, node_id)[-2:] == [("ready", "draining"), ("draining", "drained")]


def test_drain_waits_for_running_tasks_until_they_finish(api, ready_node):
    node_id, session = ready_node
    job = api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    assert (
        api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "r"}).get_json()["status"]
        == "draining"
    )
    assert api.run_task("drains") == {"drained": 0, "requeued_jobs": 0}
    assert (
        api.submit(name="later", resources={"gpus": 1})["state"] == "queued"
    )  # draining takes no new work
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    assert api.get(f"/api/v1/jobs/{job['id']}").get_json()["state"] == "succeeded"
    assert api.heartbeat(session)["status"] == "drained"


def test_drain_deadline_stops_and_requeues_running_tasks(api, ready_node, clock):
    node_id, session = ready_node
    job = api.submit(resources={"gpus": 1}, retry={"max_attempts": 1, "on": []})
    assignment = api.start_task(session)
    running = [{"id": assignment["task_id"], "epoch": assignment["epoch"], "state": "running"}]
    api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "r", "deadline_seconds": 60})
    clock.advance(30)
    assert api.heartbeat(session, tasks=running)["cancel"] == []
    assert api.run_task("drains") == {"drained": 0, "requeued_jobs": 0}
    clock.advance(31)
    assert api.run_task("drains") == {"drained": 1, "requeued_jobs": 1}
    node = api.node(node_id)
    assert node["status"] == "drained" and "stopped and requeued" in node["status_reason"]
    assert api.heartbeat(session, tasks=running)["cancel"] == [assignment["task_id"]]
    requeued = api.get(f"/api/v1/jobs/{job['id']}").get_json()
    assert (
        requeued["state"] == "queued" and requeued["attempt"] == 2
    )  # requeued despite max_attempts 1
    api.task_call(session, assignment, "finish", expect=409, outcome="cancelled")


def test_undrain_returns_the_node_to_ready_and_clears_the_drain(api, ready_node):
    node_id, _ = ready_node
    api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "r"})
    node = api.post(f"/api/v1/nodes/{node_id}/undrain").get_json()
    assert node["status"] == "ready" and node["drain"] is None


@pytest.mark.parametrize(
    "setup, action, body",
    [
        ("drain", "cordon", None),
        ("drain", "drain", {"reason": "again"}),
        ("drain", "uncordon", None),
        (None, "undrain", None),
        ("revoke", "cordon", None),
        ("revoke", "undrain", None),
    ],
)
def test_invalid_transitions_are_refused_with_409(api, ready_node, setup, action, body):
    node_id, _ = ready_node
    if setup:
        api.post(f"/api/v1/nodes/{node_id}/{setup}", {"reason": "maintenance"})
    before = api.node(node_id)["status"]
    resp = api.post(f"/api/v1/nodes/{node_id}/{action}", body or {})
    assert resp.status_code == 409 and resp.get_json()["error"]["code"] == "conflict"
    assert api.node(node_id)["status"] == before


def test_drained_and_cordoned_nodes_stay_so_across_a_restart(make_app, clock):
    api = admin_client(make_app(), clock)
    drained, s1 = _enrol(api)
    api.create_fleet("gpu-b")
    reg = api.register(api.create_join_token("gpu-b"), machine_id="machine-2")
    api.heartbeat(reg["session_token"])
    cordoned = reg["node_id"]
    api.post(f"/api/v1/nodes/{drained}/drain", {"reason": "disk swap"})
    api.post(f"/api/v1/nodes/{cordoned}/cordon")
    restarted = ApiClient(make_app(), api.token)
    assert restarted.node(drained)["status"] == "drained"
    assert restarted.node(drained)["drain"]["reason"] == "disk swap"
    assert restarted.node(cordoned)["status"] == "cordoned"
    assert restarted.heartbeat(s1)["status"] == "drained"
    assert restarted.heartbeat(reg["session_token"])["status"] == "cordoned"


def test_revoked_node_loses_its_session_and_is_told_to_stop_all_work(api, ready_node):
    node_id, session = ready_node
    assert api.post(f"/api/v1/nodes/{node_id}/revoke").get_json()["status"] == "revoked"
    reply = api.heartbeat(session, tasks=[{"id": "t1", "epoch": 1, "state": "running"}])
    assert reply["revoked"] is True and reply["cancel"] == ["t1"] and reply["status"] == "revoked"
    resp = api.post("/api/v1/agent/deregister", token=session, agent=True)
    assert resp.status_code == 401
    assert api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "x"}).status_code == 409


def test_revoked_node_can_re_enrol_only_with_a_new_join_token(api, ready_node):
    node_id, _ = ready_node
    api.post(f"/api/v1/nodes/{node_id}/revoke")
    reg = api.register(api.create_join_token("gpu-a"))
    assert reg["node_id"] == node_id
    assert api.node(node_id)["status"] == "pending"
    assert api.heartbeat(reg["session_token"])["status"] == "ready"


def test_delete_is_refused_while_tasks_run_and_allowed_after(api, ready_node):
    node_id, session = ready_node
    api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    resp = api.delete(f"/api/v1/nodes/{node_id}")
    assert resp.status_code == 409 and resp.get_json()["error"]["details"]["tasks"] == [
        assignment["task_id"]
    ]
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    assert api.delete(f"/api/v1/nodes/{node_id}").status_code == 204
    assert api.get(f"/api/v1/nodes/{node_id}").status_code == 404
    api.heartbeat(session, expect=401)
    kinds = [e["kind"] for e in api.get(f"/api/v1/nodes/{node_id}/events").get_json()["items"]]
    assert kinds[-1] == "node.deleted"


def test_fleet_with_enrolled_nodes_cannot_be_deleted(api, ready_node):
    node_id, _ = ready_node
    resp = api.delete("/api/v1/fleets/gpu-a")
    assert resp.status_code == 409 and resp.get_json()["error"]["details"] == {"node_count": 1}
    api.delete(f"/api/v1/nodes/{node_id}")
    assert api.delete("/api/v1/fleets/gpu-a").status_code == 204


# ---------------------------------------------------------------- listing


def test_node_list_filters_and_paginates_in_sql(api):
    api.create_fleet("gpu-a")
    api.create_fleet("gpu-b")
    ja, jb = api.create_join_token("gpu-a"), api.create_join_token("gpu-b")
    ids = [api.register(ja if i % 2 else jb, machine_id=f"m-{i}")["node_id"] for i in range(7)]
    api.post(f"/api/v1/nodes/{ids[1]}/revoke")
    seen, cursor, pages = [], None, 0
    while pages < 10:
        page = api.get(
            "/api/v1/nodes", query_string={"limit": 3, **({"cursor": cursor} if cursor else {})}
        ).get_json()
        seen += [n["id"] for n in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == sorted(ids) and pages == 3
    fleet_a = api.get("/api/v1/nodes?fleet=gpu-a").get_json()["items"]
    assert {n["id"] for n in fleet_a} == set(ids[1::2])
    assert [n["id"] for n in api.get("/api/v1/nodes?status=revoked").get_json()["items"]] == [
        ids[1]
    ]


def test_the_hostname_filter_finds_every_node_of_that_hostname_for_admins_and_submitters(api):
    api.create_fleet("gpu-a")
    join = api.create_join_token("gpu-a")
    twins = [api.register(join, machine_id=f"m-{i}", hostname="twin")["node_id"] for i in range(2)]
    other = api.register(join, machine_id="m-other", hostname="twin-2")["node_id"]
    submitter = ApiClient(api.app, api.create_token("submitter"))
    for client in (api, submitter):
        assert [
            n["id"] for n in client.get("/api/v1/nodes?hostname=twin").get_json()["items"]
        ] == twins
        assert [
            n["id"] for n in client.get("/api/v1/nodes?hostname=twin-2").get_json()["items"]
        ] == [other]
        assert client.get("/api/v1/nodes?hostname=twi").get_json()["items"] == []


def test_node_events_after_an_id(api, ready_node):
    node_id, _ = ready_node
    events = api.get(f"/api/v1/nodes/{node_id}/events").get_json()["items"]
    later = api.get(f"/api/v1/nodes/{node_id}/events?after={events[0]['id']}").get_json()["items"]
    assert later == events[1:]
    assert {"id", "at", "kind", "subject", "from_status", "to_status", "reason"} <= set(events[0])


def test_cpu_only_hosts_are_told_apart_from_hosts_whose_driver_failed(api):
    api.create_fleet("gpu-a")
    token = api.create_join_token("gpu-a", max_uses=10)
    gpu_node, gpu_session = api.ready_node(token, "gpu-host")
    cpu = api.register(token, machine_id="cpu-host", hostname="cpu-host", gpu_count=0)
    broken = api.register(token, machine_id="broken-host", hostname="broken-host", gpu_count=0)
    assert api.node(gpu_node)["gpu_status"] == "ok"
    assert api.node(cpu["node_id"])["gpu_status"] == "cpu_only"
    api.heartbeat(
        cpu["session_token"],
        metrics={
            "devices_reason": "no NVIDIA driver: NVML init failed: NVML Shared Library Not Found"
        },
    )
    api.heartbeat(
        broken["session_token"],
        metrics={
            "devices_reason": "no NVIDIA driver: NVML init failed: Driver/library version mismatch"
        },
    )
    shown = {
        n["hostname"]: (n["gpu_status"], n["gpu_status_reason"])
        for n in api.get("/api/v1/nodes").get_json()["items"]
    }
    assert shown["cpu-host"][0] == "cpu_only" and "Library Not Found" in shown["cpu-host"][1]
    assert shown["broken-host"] == (
        "driver_error",
        "no NVIDIA driver: NVML init failed: Driver/library version mismatch",
    )
    assert shown["gpu-host"] == ("ok", "")
    # The driver comes back with its GPUs: the host is a GPU host again, and its events say each
    # step.
    api.heartbeat(broken["session_token"], gpus=gpus(2), metrics={})
    assert api.node(broken["node_id"])["gpu_status"] == "ok"
    reasons = [
        e["reason"]
        for e in api.get(f"/api/v1/nodes/{broken['node_id']}/events").get_json()["items"]
    ]
    assert any(r.startswith("GPUs: driver_error") for r in reasons) and "GPUs: ok" in reasons
