"""Instances over the real API, with the agent side spoken by the test: lifecycle, stop and
resume on the volume's node, spot interruption, lost nodes, connection, cost, bad input."""

import threading

import pytest

from fleetd.db import database
from fleetd.models import Event, Instance, Job
from fleetd.services.workloads import instances
from tests.conftest import ApiClient, admin_client


def create(api, expect=201, **spec):
    spec.setdefault("name", "nb")
    spec.setdefault("command", ["python3", "-m", "http.server"])
    spec.setdefault("resources", {"gpus": 1})
    resp = api.post("/api/v1/instances", spec)
    assert resp.status_code == expect, resp.get_json()
    return resp.get_json()


def show(api, instance_id):
    resp = api.get(f"/api/v1/instances/{instance_id}")
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def start(api, session, ports=()):
    """Acquire the node's instance assignment and report it started with these host ports."""
    assignment = api.acquire(session)
    assert assignment is not None and assignment["instance"] is not None
    api.task_call(
        session,
        assignment,
        "start",
        pid=4242,
        ports=[{"port": p, "host_port": h, "protocol": "http"} for p, h in ports],
    )
    return assignment


def finish(api, session, assignment, outcome="cancelled", **body):
    api.task_call(session, assignment, "finish", outcome=outcome, **body)


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    token = api.create_join_token("gpu-a")
    node, session = api.ready_node(token, "host-1", gpu_count=2)
    return token, node, session


def gpus_used(api):
    return api.get("/api/v1/cluster/status").get_json()["gpu"]["used"]


def test_an_instance_runs_stops_resumes_on_its_node_and_is_deleted(api, fleet):
    token, node, session = fleet
    inst = create(api, ports=[{"port": 8888}], volume_bytes=10 << 30)
    assert (
        inst["state"] == "starting" and inst["node_id"] == node
    )  # placed at once (no scheduler loop here)
    a = start(api, session, [(8888, 40001)])
    assert a["instance"] == {
        "id": inst["id"],
        "name": "nb",
        "restart": "on-failure",
        "ports": [{"port": 8888, "protocol": "http"}],
        "volume_bytes": 10 << 30,
        "volume_mount_path": "/workspace",
        "image": None,
        "idle_stop": None,
        "scratch_bytes": 0,
        "runtime_args": [],
    }
    assert a["max_runtime_seconds"] is None
    shown = show(api, inst["id"])
    assert shown["state"] == "running" and shown["runtime"]["ports"] == [
        {
            "private_port": 8888,
            "public_port": 40001,
            "ip": "10.0.0.1",
            "is_ip_public": False,
            "type": "http",
            "url": "http://10.0.0.1:40001/",
            "state": "unknown",
        }
    ]
    conn = api.get(f"/api/v1/instances/{inst['id']}/connection").get_json()
    assert conn == {
        "url": "http://10.0.0.1:40001/",
        "host": "10.0.0.1",
        "port": 40001,
        "protocol": "http",
    }
    assert gpus_used(api) == 1
    # The runs are not jobs of the user's.
    assert api.get("/api/v1/jobs").get_json()["items"] == []

    stopping = api.post(f"/api/v1/instances/{inst['id']}/stop").get_json()
    assert stopping["state"] == "stopping" and stopping["desired_state"] == "stopped"
    assert (
        a["task_id"]
        in api.post(
            "/api/v1/agent/acquire", {"wait_seconds": 0}, token=session, agent=True
        ).get_json()["cancel"]
    )
    finish(api, session, a, "cancelled", reason="stopped")
    stopped = show(api, inst["id"])
    assert stopped["state"] == "stopped" and stopped["runtime"] is None and gpus_used(api) == 0
    assert api.get(f"/api/v1/instances/{inst['id']}/connection").status_code == 409
    assert (
        api.post(f"/api/v1/instances/{inst['id']}/stop").status_code == 200
    )  # stopping twice: idempotent

    # Another node joins: the resumed run still goes back to the node with the volume.
    other, other_session = api.ready_node(token, "host-2", gpu_count=8)
    resumed = api.post(f"/api/v1/instances/{inst['id']}/resume", {}).get_json()
    assert resumed["state"] == "starting" and resumed["node_id"] == node and resumed["runs"] == 2
    assert api.acquire(other_session) is None
    again = start(api, session, [(8888, 40001)])
    assert again["task_id"] != a["task_id"] and show(api, inst["id"])["state"] == "running"
    assert api.post(f"/api/v1/instances/{inst['id']}/resume", {}).status_code == 409  # it runs

    deleting = api.delete(f"/api/v1/instances/{inst['id']}")
    assert deleting.status_code == 202 and deleting.get_json()["state"] == "deleting"
    assert show(api, inst["id"])["state"] == "deleting"
    # While its process runs, its node keeps the volume; then it is told to delete it.
    keep = create(api, name="keep", resources={"gpus": 1})
    assert api.heartbeat(session, volumes=[inst["id"], keep["id"]])["delete_volumes"] == []
    finish(api, session, again, "cancelled")
    assert show(api, inst["id"])["state"] == "deleting"
    reply = api.heartbeat(session, volumes=[inst["id"], keep["id"], "unknown-id"])
    assert sorted(reply["delete_volumes"]) == sorted([inst["id"], "unknown-id"])
    assert show(api, inst["id"])["state"] == "deleting"
    assert [i["id"] for i in api.get("/api/v1/instances").get_json()["items"]] == [
        inst["id"],
        keep["id"],
    ]
    # The next heartbeat shows the volume gone: deleted, and gone from the API but for
    # ?state=deleted.
    api.heartbeat(session, volumes=[keep["id"]])
    assert api.get(f"/api/v1/instances/{inst['id']}").status_code == 404
    assert [i["id"] for i in api.get("/api/v1/instances").get_json()["items"]] == [keep["id"]]
    assert [i["id"] for i in api.get("/api/v1/instances?state=deleted").get_json()["items"]] == [
        inst["id"]
    ]
    assert api.delete(f"/api/v1/instances/{inst['id']}").status_code == 204  # gone already
    kinds = [
        (e["from_status"], e["to_status"])
        for e in api.get(f"/api/v1/instances/{inst['id']}/events").get_json()["items"]
    ]
    assert kinds == [
        (None, "pending"),
        ("pending", "starting"),
        ("starting", "running"),
        ("running", "stopping"),
        ("stopping", "stopped"),
        ("stopped", "pending"),
        (None, None),
        ("pending", "starting"),
        ("starting", "running"),
        ("running", "deleting"),
        ("deleting", "deleting"),
        ("deleting", "deleted"),
    ]  # its processes ended; then its node removed the volume


def test_a_queued_instance_stops_at_once_and_waits_with_a_reason(api, fleet):
    inst = create(api, resources={"gpus": 4})
    assert inst["state"] == "pending" and "4 GPUs" in inst["pending_reason"]
    stopped = api.post(f"/api/v1/instances/{inst['id']}/stop").get_json()
    assert stopped["state"] == "stopped" and stopped["pending_reason"] == ""
    resumed = api.post(f"/api/v1/instances/{inst['id']}/resume", {"gpus": 1}).get_json()
    assert resumed["state"] == "starting" and resumed["spec"]["resources"]["gpus"] == 1


def test_a_resumed_instance_waits_for_its_node_rather_than_moving(api, fleet):
    token, node, session = fleet
    inst = create(api, resources={"gpus": 2})
    a = start(api, session)
    api.post(f"/api/v1/instances/{inst['id']}/stop")
    finish(api, session, a)
    blocker = api.submit(resources={"gpus": 1})
    assert api.job(blocker["id"])["state"] == "running"
    api.ready_node(token, "host-2", gpu_count=8)
    resumed = api.post(f"/api/v1/instances/{inst['id']}/resume", {}).get_json()
    assert resumed["state"] == "pending" and resumed["node_id"] == node
    assert resumed["pending_reason"].startswith(
        f"waiting for node {node}, which holds its volume: "
    )


def test_on_demand_work_interrupts_a_spot_instance_which_resumes_with_a_new_bid(api, fleet):
    token, node, session = fleet
    api.put(
        "/api/v1/gpu-types/NVIDIA H100 80GB HBM3", {"price_per_hour": 4.0, "spot_min_bid": 1.0}
    ) if hasattr(api, "put") else api.call(
        "PUT",
        "/api/v1/gpu-types/NVIDIA H100 80GB HBM3",
        json={"price_per_hour": 4.0, "spot_min_bid": 1.0},
    )
    low = api.post(
        "/api/v1/instances",
        {
            "name": "cheap",
            "command": ["sleep", "1d"],
            "resources": {"gpus": 2},
            "priority_class": "spot",
            "bid": 0.5,
        },
    )
    assert low.status_code == 400 and "bid" in low.get_json()["error"]["details"]["fields"], (
        low.get_json()
    )
    inst = create(api, priority_class="spot", bid=1.5, resources={"gpus": 2})
    a = start(api, session)
    assert show(api, inst["id"])["price_per_hour"] == 3.0
    job = api.submit(resources={"gpus": 2})
    assert (
        a["task_id"]
        in api.post(
            "/api/v1/agent/acquire", {"wait_seconds": 0}, token=session, agent=True
        ).get_json()["cancel"]
    )
    interrupted = show(api, inst["id"])
    assert interrupted["state"] == "interrupted" and "preempted" in interrupted["status_reason"]
    finish(api, session, a, "cancelled")  # its process ended
    api.run_task("scheduling")
    assert api.job(job["id"])["state"] == "running"
    resumed = api.post(f"/api/v1/instances/{inst['id']}/resume", {"bid": 2.0}).get_json()
    assert resumed["state"] == "pending" and resumed["spec"]["bid"] == 2.0


def running_on_a_lost_node(api, session, clock):
    """An instance that ran on the node of `session` until that node went silent and was declared
    lost."""
    inst = create(api)
    start(api, session)
    clock.advance(3600)
    api.run_task("liveness_sweep")
    return show(api, inst["id"])


def test_a_lost_node_interrupts_its_instances_which_run_on_when_it_returns(api, fleet, clock):
    token, node, session = fleet
    inst = lost = running_on_a_lost_node(api, session, clock)
    assert lost["state"] == "interrupted" and f"node {node} lost" in lost["status_reason"]
    api.heartbeat(session)  # back before anything else happened: the process ran on
    back = show(api, inst["id"])
    assert back["state"] == "running" and "ran on" in back["status_reason"]


def test_an_instance_on_a_lost_node_is_interrupted_by_no_workload_and_deleted_once_its_run_is_lost(
    api, fleet, clock
):
    token, node, session = fleet
    inst = lost = running_on_a_lost_node(api, session, clock)
    assert (lost["state"], lost["interruption"], lost["interrupted_by"]) == (
        "interrupted",
        "node_lost",
        None,
    )
    resp = api.delete(f"/api/v1/instances/{inst['id']}")
    assert (
        resp.status_code == 202 and resp.get_json()["state"] == "deleting"
    )  # its process may still run there
    api.run_task("leases")  # its run's lease expired: the node is gone, so is the instance
    assert api.get(f"/api/v1/instances/{inst['id']}").status_code == 404
    [gone] = api.get("/api/v1/instances?state=deleted").get_json()["items"]
    assert "its node did not report that its processes ended" in gone["status_reason"], gone
    # Back, the node is told to delete the volume it still has.
    assert api.heartbeat(session, volumes=[inst["id"]])["delete_volumes"] == [inst["id"]]


def test_a_lost_run_is_started_again_when_its_node_returns(api, fleet, clock):
    token, node, session = fleet
    inst = create(api)
    a = start(api, session)
    clock.advance(3600)
    api.run_task("liveness_sweep")
    api.run_task("leases")
    assert show(api, inst["id"])["state"] == "interrupted"
    api.heartbeat(session)
    back = show(api, inst["id"])
    assert back["state"] == "starting" and back["runs"] == 2
    assert start(api, session)["task_id"] != a["task_id"]
    assert show(api, inst["id"])["state"] == "running"


def test_process_exit_and_idle_stop_end_the_instance(api, fleet):
    token, node, session = fleet
    inst = create(api, idle_stop={"gpu_util_below_percent": 5, "for_seconds": 60})
    a = start(api, session)
    finish(api, session, a, "cancelled", reason="GPU utilisation under 5% for 60s", idle=True)
    stopped = show(api, inst["id"])
    assert stopped["state"] == "stopped" and stopped["status_reason"].startswith("idle:")
    api.post(f"/api/v1/instances/{inst['id']}/resume", {})
    b = start(api, session)
    finish(api, session, b, "failed", exit_code=3, reason="exit code 3")
    assert show(api, inst["id"])["state"] == "failed"


def test_a_crash_looping_process_reads_restarting_with_its_exit_then_failed_billed_only_running(
    api, fleet, clock
):
    token, node, session = fleet
    api.call("PUT", "/api/v1/gpu-types/NVIDIA H100 80GB HBM3", json={"price_per_hour": 3.6})
    inst = create(api, ports=[{"port": 8888}])
    a = start(api, session, [(8888, 40001)])
    clock.advance(100)
    assert show(api, inst["id"])["runtime"]["uptime_seconds"] == pytest.approx(100)
    api.task_call(
        session,
        a,
        "restart",
        exit_code=137,
        signal="SIGKILL",
        reason="killed by SIGKILL",
        backoff_seconds=4,
    )
    restarting = show(api, inst["id"])
    assert restarting["state"] == "restarting" and restarting["last_exit"]["exit_code"] == 137
    assert {k: restarting["last_exit"][k] for k in ("signal", "reason", "backoff_seconds")} == {
        "signal": "SIGKILL",
        "reason": "killed by SIGKILL",
        "backoff_seconds": 4.0,
    }
    assert restarting["next_start_at"] is not None and restarting["runtime"]["uptime_seconds"] == 0
    assert (
        "killed by SIGKILL" in restarting["status_reason"]
        and "in 4s" in restarting["status_reason"]
    )
    assert (
        api.get(f"/api/v1/instances/{inst['id']}/connection").status_code == 504
    )  # not while restarting
    clock.advance(3600)  # not billed while its process is down
    assert show(api, inst["id"])["cost_so_far"] == pytest.approx(0.1)
    api.task_call(session, a, "start", pid=4243, restarts=1)
    api.task_call(session, a, "start", pid=4243, restarts=1)  # a retried report changes nothing
    clock.advance(30)
    running = show(api, inst["id"])
    assert running["state"] == "running" and running["runtime"]["uptime_seconds"] == pytest.approx(
        30
    )
    assert running["next_start_at"] is None and running["last_exit"]["exit_code"] == 137
    api.task_call(session, a, "restart", exit_code=3, reason="exit code 3", backoff_seconds=8)
    finish(
        api,
        session,
        a,
        "failed",
        exit_code=3,
        reason="exit code 3; restart policy on-failure gave up",
    )
    failed = show(api, inst["id"])
    assert (
        failed["state"] == "failed"
        and "gave up" in failed["status_reason"]
        and failed["runtime"] is None
    )
    assert failed["last_exit"]["exit_code"] == 3 and failed["last_exit"]["backoff_seconds"] is None
    kinds = [
        (e["from_status"], e["to_status"])
        for e in api.get(f"/api/v1/instances/{inst['id']}/events").get_json()["items"]
    ]
    assert kinds[2:] == [
        ("starting", "running"),
        ("running", "restarting"),
        ("restarting", "running"),
        ("running", "restarting"),
        ("restarting", "failed"),
    ]


def test_a_restart_report_for_a_job_task_is_refused(api, fleet):
    token, node, session = fleet
    api.submit(resources={"gpus": 1})
    a = api.start_task(session)
    resp = api.task_call(
        session, a, "restart", expect=409, exit_code=1, reason="exit code 1", backoff_seconds=1
    )
    assert "not an instance's run" in resp.get_json()["error"]["message"]


def test_a_process_that_ends_before_its_start_is_reported_reads_restarting(api, fleet):
    token, node, session = fleet
    inst = create(api)
    a = api.acquire(session)
    api.task_call(session, a, "restart", exit_code=126, reason="exit code 126", backoff_seconds=1)
    assert show(api, inst["id"])["state"] == "restarting"
    api.task_call(session, a, "restart", exit_code=126, reason="exit code 126", backoff_seconds=2)
    again = show(api, inst["id"])
    assert again["state"] == "restarting" and again["last_exit"]["backoff_seconds"] == 2


def test_cost_accrues_over_running_time_only(api, fleet, clock):
    token, node, session = fleet
    api.call("PUT", "/api/v1/gpu-types/NVIDIA H100 80GB HBM3", json={"price_per_hour": 2.0})
    inst = create(api, resources={"gpus": 2})
    clock.advance(1800)  # starting: not running yet
    a = start(api, session)
    clock.advance(3600)
    assert show(api, inst["id"])["cost_so_far"] == pytest.approx(4.0)
    api.post(f"/api/v1/instances/{inst['id']}/stop")
    finish(api, session, a)
    clock.advance(7200)
    assert show(api, inst["id"])["cost_so_far"] == pytest.approx(4.0)


def test_a_price_set_while_an_instance_runs_applies_from_that_moment(api, fleet, clock):
    token, node, session = fleet
    inst = create(api, resources={"gpus": 2})
    start(api, session)
    clock.advance(3600)  # unpriced: free so far
    api.call("PUT", "/api/v1/gpu-types/NVIDIA H100 80GB HBM3", json={"price_per_hour": 2.0})
    assert show(api, inst["id"])["price_per_hour"] == pytest.approx(4.0)
    clock.advance(1800)
    assert show(api, inst["id"])["cost_so_far"] == pytest.approx(2.0)
    api.call("PUT", "/api/v1/gpu-types/NVIDIA H100 80GB HBM3", json={"price_per_hour": 3.0})
    clock.advance(3600)
    assert show(api, inst["id"])["cost_so_far"] == pytest.approx(
        8.0
    )  # 0.5 h at 4/h, then 1 h at 6/h
    api.call(
        "PUT", "/api/v1/gpu-types/NVIDIA A100", json={"price_per_hour": 100.0}
    )  # another model: no change
    api.call("DELETE", "/api/v1/gpu-types/NVIDIA H100 80GB HBM3")
    clock.advance(3600)
    shown = show(api, inst["id"])
    assert shown["price_per_hour"] is None and shown["cost_so_far"] == pytest.approx(8.0)
    prices = [
        e["reason"]
        for e in api.get(f"/api/v1/instances/{inst['id']}/events").get_json()["items"]
        if e["kind"] == "instance.price"
    ]
    assert prices == [
        "price per hour None -> 4.0 from now (GPU type NVIDIA H100 80GB HBM3 repriced)",
        "price per hour 4.0 -> 6.0 from now (GPU type NVIDIA H100 80GB HBM3 repriced)",
        "price per hour 6.0 -> None from now (GPU type NVIDIA H100 80GB HBM3 repriced)",
    ]


def test_a_submitter_sees_only_its_own_instances(api, fleet, app, clock):
    inst = create(api)
    other = admin_client(app, clock)
    other.token = api.create_token("submitter", "alice")
    assert other.get(f"/api/v1/instances/{inst['id']}").status_code == 404
    assert other.get("/api/v1/instances").get_json()["items"] == []
    assert other.post(f"/api/v1/instances/{inst['id']}/stop").status_code == 404
    mine = create(other, name="alice-nb")
    assert [i["id"] for i in other.get("/api/v1/instances").get_json()["items"]] == [mine["id"]]


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"name": "x", "resources": {"gpus": 1}}, "command"),
        ({"name": "x", "command": ["a"], "ports": [{"port": 0}]}, "ports"),
        ({"name": "x", "command": ["a"], "ports": [{"port": 70000}]}, "ports"),
        ({"name": "x", "command": ["a"], "ports": [{"port": 80}, {"port": 80}]}, "ports"),
        ({"name": "x", "command": ["a"], "ports": [{"port": 80, "protocol": "udp"}]}, "ports"),
        ({"name": "x", "command": ["a"], "restart": "sometimes"}, "restart"),
        ({"name": "x", "command": ["a"], "volume_bytes": -1}, "volume_bytes"),
        ({"name": "x", "command": ["a"], "volume_mount_path": "relative"}, "volume_mount_path"),
        ({"name": "x", "command": ["a"], "bid": 1.0}, "bid"),
        ({"name": "x", "image": "bad image!"}, "image"),
        ({"name": "x", "command": ["a"], "env": {"FLEET_VOLUME": "/"}}, "env"),
        (
            {
                "name": "x",
                "command": ["a"],
                "idle_stop": {"gpu_util_below_percent": 5, "for_seconds": 60},
            },
            "idle_stop",
        ),
        ({"name": "x", "command": ["a"], "team": "other"}, "team"),
    ],
)
def test_bad_specs_are_refused_field_by_field(api, spec, field):
    resp = api.post("/api/v1/instances", spec)
    assert resp.status_code == 400, resp.get_json()
    fields = resp.get_json()["error"]["details"]["fields"]
    assert field in fields.get("json", fields)


def test_an_image_instance_waits_for_a_node_with_a_container_runtime(api, fleet):
    token, node, session = fleet
    inst = create(api, command=[], image="localhost/app:1")
    assert inst["state"] == "pending" and "container runtime" in inst["pending_reason"]
    api.heartbeat(session, capabilities={"container_runtime": "podman"})
    api.run_task("scheduling")
    assert show(api, inst["id"])["state"] == "starting"


def test_connection_waits_until_the_instance_runs(api, fleet):
    token, node, session = fleet
    inst = create(api, ports=[{"port": 22, "protocol": "tcp"}, {"port": 8888}])
    resp = api.get(f"/api/v1/instances/{inst['id']}/connection?port=22&wait_seconds=0.2")
    assert resp.status_code == 504
    assert api.get(f"/api/v1/instances/{inst['id']}/connection").status_code == 400  # which port?
    assert api.get(f"/api/v1/instances/{inst['id']}/connection?port=23").status_code == 404
    start(api, session, [(22, 40022), (8888, 40888)])
    conn = api.get(f"/api/v1/instances/{inst['id']}/connection?port=22").get_json()
    assert conn["url"] == "tcp://10.0.0.1:40022"


def _sample(assignment, *ports):
    return {
        "task_id": assignment["task_id"],
        "epoch": assignment["epoch"],
        "uptime_seconds": 5.0,
        "ports": [{"port": p, "host_port": h, "state": state} for p, h, state in ports],
    }


def test_port_states_from_heartbeats_show_in_the_view_and_a_taken_port_gets_no_connection(
    api, fleet
):
    token, node, session = fleet
    inst = create(api, ports=[{"port": 22, "protocol": "tcp"}, {"port": 8888}])
    a = start(api, session, [(22, 40022), (8888, 40888)])
    running = [{"id": a["task_id"], "epoch": a["epoch"], "state": "running"}]
    api.heartbeat(
        session,
        tasks=running,
        instances=[_sample(a, (22, 40022, "ok"), (8888, 40888, "taken_by_other_process"))],
    )
    states = {p["private_port"]: p["state"] for p in show(api, inst["id"])["runtime"]["ports"]}
    assert states == {22: "ok", 8888: "taken_by_other_process"}
    assert api.get(f"/api/v1/instances/{inst['id']}/connection?port=22").status_code == 200
    resp = api.get(f"/api/v1/instances/{inst['id']}/connection?port=8888&wait_seconds=5")
    error = resp.get_json()["error"]
    assert resp.status_code == 409 and error["code"] == "conflict"
    assert error["details"] == {
        "port": 8888,
        "host_port": 40888,
        "reason": "taken_by_other_process",
        "state": "running",
    }
    assert "port 8888" in error["message"] and "40888" in error["message"]
    # Its own process holds the port again: the URL is handed out.
    api.heartbeat(
        session, tasks=running, instances=[_sample(a, (22, 40022, "ok"), (8888, 40888, "ok"))]
    )
    assert (
        api.get(f"/api/v1/instances/{inst['id']}/connection?port=8888").get_json()["url"]
        == "http://10.0.0.1:40888/"
    )
    # A report of another host port than the one fleetd gave says nothing about this one.
    api.heartbeat(
        session, tasks=running, instances=[_sample(a, (8888, 40999, "taken_by_other_process"))]
    )
    assert {p["private_port"]: p["state"] for p in show(api, inst["id"])["runtime"]["ports"]} == {
        22: "unknown",
        8888: "unknown",
    }


@pytest.mark.parametrize(
    "ports, field",
    [
        ([{"port": 8888, "host_port": 40001, "state": "stolen"}], "state"),
        ([{"port": 0, "host_port": 40001, "state": "ok"}], "port"),
        ([{"port": 8888, "host_port": 65536, "state": "ok"}], "host_port"),
        ([{"port": 8888, "host_port": 40001}], "state"),
        ([{"port": 8888, "host_port": 40001, "state": "ok", "pid": 1}], "pid"),
        ([{"port": 1000 + i, "host_port": 40000 + i, "state": "ok"} for i in range(33)], "ports"),
    ],
)
def test_heartbeat_port_states_are_bounded(api, fleet, ports, field):
    token, node, session = fleet
    body = {"tasks": [], "instances": [{"task_id": "t1", "epoch": 1, "ports": ports}]}
    resp = api.post("/api/v1/agent/heartbeat", body, token=session, agent=True)
    assert resp.status_code == 400 and field in str(resp.get_json()["error"]["details"]), (
        resp.get_json()
    )
    body["instances"][0]["ports"] = ports[:1] if field == "ports" else []
    assert api.post("/api/v1/agent/heartbeat", body, token=session, agent=True).status_code == 200


def test_metrics_count_instances_by_state_apart_from_jobs(api, fleet):
    token, node, session = fleet
    create(api)
    create(api, name="big", resources={"gpus": 8})
    text = api.get("/metrics").get_data(as_text=True)
    assert (
        'fleetd_instances{state="starting"} 1.0' in text
        and 'fleetd_instances{state="pending"} 1.0' in text
    )
    assert 'fleetd_jobs{state="running"} 0.0' in text and 'fleetd_jobs{state="queued"} 0.0' in text


def test_gc_forgets_instances_deleted_before_the_cutoff_with_their_runs(api, fleet, clock):
    token, node, session = fleet
    gone = create(api, name="gone")
    kept = create(
        api, name="kept", resources={"gpus": 8}
    )  # pending: never deleted, never forgotten
    run = start(api, session)
    api.delete(f"/api/v1/instances/{gone['id']}")
    finish(api, session, run)
    api.heartbeat(session, volumes=[])  # its volume is gone: deleted
    clock.advance(7200)
    result = api.post(
        "/api/v1/admin/gc", {"older_than_seconds": 3600, "delete_jobs": True, "dry_run": False}
    ).get_json()
    assert result["instances"] == 1 and result["jobs"] == 1 and result["tasks"] == 1
    assert api.get(f"/api/v1/instances/{gone['id']}").status_code == 404
    assert show(api, kept["id"])["state"] == "pending"


# ---------------------------------------------------------------- names


def stored():
    """(instances, their runs, their events) in the database: what a refused create must not add
    to."""
    with database.connection_context():
        return (
            Instance.select().count(),
            Job.select().where(Job.instance_id.is_null(False)).count(),
            Event.select().where(Event.subject_type == "instance").count(),
        )


def named(api, name, **query):
    resp = api.get("/api/v1/instances", query_string=dict(query, name=name))
    assert resp.status_code == 200, resp.get_json()
    return [i["id"] for i in resp.get_json()["items"]]


def test_a_second_instance_of_a_name_is_refused_409_naming_the_first_and_nothing_is_stored(api):
    first = create(api, name="web")
    before = stored()
    resp = api.post("/api/v1/instances", {"name": "web", "command": ["sleep", "1d"]})
    assert resp.status_code == 409, resp.get_json()
    error = resp.get_json()["error"]
    assert error["code"] == "conflict" and error["details"] == {
        "name": "web",
        "instance_id": first["id"],
    }
    assert first["id"] in error["message"]
    assert stored() == before
    assert named(api, "web") == [first["id"]]


def test_a_name_is_free_for_another_owner_and_again_once_deleted_but_not_once_stopped(api, app):
    alice = ApiClient(app, api.create_token("submitter", "alice"))
    mine = create(
        api, name="web", resources={"gpus": 4}
    )  # no node: pending, so it stops and deletes at once
    theirs = create(alice, name="web")
    assert theirs["owner"] == "alice"
    assert api.post(f"/api/v1/instances/{mine['id']}/stop").get_json()["state"] == "stopped"
    create(api, expect=409, name="web")  # a stopped instance keeps its name: it can be resumed
    assert api.delete(f"/api/v1/instances/{mine['id']}").status_code == 204
    again = create(api, name="web")
    assert again["id"] != mine["id"]
    assert named(api, "web", state="deleted") == [mine["id"]]
    assert sorted(named(api, "web")) == sorted([theirs["id"], again["id"]])


def check_concurrent_creates_make_one(api):
    """Eight creates of one name at once: one instance, seven 409s that each name it. Shared with
    the PostgreSQL test (tests/integration/test_postgres.py), where checks can pass side by side."""
    barrier, answers, lock = threading.Barrier(8), [], threading.Lock()

    def attempt():
        client = ApiClient(api.app, api.token)
        barrier.wait(timeout=30)
        resp = client.post("/api/v1/instances", {"name": "race", "command": ["sleep", "1d"]})
        body = resp.get_json()
        with lock:
            answers.append(
                (
                    resp.status_code,
                    body["id"]
                    if resp.status_code == 201
                    else body["error"].get("details", {}).get("instance_id"),
                )
            )

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(status for status, _ in answers) == [201] + [409] * 7
    assert named(api, "race") == [ident for status, ident in answers if status == 201]
    assert {ident for _, ident in answers} == set(named(api, "race"))  # each 409 names the one made
    assert stored()[0] == 1


def test_concurrent_creates_of_one_name_make_exactly_one_instance(api):
    check_concurrent_creates_make_one(api)


def check_the_index_refuses_a_create_whose_check_passed(api, monkeypatch):
    """What two creates at once can let through (both checks before either insert) the unique index
    refuses, with the same 409 and nothing stored. Shared with the PostgreSQL test, whose failed
    insert aborts the transaction."""
    first = create(api, name="web")
    before = stored()
    check = instances._refuse_taken_name
    calls = []

    def late_check(principal, name):
        calls.append(name)
        if len(calls) > 1:  # the first check ran before the rival's insert: it saw nothing
            check(principal, name)

    monkeypatch.setattr(instances, "_refuse_taken_name", late_check)
    resp = api.post("/api/v1/instances", {"name": "web", "command": ["sleep", "1d"]})
    assert resp.status_code == 409, resp.get_json()
    assert resp.get_json()["error"]["details"] == {"name": "web", "instance_id": first["id"]}
    assert calls == ["web", "web"] and stored() == before
    assert create(api, name="web-2")["name"] == "web-2"  # the connection is fine afterwards


def test_a_create_that_passes_the_check_in_a_race_is_stopped_by_the_index_with_the_same_409(
    api, monkeypatch
):
    check_the_index_refuses_a_create_whose_check_passed(api, monkeypatch)


@pytest.mark.parametrize("name", ["new", "0123456789abcdef0123"])
def test_names_that_would_read_as_a_page_or_an_id_are_refused(api, name):
    before = stored()
    resp = api.post("/api/v1/instances", {"name": name, "command": ["sleep", "1d"]})
    assert resp.status_code == 400, resp.get_json()
    error = resp.get_json()["error"]
    assert error["code"] == "invalid_request" and list(error["details"]["fields"]["json"]) == [
        "name"
    ]
    assert stored() == before


@pytest.mark.parametrize("name", ["New", "new-1", "0123456789abcdef012", "0123456789ABCDEF0123"])
def test_names_near_the_refused_ones_are_fine(api, name):
    assert create(api, name=name)["name"] == name


def test_the_name_filter_keeps_to_what_the_caller_may_see(api, app):
    alice = ApiClient(app, api.create_token("submitter", "alice"))
    bob = ApiClient(app, api.create_token("submitter", "bob"))
    admins, alices = create(api, name="web"), create(alice, name="web")
    create(bob, name="db")
    assert sorted(named(api, "web")) == sorted([admins["id"], alices["id"]])
    assert named(api, "web", owner="alice") == [alices["id"]]
    assert named(alice, "web") == [alices["id"]]
    assert named(bob, "web") == [] and named(api, "we") == []


def test_a_port_its_node_moved_while_it_was_stopped_is_an_event(api, fleet):
    """Another process took the kept host port while the instance was stopped: its node gives the
    port another one at the next start, and an `instance.port` event names both (its old URL now
    reaches someone else)."""
    token, node, session = fleet
    inst = create(api, ports=[{"port": 22, "protocol": "tcp"}, {"port": 8888}])
    a = start(api, session, [(22, 40022), (8888, 40888)])
    api.post(f"/api/v1/instances/{inst['id']}/stop")
    finish(api, session, a, "cancelled", reason="stopped")
    api.post(f"/api/v1/instances/{inst['id']}/resume", {})
    start(api, session, [(22, 40022), (8888, 40889)])
    conn = api.get(f"/api/v1/instances/{inst['id']}/connection?port=8888").get_json()
    assert conn["port"] == 40889
    moved = [
        e
        for e in api.get(f"/api/v1/instances/{inst['id']}/events").get_json()["items"]
        if e["kind"] == "instance.port"
    ]
    assert len(moved) == 1 and "port 8888 moved from host port 40888 to 40889" in moved[0]["reason"]
