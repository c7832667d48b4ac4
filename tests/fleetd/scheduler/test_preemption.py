"""Preemption planning: on-demand work stops the cheapest, fewest spot jobs; spot stops nothing."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetd.scheduler import (
    GpuAllocation,
    PlacementEngine,
    PreemptionPlan,
    RunningTask,
    TaskRequest,
    Unschedulable,
    freed,
    plan_preemption,
)
from tests.fleetd.scheduler.factories import GIB, make_cluster, make_node
from tests.fleetd.scheduler.test_properties import check_placements, clusters, requests
from tests.support.examples import examples


def busy_node(node_id, held):
    """An 8-GPU node whose first `held` GPUs are held whole by running tasks."""
    return make_node(node_id, gpus=8, gpu_overrides={i: {"exclusive": True} for i in range(held)})


def spot(job_id, node_id, gpu_indexes, bid, priority_class="spot"):
    allocs = tuple(GpuAllocation(f"GPU-{node_id}-{i}", 80 * GIB, 1000, True) for i in gpu_indexes)
    return RunningTask(
        f"{job_id}-t", job_id, node_id, gpus=allocs, priority_class=priority_class, bid=bid
    )


def test_no_victims_when_the_request_fits_as_things_are():
    plan = plan_preemption(
        make_cluster(busy_node("a", 4)), [spot("j1", "a", range(4), 1.0)], TaskRequest(gpus=4)
    )
    assert isinstance(plan, PreemptionPlan)
    assert plan.victim_jobs == () and plan.placement.node_ids == ("a",)


def test_on_demand_stops_the_lowest_bid_spot_job_that_makes_room():
    cluster = make_cluster(busy_node("a", 8), busy_node("b", 8))
    running = [spot("cheap", "a", range(8), 0.5), spot("dear", "b", range(8), 2.0)]
    plan = plan_preemption(cluster, running, TaskRequest(gpus=8))
    assert plan.victim_jobs == ("cheap",)
    assert plan.victim_tasks == ("cheap-t",)
    assert plan.placement.node_ids == ("a",)


def test_fewest_victims_unneeded_cheap_jobs_are_spared():
    # Stopping the cheap job frees two GPUs on a, where on-demand work holds the rest: not
    # enough, so the dearer job on b goes too, and then the cheap one turns out unneeded.
    cluster = make_cluster(busy_node("a", 8), busy_node("b", 8))
    running = [
        spot("cheap", "a", [0, 1], 0.1),
        spot("od", "a", range(2, 8), None, priority_class="on-demand"),
        spot("dear", "b", range(8), 0.3),
    ]
    plan = plan_preemption(cluster, running, TaskRequest(gpus=8))
    assert plan.victim_jobs == ("dear",)
    assert plan.placement.node_ids == ("b",)


def test_lowest_bids_go_first_even_if_more_jobs_stop():
    cluster = make_cluster(busy_node("a", 4), busy_node("b", 8))
    running = [
        spot("s1", "a", [0, 1], 0.1),
        spot("s2", "a", [2, 3], 0.2),
        spot("big", "b", range(8), 0.9),
    ]
    plan = plan_preemption(cluster, running, TaskRequest(gpus=8))
    assert plan.victim_jobs == ("s1", "s2")
    assert plan.victim_tasks == ("s1-t", "s2-t")


def test_on_demand_work_is_never_a_victim():
    cluster = make_cluster(busy_node("a", 8))
    running = [spot("od", "a", range(8), None, priority_class="on-demand")]
    plan = plan_preemption(cluster, running, TaskRequest(gpus=1))
    assert isinstance(plan, Unschedulable) and "no spot work" in plan.reason


def test_spot_work_never_preempts():
    cluster = make_cluster(busy_node("a", 8))
    running = [spot("cheap", "a", range(8), 0.1)]
    plan = plan_preemption(cluster, running, TaskRequest(gpus=1, priority_class="spot", bid=5.0))
    assert isinstance(plan, Unschedulable) and "spot work does not preempt" in plan.reason


def test_refused_when_even_every_spot_job_is_not_enough():
    cluster = make_cluster(busy_node("a", 8))
    plan = plan_preemption(cluster, [spot("cheap", "a", range(4), 0.1)], TaskRequest(gpus=8))
    assert isinstance(plan, Unschedulable) and "would not make room" in plan.reason


def test_freed_gives_back_shares_and_whole_gpus():
    node = make_node(
        "a", gpus=2, cpus=8, gpu_overrides={0: {"exclusive": True}, 1: {"compute_free_milli": 500}}
    )
    tasks = [
        RunningTask(
            "t1", "j", "a", gpus=(GpuAllocation("GPU-a-0", 80 * GIB, 1000, True),), cpu_milli=2000
        ),
        RunningTask("t2", "j", "a", gpus=(GpuAllocation("GPU-a-1", 0, 500, False),)),
    ]
    after = freed(make_cluster(node), tasks).nodes[0]
    assert after.cpu_free_milli == 10_000
    assert [g.idle for g in after.gpus] == [True, True]


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshot=clusters(),
    stream=st.lists(
        st.tuples(requests(), st.sampled_from(["spot", "on-demand"]), st.floats(0, 5)), max_size=8
    ),
    request=requests(),
)
def test_plans_stop_only_spot_jobs_and_place_within_what_they_free(snapshot, stream, request):
    # Run a random stream first; what it placed is the running work, spot or on-demand.
    engine = PlacementEngine(snapshot, policy="bestfit")
    running = []
    for i, (req, priority, bid) in enumerate(stream):
        placed = engine.place(req)
        if placed.schedulable:
            for r in placed.ranks:
                running.append(
                    RunningTask(
                        f"j{i}-r{r.rank}",
                        f"j{i}",
                        r.node_id,
                        r.gpus,
                        r.cpu_milli,
                        r.memory_bytes,
                        priority,
                        bid,
                    )
                )
    now = engine.snapshot()
    plan = plan_preemption(now, running, request)
    if isinstance(plan, PreemptionPlan):
        by_job = {t.job_id: t for t in running}
        assert all(by_job[j].priority_class == "spot" for j in plan.victim_jobs)
        victims = [t for t in running if t.job_id in plan.victim_jobs]
        assert sorted(plan.victim_tasks) == sorted(t.task_id for t in victims)
        check_placements(freed(now, victims), [(request, plan.placement)])
    else:
        everything_spot = freed(now, [t for t in running if t.priority_class == "spot"])
        if request.priority_class == "on-demand":
            assert not PlacementEngine(everything_spot).place(request).schedulable
