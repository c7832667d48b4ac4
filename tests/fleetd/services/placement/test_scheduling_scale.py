"""What keeps a pass cheap with a deep queue and a large fleet: equivalent jobs share one answer,
work that fits nowhere is parked until an event could change that, a pass is bounded, the write
phase re-checks what changed while the engine decided, and heartbeats widen with the fleet."""

import hypothesis
import hypothesis.strategies as st
import pytest

from fleetd import scheduler
from fleetd.liveness import LivenessTracker
from fleetd.services.placement import reasons as placement_reasons
from fleetd.services.placement import scheduling
from fleetwire.heartbeat import TaskReport
from tests.conftest import FakeClock, gpus
from tests.support import wait_until
from tests.support.examples import examples


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    return api.create_join_token("gpu-a")


def _count_engine_calls(monkeypatch):
    calls = []
    place = scheduler.PlacementEngine.place

    def counting(self, request, explain=False):
        if explain:  # the pass's own answers (a preemption plan's trial placements explain nothing)
            calls.append(request)
        return place(self, request, explain=explain)

    monkeypatch.setattr(scheduler.PlacementEngine, "place", counting)
    return calls


def _jobs_each_pass_reads(rt, monkeypatch):
    """[[job id, ...] in the order each pass from now on hands them to its decision phase]."""
    read, offload = [], rt.offload

    def spy(fn, *args):
        if fn is scheduling._decide:
            read.append([job.id for job in args[1]])
        return offload(fn, *args)

    monkeypatch.setattr(rt, "offload", spy)
    return read


def test_equivalent_jobs_that_do_not_fit_now_cost_one_engine_answer_per_pass(
    api, fleet, monkeypatch, clock
):
    api.ready_node(fleet, "n1", gpu_count=2)
    api.submit(name="hog", resources={"gpus": 2})
    jobs = [api.submit(name=f"j{i}", resources={"gpus": 1}) for i in range(20)]
    calls = _count_engine_calls(monkeypatch)
    clock.advance(31)  # the periodic pass asks a group parked that long again
    assert api.run_task("scheduling") == {"assigned": 0, "pending": 20}
    assert len(calls) == 1
    reasons = {api.get(f"/api/v1/jobs/{j['id']}").get_json()["pending_reason"] for j in jobs}
    assert reasons == {"no node can take the task now (gpu_count: 1 node(s))"}


def test_jobs_no_enrolled_node_could_ever_hold_are_not_put_to_the_engine(api, fleet, monkeypatch):
    # Their explanation would visit every node they may use (all of them, for jobs that name no
    # fleet: 100,000 at the largest scale measured); the inventory already says they never fit.
    api.ready_node(fleet, "n1")
    jobs = [
        api.submit(name=f"j{i}", resources={"gpus": 1, "gpu_types": ["NVIDIA B300"]})
        for i in range(20)
    ]
    calls = _count_engine_calls(monkeypatch)
    assert api.run_task("scheduling") == {"assigned": 0, "pending": 20}
    assert calls == []
    reasons = {api.get(f"/api/v1/jobs/{j['id']}").get_json()["pending_reason"] for j in jobs}
    assert reasons == {
        "no enrolled node has GPUs of the types it asks for (NVIDIA B300); their GPUs: "
        "NVIDIA H100 80GB HBM3"
    }
    reg = api.register(fleet, machine_id="n2", hostname="n2", gpus=gpus(1, model="NVIDIA B300"))
    api.heartbeat(reg["session_token"])  # a node that could hold one joins: one is placed at once
    assert sorted(api.job(j["id"])["state"] for j in jobs).count("queued") == 19


def test_a_parked_group_is_skipped_until_capacity_changes_and_then_placed(api, fleet, monkeypatch):
    n1, s1 = api.ready_node(fleet, "n1", gpu_count=2)
    big = api.submit(name="big", resources={"gpus": 4})
    assert big["state"] == "queued"
    calls = _count_engine_calls(monkeypatch)
    api.submit(
        name="small", resources={"gpus": 1}
    )  # a submit is no capacity event: "big" stays parked
    assert [c.gpus for c in calls] == [1]
    api.ready_node(
        fleet, "n2", gpu_count=4
    )  # a node joined: the parked group is looked at again at once
    assert api.get(f"/api/v1/jobs/{big['id']}").get_json()["state"] == "running"


def test_the_periodic_pass_looks_at_parked_groups_too(api, fleet, monkeypatch, clock):
    api.ready_node(fleet, "n1", gpu_count=2)
    api.submit(name="hog", resources={"gpus": 2})
    api.submit(resources={"gpus": 1})
    calls = _count_engine_calls(monkeypatch)
    api.run_task("scheduling")
    assert calls == []  # parked just now
    clock.advance(31)
    api.run_task("scheduling")
    assert len(calls) == 1  # events may be missed: the periodic pass is the net, after a while


def test_a_pass_is_bounded_and_the_rest_waits_for_the_next(make_app, clock):
    from tests.conftest import admin_client

    app = make_app(scheduler_max_placements_per_pass=3)
    api = admin_client(app, clock)
    api.create_fleet("gpu-a")
    node, _ = api.ready_node(api.create_join_token("gpu-a"), "n1", gpu_count=8)
    api.post(f"/api/v1/nodes/{node}/cordon")
    jobs = [api.submit(name=f"j{i}", resources={"gpus": 1}) for i in range(8)]
    api.post(f"/api/v1/nodes/{node}/uncordon")  # kicks a pass: three placed
    states = [api.get(f"/api/v1/jobs/{j['id']}").get_json()["state"] for j in jobs]
    assert states.count("running") == 3
    assert api.run_task("scheduling") == {"assigned": 3, "pending": 2}
    metrics = api.get("/metrics").get_data(as_text=True)
    assert "fleetd_scheduling_pass_bounded_total 2.0" in metrics


def test_a_node_cordoned_while_the_engine_decides_gets_no_work(api, fleet, monkeypatch):
    node, _ = api.ready_node(fleet, "n1")
    decide = scheduling._decide

    def cordon_meanwhile(*args):
        plan = decide(*args)
        api.post(f"/api/v1/nodes/{node}/cordon")  # lands between the read and the write phase
        return plan

    monkeypatch.setattr(scheduling, "_decide", cordon_meanwhile)
    job = api.submit(resources={"gpus": 1})
    monkeypatch.setattr(scheduling, "_decide", decide)
    assert api.get(f"/api/v1/jobs/{job['id']}").get_json()["state"] == "queued"
    api.post(f"/api/v1/nodes/{node}/uncordon")
    assert api.get(f"/api/v1/jobs/{job['id']}").get_json()["state"] == "running"


def test_a_job_cancelled_while_the_engine_decides_is_not_placed(api, fleet, monkeypatch):
    api.ready_node(fleet, "n1")
    decide = scheduling._decide
    cancelled = []

    def cancel_meanwhile(settings, queued, *rest):
        plan = decide(settings, queued, *rest)
        for job in queued:
            cancelled.append(api.post(f"/api/v1/jobs/{job.id}/cancel").get_json()["state"])
        return plan

    monkeypatch.setattr(scheduling, "_decide", cancel_meanwhile)
    job = api.submit(resources={"gpus": 1})
    monkeypatch.setattr(scheduling, "_decide", decide)
    assert cancelled == ["cancelled"]
    done = api.get(f"/api/v1/jobs/{job['id']}").get_json()
    assert done["state"] == "cancelled" and done["tasks"][0]["node_id"] is None


def test_the_heartbeat_interval_widens_with_the_fleet_and_the_ttl_with_it():
    clock = FakeClock()
    live = LivenessTracker(
        clock,
        ttl_seconds=30,
        grace_seconds=10,
        failover_grace_seconds=0,
        interval_seconds=10,
        max_heartbeats_per_second=100,
    )
    for n in range(900):
        live.touch(f"n{n}")
    assert live.heartbeat_interval() == 10
    for n in range(900, 2500):
        live.touch(f"n{n}")
    assert live.heartbeat_interval() == 25  # 2,500 nodes at 100/s
    clock.advance(80)
    assert not live.is_overdue("n0")  # silent 80 s: within the widened TTL (2.5 x 30) + grace 10
    clock.advance(10)
    assert live.is_overdue("n0")  # 90 s > 85 s
    for n in range(1000, 2500):  # most of the fleet leaves: the interval narrows at once ...
        live.forget(f"n{n}")
    live.touch("n1")
    assert live.heartbeat_interval() == 10
    clock.advance(80)
    assert not live.is_overdue("n1")  # ... but the TTL only once nodes may have heard it
    clock.advance(600)
    live.touch("n2")
    clock.advance(41)
    assert live.is_overdue("n2")  # back to 30 + 10


def test_a_kicked_pass_leaves_the_jobs_of_a_parked_group_that_know_why_unread(
    api, fleet, monkeypatch, clock
):
    from fleetd.db import database

    api.ready_node(fleet, "n1", gpu_count=4)
    api.submit(name="hog", resources={"gpus": 3})
    two = {"gpus": 2}  # one GPU is left: these wait for capacity
    backlog = {api.submit(name=f"b{i}", resources=two)["id"] for i in range(5)}
    assert api.run_task("scheduling") == {
        "assigned": 0,
        "pending": 5,
    }  # parks the group; all five know why
    rt = api.app.extensions["fleetd"]
    read = _jobs_each_pass_reads(rt, monkeypatch)
    late = api.submit(name="late", resources=two)  # joins the parked group: read once, told why
    fits = api.submit(name="fits", resources={"gpus": 1})
    assert api.job(fits["id"])["state"] in ("assigned", "running")
    with api.app.app_context(), database.connection_context():
        assert scheduling.run_pass(rt, full=False) == {"assigned": 0, "pending": 6}
    assert read and not any(backlog & set(ids) for ids in read)
    assert late["id"] in read[0] and late["id"] not in read[-1]
    reasons = {api.job(job_id)["pending_reason"] for job_id in backlog | {late["id"]}}
    assert reasons == {"no node can take the task now (gpu_count: 1 node(s))"}
    read.clear()
    clock.advance(31)
    assert api.run_task("scheduling") == {
        "assigned": 0,
        "pending": 6,
    }  # the periodic pass asks the group again, once it has been parked a while
    assert read == [[min(backlog)]]  # through its first job; the other five are not read
    # A job that never fits learns why at its submit: the parked group's reason is the same, so no
    # pass reads it again.
    api.submit(name="never", resources={"gpus": 1, "gpu_types": ["NVIDIA B300"]})
    assert api.run_task("scheduling") == {"assigned": 0, "pending": 7}
    read.clear()
    late_never = api.submit(name="never-late", resources={"gpus": 1, "gpu_types": ["NVIDIA B300"]})
    assert late_never["pending_reason"].startswith(
        "no enrolled node has GPUs of the types it asks for"
    )
    assert not any(late_never["id"] in ids for ids in read)


def test_every_queued_job_stores_the_key_of_the_group_its_pass_puts_it_in(api, fleet):
    from fleetd.models import Job
    from fleetd.services.placement import terms
    from tests.fleetd.services.workloads.test_instances import create, finish, start

    _, session = api.ready_node(fleet, "n1", gpu_count=2)
    api.submit(name="job", resources={"gpus": 4}, priority_class="spot", bid=1.5)
    inst = create(api, command=["sleep", "1d"])
    assignment = start(api, session)
    api.post(f"/api/v1/instances/{inst['id']}/stop")
    finish(api, session, assignment)
    api.post(f"/api/v1/instances/{inst['id']}/resume", {})  # a second run, pinned to its node
    with api.app.app_context():
        jobs = list(Job.select())
    assert len(jobs) == 3 and len({job.group_key for job in jobs}) == 3
    found = api.app.extensions["fleetd"].terms.get_many([job.id for job in jobs])
    for job in jobs:
        assert job.group_key == terms.group_key(found[job.id].group), job.name


def test_the_periodic_pass_asks_a_parked_group_through_its_first_job_and_places_all_once_it_fits(
    api, fleet, clock, monkeypatch
):
    rt = api.app.extensions["fleetd"]
    api.patch(
        "/api/v1/fleets/gpu-a",
        {"availability": {"timezone": "UTC", "windows": [{"start": "12:01", "end": "08:00"}]}},
    )
    _, session = api.ready_node(fleet, "n1", gpu_count=8)
    jobs = [api.submit(name=f"j{i}", resources={"gpus": 1})["id"] for i in range(5)]
    assert api.run_task("scheduling") == {
        "assigned": 0,
        "pending": 5,
    }  # parked: the fleet's window is closed
    read = _jobs_each_pass_reads(rt, monkeypatch)
    clock.advance(31)
    assert api.run_task("scheduling") == {"assigned": 0, "pending": 5}
    assert read == [
        [min(jobs)]
    ]  # the group is asked once, through its first job; the others are not read
    read.clear()
    for _ in range(2):  # the window opens: nothing announces it
        clock.advance(31)
        api.heartbeat(session)
    assert read == []  # no pass was kicked
    assert api.run_task("scheduling") == {"assigned": 5, "pending": 0}
    assert read == [
        [min(jobs)],
        sorted(jobs),
    ]  # it fits after all: the pass decides again over every job
    assert {api.job(job_id)["state"] for job_id in jobs} == {"running"}


def test_a_parked_groups_new_reason_reaches_its_first_job_at_once_and_the_others_in_the_next_pass(
    api, fleet, clock, monkeypatch
):
    from fleetd.db import database

    rt = api.app.extensions["fleetd"]
    api.patch(
        "/api/v1/fleets/gpu-a",
        {"availability": {"timezone": "UTC", "windows": [{"start": "11:00", "end": "12:01"}]}},
    )
    _, session = api.ready_node(fleet, "n1", gpu_count=2)
    api.submit(name="holder", resources={"gpus": 2})
    held = api.start_task(session)
    jobs = [api.submit(name=f"j{i}", resources={"gpus": 1})["id"] for i in range(3)]
    assert {api.job(job_id)["pending_reason"] for job_id in jobs} == {
        "no node can take the task now (gpu_count: 1 node(s))"
    }
    for _ in range(2):  # the window closes: nothing announces it
        clock.advance(31)
        api.heartbeat(
            session, tasks=[{"id": held["task_id"], "epoch": held["epoch"], "state": "running"}]
        )
    read = _jobs_each_pass_reads(rt, monkeypatch)
    kicks = []  # as under fleetd serve, where the scheduler loop runs the passes it is asked for
    monkeypatch.setattr(type(rt.scheduler), "running", property(lambda self: True))
    monkeypatch.setattr(
        rt.scheduler, "kick", lambda capacity=True, fleet=None: kicks.append(capacity)
    )
    assert api.run_task("scheduling") == {"assigned": 0, "pending": 3}
    closed = "no node can take the task now (status: 1 node(s))"
    assert [api.job(job_id)["pending_reason"] for job_id in jobs][0] == closed
    assert kicks == [False]  # a pass to tell the others, leaving parked groups parked
    with api.app.app_context(), database.connection_context():  # the pass fleetd serve kicks next
        assert scheduling.run_pass(rt, full=False) == {"assigned": 0, "pending": 3}
    assert read == [jobs[:1], jobs[1:]]  # the first job, then the two that did not know yet
    assert {api.job(job_id)["pending_reason"] for job_id in jobs} == {closed}


def test_reported_running_follows_each_nodes_last_heartbeat():
    live = LivenessTracker(FakeClock(), ttl_seconds=30, grace_seconds=10, failover_grace_seconds=0)
    live.touch("a", [TaskReport("t1", 1, "running"), TaskReport("t2", 3, "succeeded")])
    live.touch("b", [TaskReport("t3", 2, "starting")])
    live.touch("c")
    assert live.reported_running() == {"t1": ("a", 1), "t3": ("b", 2)}
    live.drop_task("a", "t1")
    live.touch("b", [])  # b's next heartbeat lists nothing
    assert live.reported_running() == {}
    live.touch("a", [TaskReport("t4", 1, "running")])
    live.touch("b", [TaskReport("t5", 1, "running")])
    live.forget("b")
    assert live.reported_running() == {"t4": ("a", 1)}


def test_a_job_that_joins_a_parked_group_says_why_at_once(api, fleet):
    api.ready_node(fleet, "n1")
    first = api.submit(resources={"gpus": 1, "gpu_types": ["NVIDIA B300"]})
    second = api.submit(resources={"gpus": 1, "gpu_types": ["NVIDIA B300"]})
    assert second["pending_reason"] == first["pending_reason"] != "waiting for the scheduler"


def test_a_job_for_a_fleet_and_type_no_node_has_says_so(api, fleet):
    api.ready_node(fleet, "n1")
    job = api.submit(
        resources={"gpus": 1, "gpu_types": ["NVIDIA B300"]}, node_selector={"fleet": "gpu-a"}
    )
    assert job["pending_reason"] == (
        "no enrolled node of fleet gpu-a has GPUs of the types it asks for "
        "(NVIDIA B300); their GPUs: NVIDIA H100 80GB HBM3"
    )
    other = api.submit(resources={"gpus": 16}, node_selector={"fleet": "gpu-a"})
    assert other["pending_reason"] == (
        "no enrolled node could ever hold it: it needs 16 GPUs on one node, the most "
        "any matching node has is 2"
    )
    labelled = api.submit(
        resources={"gpus": 1}, node_selector={"fleet": "gpu-a", "labels": {"rack": "r9"}}
    )
    assert (
        labelled["pending_reason"]
        == "no enrolled node of fleet gpu-a has the labels it selects (rack=r9)"
    )
    api.create_fleet("empty")
    nowhere = api.submit(resources={"gpus": 1}, node_selector={"fleet": "empty"})
    assert nowhere["pending_reason"] == "no node is enrolled in fleet empty"
    waits = api.submit(
        resources={"gpus": 2}, node_selector={"fleet": "gpu-a"}
    )  # fits once the first is done
    running = api.submit(resources={"gpus": 2})
    assert waits["state"] == "running" and "could ever" not in running["pending_reason"]


def test_a_submit_says_at_once_when_no_enrolled_node_could_ever_hold_the_job(
    api, fleet, monkeypatch
):
    api.ready_node(fleet, "n1", gpu_count=8)
    rt = api.app.extensions["fleetd"]
    # As under fleetd serve: the kick only wakes the loop, whose pass comes after the answer.
    monkeypatch.setattr(rt.scheduler, "kick", lambda capacity=True, fleet=None: False)
    job = api.submit(resources={"gpus": 16})
    assert job["state"] == "queued" and job["pending_reason"].startswith(
        "no enrolled node could ever hold it: it needs 16 GPUs on one node, the most any matching "
        "node has is 8"
    )
    assert api.submit(resources={"gpus": 8})["pending_reason"] == "waiting for the scheduler"


# ---------------------------------------------------------------- the inventory kept in memory

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "register",
                "gpus",
                "cordon",
                "uncordon",
                "drain",
                "undrain",
                "revoke",
                "delete",
                "window",
                "heartbeat",
                "labels",
            ]
        ),
        st.integers(min_value=0, max_value=3),
    ),
    min_size=1,
    max_size=12,
)


def _view(inventory):
    nodes = [
        (
            n.id,
            n.fleet_id,
            n.status,
            n.hostname,
            repr(n.labels),
            n.cpu_count,
            n.memory_bytes,
            n.container_runtime,
        )
        for n in inventory.nodes
    ]
    gpus = sorted((k, tuple(v)) for k, v in inventory.gpus.items())
    fleets = sorted(
        (name, repr(f.availability), repr(f.labels)) for name, f in inventory.fleets.items()
    )
    derived = (
        {fleet: [n.id for n in rows] for fleet, rows in inventory.by_fleet.items()},
        inventory.models,
        inventory.node_fleet,
        inventory.all_models,
        {k: n.id for k, n in inventory.by_id.items()},
    )
    return nodes, gpus, fleets, derived


@hypothesis.settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(ops=OPS)
def test_the_inventory_in_memory_equals_the_tables_after_any_events(make_app, clock, tmp_path, ops):
    import uuid

    from fleetd.db import database
    from fleetd.services.placement.inventory import load_inventory
    from tests.conftest import admin_client, gpus

    app = make_app(data_dir=str(tmp_path / uuid.uuid4().hex))  # a fresh database for every example
    api = admin_client(app, clock)
    rt = app.extensions["fleetd"]
    api.create_fleet("gpu-a")
    join = api.create_join_token("gpu-a")
    sessions = {}
    for op, n in ops:
        machine = f"m{n}"
        node_id = sessions.get(machine, (None,))[0]
        if op == "register":
            clock.advance(60)  # a re-enrolment needs the old agent silent
            reg = api.register(
                join, machine_id=machine, hostname=f"h{n}-{len(ops)}", gpu_count=n + 1
            )
            sessions[machine] = (reg["node_id"], reg["session_token"])
        elif node_id is None:
            continue
        elif op in ("gpus", "heartbeat"):
            body = {"gpus": gpus(n + 2)} if op == "gpus" else {}
            api.post(
                "/api/v1/agent/heartbeat",
                dict(body, tasks=[]),
                token=sessions[machine][1],
                agent=True,
            )
        elif op == "drain":
            api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "r", "deadline_seconds": 0})
        elif op == "delete":
            if api.delete(f"/api/v1/nodes/{node_id}").status_code == 204:
                del sessions[machine]
        elif op == "window":
            api.patch(
                "/api/v1/fleets/gpu-a",
                {"availability": {"windows": [{"start": f"0{n}:00", "end": "09:00"}]}},
            )
        elif op == "labels":
            api.patch("/api/v1/fleets/gpu-a", {"labels": {"zone": f"z{n}"}})
        else:
            api.post(f"/api/v1/nodes/{node_id}/{op}")
        with database.connection_context():
            assert _view(rt.inventory.get()) == _view(load_inventory())


def test_a_changed_node_is_read_again_alone_and_the_rest_kept(api, fleet):
    from fleetd.db import database
    from fleetd.services.placement.inventory import changed_since
    from tests.conftest import gpus

    first = api.ready_node(fleet, "n1")
    api.ready_node(fleet, "n2", gpu_count=2)
    rt = api.app.extensions["fleetd"]
    with database.connection_context():
        before = rt.inventory.get()
    api.post("/api/v1/agent/heartbeat", {"tasks": [], "gpus": gpus(4)}, token=first[1], agent=True)
    with database.connection_context():
        after = rt.inventory.get()
    assert after.history[-1] == (before.version, {first[0]})
    assert changed_since(after, before.version) == {first[0]} and changed_since(after, -1) is None
    assert len(after.gpus[first[0]]) == 4
    others = [n for n in after.nodes if n.id != first[0]]
    assert others and all(
        n is before.by_id[n.id] for n in others
    )  # unchanged nodes were not read again


def test_never_fits_answers_are_kept_for_one_inventory_at_a_time(api, fleet, monkeypatch):
    from fleetd.db import database
    from tests.conftest import gpus

    first = api.ready_node(fleet, "n1")
    rt = api.app.extensions["fleetd"]
    asked = []
    answer = placement_reasons._never_fits
    monkeypatch.setattr(
        placement_reasons,
        "_never_fits",
        lambda inventory, request: asked.append(request.gpus) or answer(inventory, request),
    )
    with database.connection_context():
        old = rt.inventory.get()
    request = scheduler.TaskRequest(gpus=64)
    reason = placement_reasons.never_fits(old, request)
    assert (
        reason and placement_reasons.never_fits(old, scheduler.TaskRequest(gpus=64)) == reason
    )  # once per shape
    assert placement_reasons.never_fits(old, scheduler.TaskRequest(gpus=1)) is None
    api.post("/api/v1/agent/heartbeat", {"tasks": [], "gpus": gpus(4)}, token=first[1], agent=True)
    with database.connection_context():
        new = rt.inventory.get()
    assert new is not old and "most any matching node has is 4" in placement_reasons.never_fits(
        new, request
    )  # asked anew
    assert asked == [64, 1, 64]


def test_inventories_and_engines_hold_no_reference_cycles(api, fleet):
    """fleetd serve freezes them out of the cyclic collector (server.freeze_long_lived): that is
    only safe while reference counting alone frees one that a later read or build replaces."""
    import gc

    from fleetd.db import database
    from fleetd.models import InventoryVersion
    from fleetd.services.placement.cluster import current_state
    from fleetd.services.placement.inventory import load_inventory

    api.ready_node(fleet, "n1", gpu_count=4)
    api.ready_node(fleet, "n2", gpu_count=2)
    api.submit(resources={"gpus": 1}, node_selector={"fleet": "gpu-a"})
    rt = api.app.extensions["fleetd"]
    with api.app.app_context(), database.connection_context():
        state = current_state(rt)
        version = InventoryVersion.get_by_id(1).version
        full = load_inventory(version)
        patched = load_inventory(version, previous=full)
        assert not full.history and patched.history
        engine, _ = rt.engines.engine(state, [scheduler.TaskRequest(gpus=1)])
        engine.place(scheduler.TaskRequest(gpus=1), explain=True)
        gc.collect()
        del full, patched, engine
        rt.engines = type(rt.engines)()  # the kept engines go too
        assert gc.collect() == 0


def test_requests_are_answered_while_a_pass_decides_off_the_loop(api, fleet, monkeypatch):
    import threading

    import gevent

    api.ready_node(fleet, "n1")
    job = api.submit(resources={"gpus": 4})  # waits: 2 GPUs only
    rt = api.app.extensions["fleetd"]
    pool = gevent.get_hub().threadpool
    monkeypatch.setattr(
        rt, "offload", lambda fn, *args: pool.apply(fn, args)
    )  # as fleetd serve does
    decide, started, release, order = scheduling._decide, threading.Event(), threading.Event(), []

    def held_decide(
        *args,
    ):  # in the worker thread: a pass that decides for as long as the test says
        started.set()
        assert release.wait(30)
        order.append("decided")
        return decide(*args)

    monkeypatch.setattr(scheduling, "_decide", held_decide)

    def one_pass():  # this test runs unpatched: the greenlets share one database connection
        with api.app.app_context():
            return scheduling.run_pass(rt)

    passing = gevent.spawn(one_pass)
    wait_until(
        started.is_set, 3, 0.01, "the worker thread to be inside the decision", pause=gevent.sleep
    )
    assert started.is_set()
    assert api.get(f"/api/v1/jobs/{job['id']}").status_code == 200  # the loop answers meanwhile
    order.append("answered")
    release.set()
    assert passing.get(timeout=30) == {"assigned": 0, "pending": 1}
    assert order == ["answered", "decided"]


def test_capacity_freed_in_one_fleet_wakes_only_the_groups_that_could_use_it(api, monkeypatch):
    api.create_fleet("real")
    api.create_fleet("sim")
    _, session = api.ready_node(api.create_join_token("real"), "r1", gpu_count=1)
    sim_node, _ = api.ready_node(api.create_join_token("sim"), "s1", gpu_count=1)
    api.post(f"/api/v1/nodes/{sim_node}/cordon")
    running = api.submit(name="real-job", resources={"gpus": 1}, node_selector={"fleet": "real"})
    assert running["state"] == "running"
    api.submit(name="sim-backlog", resources={"gpus": 1}, node_selector={"fleet": "sim"})
    api.submit(
        name="typed", resources={"gpus": 1, "gpu_types": ["NVIDIA B300"]}
    )  # no node has its type
    anywhere = api.submit(name="anywhere", resources={"gpus": 1})
    calls = _count_engine_calls(monkeypatch)
    assignment = api.start_task(session)
    api.task_call(
        session, assignment, "finish", outcome="succeeded", exit_code=0
    )  # frees an H100 in "real"
    assert [(c.node_selector.fleet, tuple(c.gpu_types)) for c in calls] == [
        (None, ())
    ]  # the group that can use it
    assert api.job(anywhere["id"])["state"] == "running"


def test_a_throttled_inventory_is_reloaded_at_most_once_a_second_and_says_how_stale(api, fleet):
    from fleetd.db import database
    from fleetd.services.placement.inventory import InventoryCache

    now = [100.0]
    cache = InventoryCache(throttle=True, monotonic=lambda: now[0])
    with database.connection_context():
        assert cache.get().nodes == [] and cache.stale_for == 0
    api.ready_node(fleet, "n1")  # the version moves
    with database.connection_context():
        assert cache.get().nodes == [] and cache.stale_for == 1.0  # a view at most a second old
        now[0] += 1.0
        assert [n.hostname for n in cache.get().nodes] == ["n1"] and cache.stale_for == 0


def test_callers_that_arrive_while_the_inventory_is_read_wait_and_take_that_read(api, fleet):
    import threading

    from fleetd.db import database
    from fleetd.services.placement.inventory import InventoryCache

    reads, reading, release = [], threading.Event(), threading.Event()

    def slow(
        fn, *args
    ):  # turning rows into objects takes a while (off the loop under fleetd serve)
        reads.append(fn.__name__)
        reading.set()
        assert release.wait(30)
        return fn(*args)

    class Arrivals:  # the read lock, noting each caller that reached it
        def __init__(self, lock):
            self.lock, self.callers = lock, []

        def __enter__(self):
            self.callers.append(threading.get_ident())  # one atomic append per caller
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    cache = InventoryCache(offload=slow)
    cache._reading = arrivals = Arrivals(cache._reading)
    api.ready_node(fleet, "n1")
    got = []

    def get():
        with database.connection_context():
            got.append(cache.get())

    callers = [threading.Thread(target=get) for _ in range(4)]
    callers[0].start()
    assert reading.wait(30)
    for caller in callers[1:]:
        caller.start()
    wait_until(lambda: len(arrivals.callers) == 4, timeout=30, message="every caller at the read")
    release.set()
    for caller in callers:
        caller.join(30)
    assert reads == ["_inventory"]  # read once, not once per caller
    assert len(got) == 4 and all(inventory is got[0] for inventory in got)
    assert [n.hostname for n in got[0].nodes] == ["n1"]


def test_a_submit_that_will_not_wait_for_capacity_is_refused_and_stores_nothing(api, fleet):
    api.ready_node(fleet, "n1", gpu_count=8)
    resp = api.post(
        "/api/v1/jobs?wait_for_capacity=false",
        {"name": "big", "command": ["true"], "resources": {"gpus": 16}},
    )
    err = resp.get_json()["error"]
    assert resp.status_code == 409 and err["details"] == {"reason": "no_capacity"}
    assert err["message"].startswith(
        "no enrolled node could ever hold it: it needs 16 GPUs on one node"
    )
    assert api.get("/api/v1/jobs").get_json()["items"] == []
    ok = api.post(
        "/api/v1/jobs?wait_for_capacity=false",
        {"name": "fits", "command": ["true"], "resources": {"gpus": 8}},
    )
    assert ok.status_code == 201 and ok.get_json()["state"] == "running"
    assert api.submit(resources={"gpus": 16})["state"] == "queued"  # by default it waits


def test_a_recent_inventory_read_spares_a_heartbeat_the_mig_read_of_a_node_without_mig(api, fleet):
    from fleetd.db import database
    from fleetd.services.placement.inventory import InventoryCache

    now = [100.0]
    cache = InventoryCache(monotonic=lambda: now[0])
    assert cache.may_hold_mig("n1")  # nothing read yet: the heartbeat reads
    node_id, _session = api.ready_node(fleet, "n1")
    assert cache.may_hold_mig(node_id)
    with database.connection_context():
        cache.get()
    assert not cache.may_hold_mig(node_id)  # its H100s are not in MIG mode
    assert cache.may_hold_mig("another")  # a node the read did not know
    now[0] += cache.TRUSTED_AGE + 1
    assert cache.may_hold_mig(node_id)  # too old to answer for the node
