"""Cancel, preemption, a drain's deadline and a gang's stop reach the node through its acquire
long-poll at once; a cancelled running job is `cancelling` until its processes have ended."""

import threading
import time

import pytest

from fleetd.errors import Conflict
from fleetd.models import JobState
from fleetd.services.workloads import lifecycle
from tests.conftest import T0, ApiClient, admin_client

J = JobState


@pytest.fixture
def api(make_app, clock):
    """An admin client of an app whose long polls may wait (the default in tests ends them at 0.5
    s)."""
    return admin_client(make_app(long_poll_max_seconds=30), clock)


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    return api.create_join_token("gpu-a")


def _acquire(api, session, wait_seconds=0):
    resp = api.post(
        "/api/v1/agent/acquire", {"wait_seconds": wait_seconds}, token=session, agent=True
    )
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def _running(*assignments):
    return [{"id": a["task_id"], "epoch": a["epoch"], "state": "running"} for a in assignments]


# ---------------------------------------------------------------- the state machine


class _Row:
    """Just what switch_job_state reads and writes of a job."""

    def __init__(self, state):
        self.id, self.state, self.started_at, self.ended_at, self.pending_reason = (
            "j1",
            state,
            None,
            None,
            "",
        )

    def save(self):
        pass


@pytest.mark.parametrize(
    "from_state, to_state, allowed",
    [
        (J.RUNNING, J.CANCELLING, True),
        (J.CANCELLING, J.CANCELLED, True),
        (J.CANCELLING, J.RUNNING, False),
        (J.CANCELLING, J.QUEUED, False),  # nothing retries once cancelled
        (J.CANCELLING, J.SUCCEEDED, False),
        (J.CANCELLING, J.FAILED, False),
    ],
)
def test_job_transitions_through_cancelling_are_checked(monkeypatch, from_state, to_state, allowed):
    monkeypatch.setattr(lifecycle, "record_event", lambda *args: None)
    monkeypatch.setattr(lifecycle.feed, "job_ended", lambda *args: None)  # its owner's feed
    job = _Row(from_state.value)
    if allowed:
        lifecycle.switch_job_state(job, to_state, "test", T0)
        assert job.state == to_state.value and (job.ended_at is None) == (to_state is J.CANCELLING)
    else:
        with pytest.raises(Conflict):
            lifecycle.switch_job_state(job, to_state, "test", T0)
        assert job.state == from_state.value


def test_cancelling_is_not_terminal_and_only_a_running_job_enters_it():
    assert not J.CANCELLING.is_terminal()
    assert set(lifecycle.JOB_TRANSITIONS) == set(J)
    # A queued job holds no process: it is cancelled at once.
    assert [s for s, to in lifecycle.JOB_TRANSITIONS.items() if J.CANCELLING in to] == [J.RUNNING]


# ---------------------------------------------------------------- cancel


def test_a_queued_job_is_cancelled_at_once_and_a_running_one_is_cancelling(api, fleet):
    _, session = api.ready_node(fleet, "n1", gpu_count=1)
    running = api.submit(name="running", resources={"gpus": 1})
    queued = api.submit(name="queued", resources={"gpus": 1})
    assert api.job(queued["id"])["state"] == "queued"
    api.start_task(session)
    done = api.post(f"/api/v1/jobs/{queued['id']}/cancel").get_json()
    assert done["state"] == "cancelled" and done["tasks"][0]["state"] == "cancelled"
    assert done["ended_at"] is not None
    cancelling = api.post(f"/api/v1/jobs/{running['id']}/cancel").get_json()
    assert cancelling["state"] == "cancelling" and cancelling["ended_at"] is None
    events = api.get(f"/api/v1/jobs/{running['id']}/events").get_json()["items"]
    assert [(e["from_status"], e["to_status"]) for e in events if e["kind"] == "job.state"][-1] == (
        "running",
        "cancelling",
    )


def test_an_assignment_not_yet_delivered_is_cancelled_at_once_and_never_delivered(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit(resources={"gpus": 1})
    assert api.job(job["id"])["tasks"][0]["state"] == "assigned"
    done = api.post(f"/api/v1/jobs/{job['id']}/cancel").get_json()
    assert done["state"] == "cancelled" and done["tasks"][0]["state"] == "cancelled"
    assert _acquire(api, session) == {"assignment": None, "cancel": []}


def test_a_waiting_acquire_is_answered_with_the_cancel_at_once_and_told_only_once(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    answers = []

    def wait():
        started = time.monotonic()
        answers.append(
            (
                _acquire(ApiClient(api.app, api.token), session, wait_seconds=20),
                time.monotonic() - started,
            )
        )

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert api.post(f"/api/v1/jobs/{job['id']}/cancel").get_json()["state"] == "cancelling"
    waiter.join(timeout=30)
    assert answers, "the acquire did not answer"
    reply, waited = answers[0]
    assert reply == {"assignment": None, "cancel": [assignment["task_id"]]}
    assert waited < 10  # woken by the cancel, not by the end of its 20 s wait
    assert _acquire(api, session) == {"assignment": None, "cancel": []}  # told once
    api.task_call(session, assignment, "finish", outcome="cancelled", exit_code=143)
    done = api.job(job["id"])
    assert done["state"] == "cancelled" and done["tasks"][0]["state"] == "cancelled"
    assert done["ended_at"] is not None
    assert _acquire(api, session) == {
        "assignment": None,
        "cancel": [],
    }  # its own finish owes it nothing


def test_a_gang_is_cancelling_until_every_rank_reported_its_end(api, fleet):
    _, s1 = api.ready_node(fleet, "n1")
    _, s2 = api.ready_node(fleet, "n2")
    job = api.submit(num_nodes=2, resources={"gpus": 1})
    a, b = api.start_task(s1), api.start_task(s2)
    api.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert _acquire(api, s1)["cancel"] == [a["task_id"]] and _acquire(api, s2)["cancel"] == [
        b["task_id"]
    ]
    api.task_call(s1, a, "finish", outcome="cancelled", exit_code=143)
    assert api.job(job["id"])["state"] == "cancelling"
    # A rank whose process ended by itself meanwhile still ends the cancelled job as cancelled.
    api.task_call(s2, b, "finish", outcome="succeeded", exit_code=0)
    done = api.job(job["id"])
    assert done["state"] == "cancelled" and done["attempt"] == 1
    assert sorted(t["state"] for t in done["tasks"]) == ["cancelled", "succeeded"]


def test_a_cancelling_job_whose_node_never_reports_the_end_is_cancelled_when_its_lease_expires(
    api, fleet, clock
):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    api.post(f"/api/v1/jobs/{job['id']}/cancel")
    for _ in range(
        3
    ):  # the node keeps heartbeating and listing the task, but never reports its end
        clock.advance(20)
        assert api.heartbeat(session, tasks=_running(assignment))["cancel"] == [
            assignment["task_id"]
        ]
    assert api.run_task("leases") == {"expired": 1, "reconciled": 0}
    done = api.job(job["id"])
    assert (
        done["state"] == "cancelled"
        and done["attempt"] == 1
        and done["tasks"][0]["state"] == "lost"
    )
    api.task_call(
        session, assignment, "finish", outcome="cancelled"
    )  # a late report is still taken


def test_a_wait_on_a_cancelling_job_answers_once_it_is_cancelled(api, fleet):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit(resources={"gpus": 1})
    assignment = api.start_task(session)
    api.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert api.job(job["id"])["state"] == "cancelling"
    answers = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            ApiClient(api.app, api.token)
            .get(f"/api/v1/jobs/{job['id']}?wait_seconds=20")
            .get_json()
        )
    )
    waiter.start()
    api.task_call(session, assignment, "finish", outcome="cancelled", exit_code=143)
    waiter.join(timeout=30)
    assert answers and answers[0]["state"] == "cancelled"


# ---------------------------------------------------------------- the other stops


def test_a_preempted_spot_task_is_told_to_its_node_through_acquire(api, fleet):
    _, session = api.ready_node(fleet, "n1", gpu_count=1)
    spot = api.submit(name="spot", priority_class="spot", bid=1.0, resources={"gpus": 1})
    victim = api.start_task(session)
    api.heartbeat(session, tasks=_running(victim))
    urgent = api.submit(name="urgent", resources={"gpus": 1})
    assert urgent["state"] == "queued" and api.job(spot["id"])["state"] == "queued"
    assert _acquire(api, session) == {"assignment": None, "cancel": [victim["task_id"]]}


def test_a_drain_deadline_stops_the_nodes_tasks_through_acquire(api, fleet):
    node_id, session = api.ready_node(fleet, "n1")
    job = api.submit(resources={"gpus": 1})
    task = api.start_task(session)
    resp = api.post(
        f"/api/v1/nodes/{node_id}/drain", {"reason": "maintenance", "deadline_seconds": 0}
    )
    assert resp.status_code == 200 and resp.get_json()["status"] == "drained"
    assert api.job(job["id"])["state"] == "queued"
    assert _acquire(api, session) == {"assignment": None, "cancel": [task["task_id"]]}


def test_a_failed_rank_stops_the_other_ranks_through_acquire(api, fleet):
    _, s1 = api.ready_node(fleet, "n1")
    _, s2 = api.ready_node(fleet, "n2")
    api.submit(num_nodes=2, resources={"gpus": 1})
    a, b = api.start_task(s1), api.start_task(s2)
    api.task_call(s1, a, "finish", outcome="failed", exit_code=7)
    assert _acquire(api, s2) == {"assignment": None, "cancel": [b["task_id"]]}
    assert _acquire(api, s1) == {"assignment": None, "cancel": []}


def test_a_requeued_task_placed_again_on_the_same_node_is_not_stopped_by_its_old_epochs_stop(
    api, fleet
):
    _, session = api.ready_node(fleet, "n1")
    job = api.submit(command=["flaky"], retry={"max_attempts": 2, "on": ["failed"]}, num_nodes=1)
    first = api.start_task(session)
    api.task_call(
        session, first, "finish", outcome="failed", exit_code=1
    )  # the node's own end: no stop
    reply = _acquire(api, session)
    assert reply["cancel"] == [] and reply["assignment"]["epoch"] == first["epoch"] + 1
    assert api.job(job["id"])["attempt"] == 2


def test_a_stop_the_database_never_confirms_is_dropped_without_being_told(api, fleet, monkeypatch):
    node_id, session = api.ready_node(fleet, "n1")
    api.submit(resources={"gpus": 1})
    task = api.start_task(session)
    stops = api.app.extensions["fleetd"].stops
    monkeypatch.setattr(stops, "confirm_seconds", 0.2)
    stops.owe(
        node_id, task["task_id"], task["epoch"]
    )  # as a transaction that then rolled back would
    assert _acquire(api, session, wait_seconds=1) == {"assignment": None, "cancel": []}
    assert stops.owed(node_id) == {}


def test_revoking_a_node_ends_its_tasks_as_lost_and_tells_its_waiting_acquire(api, fleet):
    node_id, session = api.ready_node(fleet, "n1")
    job = api.submit(resources={"gpus": 1}, retry={"max_attempts": 2, "on": ["node_lost"]})
    assignment = api.start_task(session)
    answers = []

    def wait():
        answers.append(_acquire(ApiClient(api.app, api.token), session, wait_seconds=20))

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert api.post(f"/api/v1/nodes/{node_id}/revoke").get_json()["status"] == "revoked"
    waiter.join(timeout=30)
    assert answers == [{"assignment": None, "cancel": [assignment["task_id"]]}]
    again = api.job(job["id"])
    assert again["state"] == "queued" and again["attempt"] == 2  # retried as for a lost node
    resp = api.post("/api/v1/agent/acquire", {"wait_seconds": 0}, token=session, agent=True)
    assert resp.status_code == 401  # a new acquire of a revoked node is refused


def test_a_waiting_acquire_answers_at_once_when_fleetd_shuts_down(make_app, clock):
    app = make_app(long_poll_max_seconds=30)
    api = admin_client(app, clock)
    api.create_fleet("gpu-a")
    _, session = api.ready_node(api.create_join_token("gpu-a"), "n1")
    answers = []
    waiter = threading.Thread(
        target=lambda: answers.append(_acquire(ApiClient(app, api.token), session, 30))
    )
    waiter.start()
    app.extensions["fleetd"].notifier.close()  # what `fleetd serve` does on SIGTERM
    waiter.join(timeout=15)  # a spinning wait would hold on for the whole 30 s
    assert answers == [{"assignment": None, "cancel": []}]
