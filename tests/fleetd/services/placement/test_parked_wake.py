"""A parked group is woken only by an event that could let it fit: capacity on a node of its fleet,
labels, GPU models and size, or a change to its team's allowance; its jobs are neither read nor
rewritten meanwhile (services.placement.parking)."""

import pytest

from fleetd.db import database
from fleetd.models import Job
from fleetd.services.placement import parking, scheduling
from fleetd.specs import Group
from tests.support.gpus import gpus

H100 = "NVIDIA H100 80GB HBM3"
B200 = "NVIDIA B200"


@pytest.fixture
def fleets(api):
    """Fleet gpu-a of H100 nodes and fleet gpu-b (its nodes come later): their join tokens."""
    api.create_fleet("gpu-a")
    api.create_fleet("gpu-b")
    return api.create_join_token("gpu-a"), api.create_join_token("gpu-b")


def _ready(api, join, name, count, model=H100):
    reg = api.register(
        join, machine_id=name, hostname=name, gpu_count=count, gpus=gpus(count, model=model)
    )
    api.heartbeat(reg["session_token"])
    return reg["node_id"], reg["session_token"]


class Watch:
    """What the passes from now on read and write of a set of jobs: the jobs handed to the decision
    phase, the requests the engine is asked about, the reasons written, and the rows as stored."""

    def __init__(self, api, monkeypatch, job_ids):
        self.api, self.job_ids = api, set(job_ids)
        self.read, self.asked, self.written = [], [], []
        rt = api.app.extensions["fleetd"]
        offload, place, record = (
            rt.offload,
            scheduling.scheduler.PlacementEngine.place,
            scheduling._RECORD_REASON,
        )

        def spy_offload(fn, *args):
            if fn is scheduling._decide:
                self.read.append({job.id for job in args[1]})
            return offload(fn, *args)

        def spy_place(engine, request, explain=False):
            if explain:
                self.asked.append(request)
            return place(engine, request, explain=explain)

        class SpyRecord:
            def execute(_, **values):
                self.written.append(values["id"])
                return record.execute(**values)

        monkeypatch.setattr(rt, "offload", spy_offload)
        monkeypatch.setattr(scheduling.scheduler.PlacementEngine, "place", spy_place)
        monkeypatch.setattr(scheduling, "_RECORD_REASON", SpyRecord())
        self.rows = self.stored()

    def stored(self):
        with self.api.app.app_context(), database.connection_context():
            return {
                row["id"]: row
                for row in Job.select().where(Job.id.in_(sorted(self.job_ids))).dicts()
            }

    def untouched(self):
        """True when no pass read, asked about or wrote any of the jobs, and their rows are as they
        were."""
        return (
            not any(self.job_ids & ids for ids in self.read)
            and not self.written_here()
            and self.stored() == self.rows
        )

    def written_here(self):
        return self.job_ids & set(self.written)


def _parked_keys(api):
    return set(api.app.extensions["fleetd"].parked.parked())


def test_a_task_end_on_a_node_of_another_gpu_type_leaves_an_unscoped_parked_group_unread(
    api, fleets, monkeypatch
):
    join_a, join_b = fleets
    _, session = _ready(api, join_a, "h100", 2)
    backlog = [
        api.submit(name=f"b{i}", resources={"gpus": 1, "gpu_types": [B200]})["id"] for i in range(4)
    ]
    assert {api.job(j)["state"] for j in backlog} == {"queued"}
    assert len(_parked_keys(api)) == 1
    watch = Watch(api, monkeypatch, backlog)
    fits = api.submit(name="fits", resources={"gpus": 1})  # a submit wakes nothing
    task = api.start_task(session)
    api.task_call(
        session, task, "finish", outcome="succeeded", exit_code=0
    )  # GPUs free on an H100 node
    assert api.job(fits["id"])["state"] == "succeeded"
    assert watch.read and watch.untouched()
    assert not any(B200 in request.gpu_types for request in watch.asked)
    assert len(_parked_keys(api)) == 1

    _ready(
        api, join_b, "b200", 2, model=B200
    )  # a node of its type joins (another fleet: it names none)
    states = [api.job(j)["state"] for j in backlog]
    assert states.count("running") == 2 and states.count("queued") == 2
    assert any(backlog[0] in ids for ids in watch.read)


def test_a_parked_group_is_placed_when_gpus_of_its_type_free_up_and_not_before(
    api, fleets, monkeypatch
):
    join_a, join_b = fleets
    _, h100 = _ready(api, join_a, "h100", 2)
    _, b200 = _ready(api, join_b, "b200", 1, model=B200)
    first, second = (
        api.submit(name=n, resources={"gpus": 1, "gpu_types": [B200]})["id"]
        for n in ("first", "second")
    )
    held = api.start_task(b200)
    assert (api.job(first)["state"], api.job(second)["state"]) == ("running", "queued")
    api.submit(name="other", resources={"gpus": 1}, node_selector={"fleet": "gpu-a"})
    other = api.start_task(h100)
    watch = Watch(api, monkeypatch, [second])
    api.task_call(
        h100, other, "finish", outcome="succeeded", exit_code=0
    )  # an H100 frees up: not its type
    assert watch.untouched()
    api.task_call(b200, held, "finish", outcome="succeeded", exit_code=0)  # a B200 frees up
    assert api.job(second)["state"] == "running"


def test_a_group_that_selects_a_label_is_woken_by_uncordoning_a_node_that_has_it(
    api, fleets, monkeypatch
):
    join_a, _ = fleets
    plain, _ = _ready(api, join_a, "plain", 2)
    zoned, _ = _ready(api, join_a, "zoned", 2)
    assert api.patch(f"/api/v1/nodes/{zoned}", {"labels": {"zone": "west"}}).status_code == 200
    for node in (plain, zoned):
        assert api.post(f"/api/v1/nodes/{node}/cordon").status_code == 200
    job = api.submit(resources={"gpus": 1}, node_selector={"labels": {"zone": "west"}})["id"]
    assert api.job(job)["state"] == "queued" and _parked_keys(api)
    watch = Watch(api, monkeypatch, [job])
    assert api.post(f"/api/v1/nodes/{plain}/uncordon").status_code == 200  # no zone=west there
    assert watch.untouched() and api.job(job)["state"] == "queued"
    assert api.post(f"/api/v1/nodes/{zoned}/uncordon").status_code == 200
    assert api.job(job)["state"] == "running"
    assert api.job(job)["tasks"][0]["node_id"] == zoned


def test_a_quota_raise_wakes_its_teams_group_and_another_teams_quota_does_not(
    api, fleets, monkeypatch
):
    join_a, _ = fleets
    _, session = _ready(api, join_a, "h100", 4)
    assert api.call("PUT", "/api/v1/quotas/vision", json={"max_gpus": 1}).status_code == 200
    first, second = (
        api.submit(name=n, team="vision", resources={"gpus": 1})["id"] for n in ("first", "second")
    )
    assert api.job(second)["pending_reason"].startswith("team vision at its quota")
    assert _parked_keys(api)
    watch = Watch(api, monkeypatch, [second])
    assert api.call("PUT", "/api/v1/quotas/speech", json={"max_gpus": 8}).status_code == 200
    api.submit(
        name="speech", team="speech", resources={"gpus": 1}
    )  # placed; the vision group is not asked
    assert watch.untouched()
    assert api.call("PUT", "/api/v1/quotas/vision", json={"max_gpus": 2}).status_code == 200
    assert api.job(second)["state"] == "running"


def test_a_task_of_the_team_ending_wakes_its_group_held_at_its_quota(api, fleets):
    join_a, _ = fleets
    _, session = _ready(api, join_a, "h100", 4)
    assert api.call("PUT", "/api/v1/quotas/vision", json={"max_gpus": 1}).status_code == 200
    first, second = (
        api.submit(name=n, team="vision", resources={"gpus": 1})["id"] for n in ("first", "second")
    )
    task = api.start_task(session)
    assert api.job(second)["state"] == "queued"
    api.task_call(session, task, "finish", outcome="succeeded", exit_code=0)
    assert api.job(first)["state"] == "succeeded" and api.job(second)["state"] == "running"


def test_the_periodic_pass_asks_a_parked_group_again_only_once_it_has_waited_a_while(
    api, fleets, monkeypatch, clock
):
    join_a, _ = fleets
    _ready(api, join_a, "h100", 2)
    api.submit(name="holds", resources={"gpus": 2})
    big = api.submit(name="big", resources={"gpus": 1, "cpus": 0.5})["id"]
    assert api.job(big)["state"] == "queued" and _parked_keys(api)
    watch = Watch(api, monkeypatch, [big])
    api.run_task("scheduling")  # parked just now: not asked again
    assert watch.untouched()
    clock.advance(31)  # past scheduler_parked_recheck_seconds: asked again, and parked again
    api.run_task("scheduling")
    assert any(request.cpu_milli == 500 for request in watch.asked)
    assert api.job(big)["state"] == "queued" and _parked_keys(api)
    asked = len(watch.asked)
    api.run_task("scheduling")
    assert len(watch.asked) == asked


def test_due_names_groups_parked_long_enough_or_whose_fleet_opened_a_window_since():
    import datetime as dt

    t0 = dt.datetime(2026, 1, 1, 12)
    old, new, other = _group(fleet="gpu-a"), _group(fleet="gpu-b"), _group(fleet=None)
    parked = parking.ParkedGroups()
    parked.update({old: ("no room", parking.CAPACITY)}, parked.stamps(), now=t0)
    later = t0 + dt.timedelta(seconds=20)
    parked.update(
        {new: ("no room", parking.CAPACITY), other: ("no room", parking.CAPACITY)},
        parked.stamps(),
        now=later,
    )
    at = t0 + dt.timedelta(seconds=35)
    assert parked.due(30, at) == {old}
    assert parked.due(30, at, lambda since, fleet: fleet == "gpu-b") == {old, new}
    parked.update({}, parked.stamps(), looked={old})
    assert parked.due(30, at) == set()


def _group(**fields):
    base = dict(
        gpus=1,
        num_nodes=1,
        gpu_memory_bytes=None,
        gpu_compute_percent=None,
        gpu_types=(),
        cpus=1.0,
        memory_bytes=0,
        fleet=None,
        labels=(),
        node_id=None,
        container=False,
        team="",
        priority_class="spot",
        bid=None,
        image=None,
        owner="",
        host_ports=0,
        mps=False,
        topology="preferred",
        same_block="preferred",
    )
    return Group(**dict(base, **fields))


WEST = {"zone": "west"}


@pytest.mark.parametrize(
    "event, woken",
    [
        (None, True),
        (parking.node_capacity("n1", "gpu-a", WEST, [H100], 8), False),  # another type
        (parking.node_capacity("n1", "gpu-a", WEST, [B200], 8), True),
        (
            parking.node_capacity("n1", "gpu-a", WEST, [B200, H100], 8),
            False,
        ),  # the engine wants every model accepted
        (parking.node_capacity("n1", "gpu-b", WEST, [B200], 8), False),  # another fleet
        (parking.node_capacity("n1", "gpu-a", {}, [B200], 8), False),  # not its label
        (parking.node_capacity("n1", "gpu-a", {"zone": "east"}, [B200], 8), False),
        (parking.node_capacity("n1", "gpu-a", dict(WEST, rack="7"), [B200], 8), True),
        (parking.node_capacity("n1", "gpu-a", WEST, [B200], 2), False),  # too few GPUs for one rank
        (parking.node_capacity("n1", "gpu-a", WEST, [B200], 8, team="speech", ended=True), True),
        (parking.node_capacity(), True),  # a node not known: wake
        (parking.fleet_changed("gpu-a"), True),
        (parking.fleet_changed("gpu-b"), False),
        (parking.team_allowance("vision"), False),  # parked for capacity: a quota does not help
    ],
)
def test_what_wakes_a_group_parked_for_capacity(event, woken):
    key = _group(
        gpus=4, gpu_types=(B200,), fleet="gpu-a", labels=(("zone", "west"),), team="vision"
    )
    parked = parking.ParkedGroups()
    parked.update({key: ("no room", parking.CAPACITY)}, parked.stamps())
    parked.bump(event)
    assert (key not in parked.parked()) is woken
    assert (
        parking.wakes(
            parking.Capacity.from_wire(event.to_wire()) if event else None, key, parking.CAPACITY
        )
        is woken
    )


@pytest.mark.parametrize(
    "event, woken",
    [
        (parking.team_allowance("vision"), True),
        (parking.team_allowance("speech"), False),
        (
            parking.node_capacity("n1", "gpu-a", {}, [H100], 8),
            False,
        ),  # a node joined: the quota still holds
        (parking.node_capacity("n1", "gpu-a", {}, [H100], 8, team="vision", ended=True), True),
        (parking.node_capacity("n1", "gpu-a", {}, [H100], 8, team="speech", ended=True), False),
        (parking.node_capacity(ended=True), True),  # a task of a team not known ended
    ],
)
def test_what_wakes_a_group_held_back_by_its_teams_allowance(event, woken):
    key = _group(team="vision")
    parked = parking.ParkedGroups()
    parked.update({key: ("at quota", parking.ALLOWANCE)}, parked.stamps())
    parked.bump(event)
    assert (key not in parked.parked()) is woken


def test_a_group_is_not_parked_when_an_event_that_could_let_it_fit_came_during_the_pass():
    key, other = _group(gpu_types=(B200,)), _group(gpu_types=(H100,))
    parked = parking.ParkedGroups()
    since = parked.stamps()  # a pass begins
    parked.bump(
        parking.node_capacity("n1", "gpu-a", {}, [B200], 8)
    )  # meanwhile a B200 node comes back
    parked.update({key: ("no room", parking.CAPACITY), other: ("no room", parking.CAPACITY)}, since)
    assert set(parked.parked()) == {other}
    parked.update({}, parked.stamps(), looked={other})  # a later pass asked it and it fit
    assert parked.parked() == {}


def test_a_pass_older_than_the_events_remembered_parks_nothing(monkeypatch):
    monkeypatch.setattr(parking, "LOG_EVENTS", 3)
    parked = parking.ParkedGroups()
    since = parked.stamps()
    for _ in range(4):
        parked.bump(parking.team_allowance("other"))
    parked.update({_group(): ("no room", parking.CAPACITY)}, since)
    assert parked.parked() == {}


def test_a_kick_from_another_replica_carries_what_changed():
    event = parking.node_capacity("n1", "gpu-a", WEST, [B200, H100], 8, team="vision", ended=True)
    assert parking.Capacity.from_wire(event.to_wire()) == event
    assert parking.Capacity.from_wire(
        parking.team_allowance("vision").to_wire()
    ) == parking.team_allowance("vision")
    assert parking.Capacity.from_wire("gpu-a") == parking.fleet_changed(
        "gpu-a"
    )  # a replica of the version before
    assert parking.Capacity.from_wire(None) is None  # not known what: every group wakes


def test_a_kick_too_long_for_the_replicas_bus_wakes_every_group():
    labels = {f"label-{i}": "v" * 60 for i in range(64)}
    assert parking.node_capacity("n1", "gpu-a", labels, [B200], 8).to_wire() is None


def test_a_pass_on_a_throttled_inventory_parks_no_group_a_node_it_does_not_show_yet_could_serve(
    api, fleets, monkeypatch
):
    import time

    join_a, join_b = fleets
    rt = api.app.extensions["fleetd"]
    _ready(api, join_a, "h100", 2)
    backlog = [
        api.submit(name=f"b{i}", resources={"gpus": 1, "gpu_types": [B200]})["id"] for i in range(2)
    ]
    assert len(_parked_keys(api)) == 1
    now = [
        time.monotonic() + 1000
    ]  # as under fleetd serve: an inventory read at most once a second
    monkeypatch.setattr(rt.inventory, "throttle", True)
    monkeypatch.setattr(rt.inventory, "_monotonic", lambda: now[0])
    _ready(api, join_a, "h100-2", 2)  # its pass reads the inventory fresh
    _ready(api, join_a, "h100-3", 2)  # the next ones see a view without this node for a second
    assert api.run_task("scheduling") == {
        "assigned": 0,
        "pending": 2,
        "retry_in": 1.0,
    }  # asks the group on it
    assert len(_parked_keys(api)) == 1  # no node it could use came meanwhile
    _ready(
        api, join_b, "b200", 2, model=B200
    )  # wakes the group; its pass's view does not show the node yet
    assert {api.job(j)["state"] for j in backlog} == {"queued"} and not _parked_keys(api)
    now[0] += 1
    with (
        api.app.app_context(),
        database.connection_context(),
    ):  # the pass fleetd serve runs once the view may be read
        assert scheduling.run_pass(rt, full=False)["assigned"] == 2


def test_a_pass_knows_from_which_event_on_its_inventory_may_miss_a_change():
    parked = parking.ParkedGroups()
    assert parked.view_since(7, 3, stale=True) is None  # a view no pass read fresh: not known
    assert parked.view_since(7, 5, stale=False) == 5
    assert parked.view_since(7, 9, stale=True) == 5  # the same view, throttled, in a later pass
    assert parked.view_since(8, 9, stale=True) is None
    parked.update({_group(): ("no room", parking.CAPACITY)}, None)
    assert parked.parked() == {}


def test_groups_parked_by_one_pass_fall_due_over_the_half_before_the_recheck_age():
    import datetime as dt

    t0 = dt.datetime(2026, 1, 1, 12)
    keys = [_group(cpus=float(n)) for n in range(40)]
    parked = parking.ParkedGroups()
    parked.update({key: ("no room", parking.CAPACITY) for key in keys}, parked.stamps(), now=t0)
    assert parked.due(30, t0 + dt.timedelta(seconds=14)) == set()
    some = parked.due(30, t0 + dt.timedelta(seconds=22))
    assert 0 < len(some) < len(keys)
    assert parked.due(30, t0 + dt.timedelta(seconds=30)) == set(keys)
