"""The node health policy: a GPU fault cordons and drains a node; the fault clearing returns it, but
never a node an operator took out of service. Real API, fake heartbeats."""

import pytest

from tests.conftest import ApiClient, gpus


def _faulty(count=2, bad=1, reason="uncorrectable ECC error"):
    reports = gpus(count)
    reports[bad] = dict(reports[bad], healthy=False, health_reason=reason)
    return reports


def _node_events(api, node_id):
    return api.get(f"/api/v1/nodes/{node_id}/events").get_json()["items"]


def _health_steps(api, node_id):
    return [
        (e["from_status"], e["to_status"], e["actor"])
        for e in _node_events(api, node_id)
        if e["kind"] == "node.health"
    ]


def _metric(api, step):
    text = api.get("/metrics").get_data(as_text=True)
    for line in text.splitlines():
        if line.startswith(f'fleetd_health_remediations_total{{step="{step}"}}'):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture
def node(api):
    api.create_fleet()
    return api.ready_node(api.create_join_token(), "host-a", gpu_count=2)


def test_a_gpu_fault_cordons_then_drains_after_the_tasks_and_the_node_returns_when_healthy(
    api, node
):
    node_id, session = node
    hook = api.post(
        "/api/v1/webhooks",
        {"url": "http://127.0.0.1:9/x", "secret": "0123456789abcdef", "events": ["node.health"]},
    ).get_json()
    job = api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)

    reply = api.heartbeat(session, gpus=_faulty())
    assert reply["status"] == "draining"  # cordoned, then draining: its task may finish
    shown = api.node(node_id)
    assert (
        "health policy" in shown["status_reason"]
        and "uncorrectable ECC error" in shown["status_reason"]
    )
    assert _health_steps(api, node_id) == [
        ("ready", "cordoned", "fleetd"),
        ("cordoned", "draining", "fleetd"),
    ]
    statuses = [
        (e["from_status"], e["to_status"], e["actor"])
        for e in _node_events(api, node_id)
        if e["kind"] == "node.status"
    ]
    assert statuses[-2:] == [("ready", "cordoned", "fleetd"), ("cordoned", "draining", "fleetd")]
    assert api.submit(name="later", resources={"gpus": 1})["state"] == "queued"

    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    assert api.job(job["id"])["state"] == "succeeded"
    api.run_task("drains")
    assert api.node(node_id)["status"] == "drained"

    api.heartbeat(session, gpus=gpus(2))  # the fault cleared
    assert api.node(node_id)["status"] == "ready"
    assert _health_steps(api, node_id)[-1] == ("drained", "ready", "fleetd")
    assert (
        _metric(api, "cordon") == 1 and _metric(api, "drain") == 1 and _metric(api, "return") == 1
    )
    kinds = [
        d["event"] for d in api.get(f"/api/v1/webhooks/{hook['id']}/deliveries").get_json()["items"]
    ]
    assert kinds == ["node.health"] * 3


def test_the_drain_deadline_stops_tasks_of_a_faulty_node(api, node, clock):
    node_id, session = node
    api.patch("/api/v1/fleets/gpu-a", {"health_policy": {"drain_after_seconds": 60}})
    api.submit(resources={"gpus": 1})
    api.start_task(session)
    api.heartbeat(session, gpus=_faulty())
    assert api.node(node_id)["status"] == "draining"
    clock.advance(61)
    api.run_task("drains")
    assert api.node(node_id)["status"] == "drained"


def test_a_gpu_that_disappears_is_a_fault_until_it_is_back(api, node):
    node_id, session = node
    api.heartbeat(session, gpus=gpus(2)[:1])
    assert api.node(node_id)["status"] == "drained"  # no tasks: drained at once
    assert "GPU-00000001-0000-0000-0000-000000000000 gone" in api.node(node_id)["drain"]["reason"]
    api.heartbeat(session, gpus=gpus(2)[:1])  # still missing
    assert api.node(node_id)["status"] == "drained"
    api.heartbeat(session, gpus=gpus(2))
    assert api.node(node_id)["status"] == "ready"


def test_an_operators_drain_is_never_undone(api, node):
    node_id, session = node
    api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "RMA pending", "deadline_seconds": 60})
    api.heartbeat(session, gpus=_faulty())
    api.heartbeat(session, gpus=gpus(2))
    assert api.node(node_id)["status"] == "drained"
    assert _health_steps(api, node_id) == []


def test_an_operator_who_acts_on_a_held_node_takes_it_over(api, app, node):
    node_id, session = node
    api.patch("/api/v1/fleets/gpu-a", {"health_policy": {"drain_after_seconds": None}})
    api.heartbeat(session, gpus=_faulty())
    assert api.node(node_id)["status"] == "cordoned"  # no drain in this policy
    ops = ApiClient(app, api.create_token("admin", name="ops"))
    assert (
        ops.post(f"/api/v1/nodes/{node_id}/cordon").status_code == 200
    )  # the operator keeps it cordoned
    api.heartbeat(session, gpus=gpus(2))
    assert api.node(node_id)["status"] == "cordoned"


def test_a_policy_that_does_not_return_nodes_leaves_them_out(api, node):
    node_id, session = node
    resp = api.patch("/api/v1/fleets/gpu-a", {"health_policy": {"uncordon_when_healthy": False}})
    assert resp.get_json()["health_policy"] == {
        "cordon_on_gpu_fault": True,
        "drain_after_seconds": 600,
        "uncordon_when_healthy": False,
    }
    api.heartbeat(session, gpus=_faulty())
    api.heartbeat(session, gpus=gpus(2))
    assert api.node(node_id)["status"] == "drained"
    assert _health_steps(api, node_id)[-1] == ("drained", "drained", "fleetd")
    api.heartbeat(session, gpus=gpus(2))
    assert len(_health_steps(api, node_id)) == 3  # said once


def test_a_policy_that_is_off_does_nothing(api, node):
    node_id, session = node
    api.patch("/api/v1/fleets/gpu-a", {"health_policy": {"cordon_on_gpu_fault": False}})
    api.heartbeat(session, gpus=_faulty())
    assert api.node(node_id)["status"] == "ready"
    assert (
        api.patch("/api/v1/fleets/gpu-a", {"health_policy": None}).get_json()["health_policy"][
            "cordon_on_gpu_fault"
        ]
        is True
    )


def test_a_node_that_joins_with_a_bad_gpu_is_taken_out_at_once(api):
    api.create_fleet()
    reg = api.register(api.create_join_token(), gpus=_faulty())
    api.heartbeat(reg["session_token"])
    assert api.node(reg["node_id"])["status"] == "drained"


@pytest.mark.parametrize(
    "policy",
    [
        {"drain_after_seconds": -1},
        {"cordon_on_gpu_fault": 1},
        {"uncordon_when_healthy": None},
        {"other": True},
        "on",
    ],
)
def test_bad_policies_are_refused(api, policy):
    assert api.post("/api/v1/fleets", {"name": "gpu-b", "health_policy": policy}).status_code == 400


def test_a_new_fleet_has_the_default_policy(api):
    assert api.create_fleet()["health_policy"] == {
        "cordon_on_gpu_fault": True,
        "drain_after_seconds": 600,
        "uncordon_when_healthy": True,
    }
