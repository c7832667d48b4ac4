"""A preempted spot instance that should run resumes by itself: its next run is queued at once,
it stays `interrupted` naming its preemptor until that run is placed after the preemptor, and
stop, delete and resume replace or cancel that queued run (instances_resume_preempted)."""

from fleetd.models import Instance, Job
from fleetd.services.workloads import instances
from tests.conftest import admin_client
from tests.fleetd.services.workloads.test_instances import create, finish, fleet, show, start  # noqa: F401 (fleet is a fixture)


def _runs(api, inst):
    """(the instance's current run id, {run id: state} of all its runs)."""
    with api.app.app_context():
        run_id = Instance.get_by_id(inst["id"]).run_id
        return run_id, {j.id: j.state for j in Job.select().where(Job.instance_id == inst["id"])}


def preempted(api, session, **spec):
    """A running spot instance of 2 GPUs, preempted by an on-demand job of 2 GPUs whose process
    ended; the job runs. Returns (instance, job, the job's assignment)."""
    inst = create(api, name="cheap", priority_class="spot", resources={"gpus": 2}, **spec)
    a = start(api, session)
    job = api.submit(name="urgent", resources={"gpus": 2})
    finish(api, session, a, "cancelled")  # the preempted process ended
    api.run_task("scheduling")
    assert api.job(job["id"])["state"] == "running"
    return inst, job, api.acquire(session)


def test_a_preempted_instance_waits_interrupted_naming_its_preemptor_then_starts_by_itself(
    api, fleet
):
    _, node, session = fleet
    inst, job, assignment = preempted(api, session)
    shown = show(api, inst["id"])
    assert (shown["state"], shown["interruption"]) == ("interrupted", "preempted"), shown
    assert shown["interrupted_by"] == {"kind": "job", "id": job["id"], "name": "urgent"}
    assert f"it resumes by itself on node {node} once there is room" in shown["status_reason"], (
        shown
    )
    assert shown["pending_reason"], shown  # what its queued run waits for
    run_id, runs = _runs(api, inst)
    assert runs[run_id] == "queued" and list(runs.values()).count("queued") == 1
    assert (
        assignment["task_id"] and assignment.get("instance") is None
    )  # the node got the job, not the run
    api.task_call(session, assignment, "start", pid=11)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    api.run_task("scheduling")
    placed = show(api, inst["id"])
    assert (placed["state"], placed["node_id"]) == ("starting", node), placed
    assert (
        placed["interrupted_by"] is None
        and placed["interruption"] is None
        and placed["pending_reason"] == ""
    )
    start_again = api.acquire(session)
    assert start_again["instance"] is not None
    api.task_call(session, start_again, "start", pid=12, ports=[])
    assert show(api, inst["id"])["state"] == "running"


def test_a_stop_while_it_waits_cancels_the_queued_run_and_it_never_starts(api, fleet):
    _, _, session = fleet
    inst, _, assignment = preempted(api, session)
    stopped = api.post(f"/api/v1/instances/{inst['id']}/stop", {}).get_json()
    assert stopped["state"] == "stopped" and stopped["pending_reason"] == "", stopped
    assert set(_runs(api, inst)[1].values()) == {
        "failed",
        "cancelled",
    }  # the preempted run, the queued one
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    api.run_task("scheduling")
    assert show(api, inst["id"])["state"] == "stopped" and api.acquire(session) is None


def test_a_resume_with_a_new_bid_while_it_waits_leaves_one_run_of_the_new_bid(api, fleet):
    _, _, session = fleet
    api.call(
        "PUT",
        "/api/v1/gpu-types/NVIDIA H100 80GB HBM3",
        json={"price_per_hour": 4.0, "spot_min_bid": 1.0},
    )
    inst, _, _ = preempted(api, session, bid=1.5)
    resumed = api.post(f"/api/v1/instances/{inst['id']}/resume", {"bid": 2.0}).get_json()
    assert (
        resumed["state"] == "pending"
        and resumed["spec"]["bid"] == 2.0
        and resumed["interrupted_by"] is None
    )
    run_id, runs = _runs(api, inst)
    assert [r for r, state in runs.items() if state == "queued"] == [run_id]
    with api.app.app_context():
        assert Job.get_by_id(run_id).spec["bid"] == 2.0


def test_a_delete_while_it_waits_cancels_the_queued_run(api, fleet):
    _, _, session = fleet
    inst, _, _ = preempted(api, session)
    api.delete(f"/api/v1/instances/{inst['id']}")
    assert "queued" not in _runs(api, inst)[1].values()


def test_with_the_setting_off_a_preempted_instance_waits_for_its_owner(make_app, clock):
    api = admin_client(make_app(instances_resume_preempted=False), clock)
    api.create_fleet("gpu-a")
    _, session = api.ready_node(api.create_join_token("gpu-a"), "host-1", gpu_count=2)
    inst, _, assignment = preempted(api, session)
    shown = show(api, inst["id"])
    assert shown["state"] == "interrupted" and shown["pending_reason"] == "", shown
    assert "resume it to run it again" in shown["status_reason"], shown
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    api.run_task("scheduling")
    assert show(api, inst["id"])["state"] == "interrupted" and api.acquire(session) is None
    assert "queued" not in _runs(api, inst)[1].values()


def test_fleetd_stopping_it_while_it_waits_cancels_the_queued_run(api, fleet):
    """As a team budget's stop_spot does (services.accounting.budgets)."""
    _, _, session = fleet
    inst, _, _ = preempted(api, session)
    with api.app.app_context():
        instances.stop_by_fleetd(
            api.app.extensions["fleetd"], inst["id"], "team ml's budget is exceeded"
        )
    stopped = show(api, inst["id"])
    assert stopped["state"] == "stopped" and "budget" in stopped["status_reason"], stopped
    assert "queued" not in _runs(api, inst)[1].values()


def test_an_instance_interrupted_by_a_drain_deadline_does_not_resume_by_itself_and_says_so(
    api, fleet, clock
):
    _, node, session = fleet
    inst = create(api, name="cheap", priority_class="spot")
    start(api, session)
    api.post(f"/api/v1/nodes/{node}/drain", {"reason": "BIOS update", "deadline_seconds": 60})
    clock.advance(61)
    api.run_task("drains")
    shown = show(api, inst["id"])
    assert (shown["state"], shown["interruption"], shown["pending_reason"]) == (
        "interrupted",
        "drain",
        "",
    ), shown
    assert "does not resume by itself" in shown["status_reason"], shown
    assert "queued" not in _runs(api, inst)[1].values()
