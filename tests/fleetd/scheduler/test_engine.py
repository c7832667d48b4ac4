"""Concrete placement scenarios: whole and fractional GPUs, filters, gangs, NUMA, explanations."""

import ast
import pathlib
import sys

import pytest

from fleetd.scheduler import (
    DEFAULT_POLICY,
    PLACEMENT_GROUP,
    POLICIES,
    FragmentationModel,
    NodeSelector,
    Placement,
    PlacementEngine,
    TaskRequest,
    TaskShape,
    Unschedulable,
    WorkloadProfile,
    make_policy,
    profile_from_requests,
    schedule,
)
from tests.fleetd.scheduler.factories import GIB, make_cluster, make_node

SCHEDULER_DIR = pathlib.Path(__file__).resolve().parents[3] / "fleetd" / "scheduler"


def gpu_uuids(result):
    return [g.uuid for r in result.ranks for g in r.gpus]


def test_whole_gpus_are_exclusive_with_full_memory_limits():
    engine = PlacementEngine(make_cluster(make_node("a", gpus=4)))
    result = engine.place(TaskRequest(gpus=2, cpus=4))
    assert isinstance(result, Placement)
    (rank,) = result.ranks
    assert rank.node_id == "a" and len(rank.gpus) == 2
    assert all(
        g.exclusive and g.compute_milli == 1000 and g.memory_limit_bytes == 80 * GIB
        for g in rank.gpus
    )
    assert rank.cpu_milli == 4000


def test_fraction_takes_a_slice_of_one_gpu_with_proportional_limits():
    engine = PlacementEngine(make_cluster(make_node("a", gpus=1)))
    result = engine.place(TaskRequest(gpus=0.25))
    (alloc,) = result.ranks[0].gpus
    assert not alloc.exclusive
    assert alloc.compute_milli == 250
    assert alloc.memory_limit_bytes == 20 * GIB


def test_slices_fill_a_gpu_and_then_it_is_full():
    engine = PlacementEngine(make_cluster(make_node("a", gpus=1)))
    first = engine.place(TaskRequest(gpus=0.5))
    second = engine.place(TaskRequest(gpus=0.5))
    assert gpu_uuids(first) == gpu_uuids(second) == ["GPU-a-0"]
    third = engine.place(TaskRequest(gpus=0.1), explain=True)
    assert isinstance(third, Unschedulable)
    assert [(d.node_id, d.stage) for d in third.filter_detail] == [("a", "gpu")]


def test_a_sliced_gpu_is_not_given_away_whole():
    engine = PlacementEngine(make_cluster(make_node("a", gpus=1)))
    assert engine.place(TaskRequest(gpus=1, gpu_memory_bytes=8 * GIB)).schedulable
    result = engine.place(TaskRequest(gpus=1), explain=True)
    assert not result.schedulable
    assert result.filter_detail[0].stage == "gpu"


def test_explicit_gpu_memory_is_the_limit_and_is_enforced():
    engine = PlacementEngine(make_cluster(make_node("a", gpus=1)))
    placed = engine.place(TaskRequest(gpus=0.2, gpu_memory_bytes=60 * GIB))
    assert placed.ranks[0].gpus[0].memory_limit_bytes == 60 * GIB
    over = engine.place(TaskRequest(gpus=0.2, gpu_memory_bytes=30 * GIB), explain=True)
    assert not over.schedulable
    assert over.filter_detail[0].stage == "gpu_memory"


def test_compute_percent_sets_the_compute_share():
    engine = PlacementEngine(make_cluster(make_node("a", gpus=1)))
    result = engine.place(TaskRequest(gpus=1, gpu_compute_percent=30, gpu_memory_bytes=10 * GIB))
    alloc = result.ranks[0].gpus[0]
    assert (alloc.compute_milli, alloc.memory_limit_bytes, alloc.exclusive) == (
        300,
        10 * GIB,
        False,
    )


def test_unhealthy_and_held_gpus_never_receive_work():
    node = make_node("a", gpus=3, gpu_overrides={0: {"healthy": False}, 1: {"exclusive": True}})
    engine = PlacementEngine(make_cluster(node))
    result = engine.place(TaskRequest(gpus=1))
    assert gpu_uuids(result) == ["GPU-a-2"]
    more = engine.place(TaskRequest(gpus=0.5), explain=True)
    assert not more.schedulable
    detail = engine.explain(TaskRequest(gpus=2))
    assert detail[0].stage == "gpu_count" and "2 unhealthy or held" in detail[0].reason


def test_cordoned_node_gets_nothing_and_explain_says_why():
    cluster = make_cluster(
        make_node("a", schedulable=False, status="cordoned"), make_node("b", gpus=0)
    )
    result = PlacementEngine(cluster).place(TaskRequest(gpus=1), explain=True)
    assert not result.schedulable
    stages = {d.node_id: (d.stage, d.reason) for d in result.filter_detail}
    assert stages["a"][0] == "status" and "cordoned" in stages["a"][1]
    assert stages["b"][0] == "gpu_count"
    assert "status: 1 node(s)" in result.reason


def test_cpu_only_task_runs_on_a_gpu_less_node_and_leaves_gpus_alone():
    engine = PlacementEngine(make_cluster(make_node("a", gpus=0, cpus=8)))
    result = engine.place(TaskRequest(gpus=0, cpus=8, memory_bytes=GIB))
    assert result.ranks[0].node_id == "a" and result.ranks[0].gpus == ()
    assert engine.explain(TaskRequest(cpus=1))[0].stage == "cpu"


def test_equally_good_nodes_share_work_by_how_busy_they_are():
    # Tasks that take no GPU and no CPU leave every node equally good: they go round the nodes in
    # groups (a node's agent gets a group in one acquire), not all to "a".
    engine = PlacementEngine(make_cluster(make_node("a"), make_node("b"), make_node("c")))
    picks = [engine.place(TaskRequest()).node_ids[0] for _ in range(3 * PLACEMENT_GROUP + 1)]
    assert picks == ["a"] * PLACEMENT_GROUP + ["b"] * PLACEMENT_GROUP + ["c"] * PLACEMENT_GROUP + [
        "a"
    ]
    assert [n.tasks for n in engine.snapshot().nodes] == [
        PLACEMENT_GROUP + 1,
        PLACEMENT_GROUP,
        PLACEMENT_GROUP,
    ]
    # Tasks already running count in full; released ones stop counting.
    engine = PlacementEngine(
        make_cluster(make_node("a", tasks=3), make_node("b", tasks=1), make_node("c", tasks=1))
    )
    first = engine.place(TaskRequest())
    assert first.node_ids == ("b",)
    assert [engine.place(TaskRequest()).node_ids[0] for _ in range(PLACEMENT_GROUP)] == ["b"] * (
        PLACEMENT_GROUP - 1
    ) + ["c"]
    engine.release(
        first
    )  # b: 1 running + 3 placed, as busy as c (1 + 1) in steps of a group; b is earlier
    assert engine.place(TaskRequest()).node_ids == ("b",)
    # Busyness only breaks ties: a whole-GPU task still packs onto the node that has GPUs in use.
    held = {i: {"exclusive": True} for i in range(6)}
    cluster = make_cluster(
        make_node("a", gpus=8), make_node("b", gpus=8, gpu_overrides=held, tasks=6)
    )
    assert PlacementEngine(cluster, policy="bestfit").place(TaskRequest(gpus=1)).node_ids == ("b",)


def test_node_selector_restricts_fleet_and_labels():
    cluster = make_cluster(
        make_node("a", fleet="lab"),
        make_node("b", fleet="prod", labels={"zone": "x"}),
        make_node("c", fleet="prod", labels={"zone": "y"}),
    )
    request = TaskRequest(gpus=1, node_selector=NodeSelector(fleet="prod", labels={"zone": "y"}))
    result = PlacementEngine(cluster).place(request)
    assert result.node_ids == ("c",)
    detail = {d.node_id: d for d in PlacementEngine(cluster).explain(request)}
    assert detail["a"].stage == detail["b"].stage == "selector"
    assert "fleet 'lab'" in detail["a"].reason and "zone=y" in detail["b"].reason


def test_a_node_that_runs_tasks_as_their_owners_accounts_takes_only_those_it_resolved():
    cluster = make_cluster(
        make_node("a", fleet="lab", accounts=frozenset({"bob"})),
        make_node("b", fleet="lab", accounts=frozenset({"alice"})),
        make_node("c", fleet="lab", accounts=frozenset()),
    )
    assert PlacementEngine(cluster).place(TaskRequest(gpus=1, account="alice")).node_ids == ("b",)
    nowhere = TaskRequest(gpus=1, account="carol")
    result = PlacementEngine(cluster).place(nowhere, explain=True)
    assert isinstance(result, Unschedulable)
    assert {d.stage for d in result.filter_detail} == {"identity"}
    assert "identity: 3 node(s): the owner's account does not resolve" in result.reason
    # Work with no account to resolve (a service account's) may go anywhere.
    assert PlacementEngine(cluster).place(TaskRequest(gpus=1)).node_ids
    # A node whose fleet runs tasks otherwise (accounts None) takes anyone's.
    open_cluster = make_cluster(make_node("d"))
    assert PlacementEngine(open_cluster).place(nowhere).node_ids == ("d",)


def test_gpu_types_filter_models():
    cluster = make_cluster(make_node("a", model="A100"), make_node("b", model="H100"))
    result = PlacementEngine(cluster).place(TaskRequest(gpus=1, gpu_types=("H100",)))
    assert result.node_ids == ("b",)
    detail = PlacementEngine(cluster).explain(TaskRequest(gpus=1, gpu_types=("L4",)))
    assert {d.stage for d in detail} == {"gpu_type"}


def test_gang_ranks_land_on_distinct_nodes():
    cluster = make_cluster(make_node("a"), make_node("b"), make_node("c"))
    result = PlacementEngine(cluster).place(TaskRequest(gpus=8, num_nodes=3))
    assert sorted(result.node_ids) == ["a", "b", "c"]
    assert [r.rank for r in result.ranks] == [0, 1, 2]


def test_gang_is_all_or_nothing():
    cluster = make_cluster(make_node("a", gpus=8), make_node("b", gpus=4))
    engine = PlacementEngine(cluster)
    result = engine.place(TaskRequest(gpus=8, num_nodes=2), explain=True)
    assert isinstance(result, Unschedulable)
    assert result.placed_ranks == 1
    assert "only 1 of 2 nodes" in result.reason
    assert {d.node_id: d.stage for d in result.filter_detail} == {"a": "gang", "b": "gpu_count"}
    # Nothing was kept: the 8-GPU node is still whole.
    assert engine.place(TaskRequest(gpus=8)).node_ids == ("a",)


def test_multi_gpu_task_stays_on_one_numa_node():
    busy = {0: {"compute_free_milli": 500}}
    engine = PlacementEngine(make_cluster(make_node("a", gpus=8, gpu_overrides=busy)))
    result = engine.place(TaskRequest(gpus=4))
    assert gpu_uuids(result) == [f"GPU-a-{i}" for i in (4, 5, 6, 7)]
    # Three GPUs left on NUMA node 0: a pair goes there, leaving nothing split.
    pair = engine.place(TaskRequest(gpus=2))
    assert gpu_uuids(pair) == ["GPU-a-1", "GPU-a-2"]


def test_simulate_reserves_nothing_and_release_gives_back():
    engine = PlacementEngine(make_cluster(make_node("a", gpus=2)))
    assert engine.simulate(TaskRequest(gpus=2)).schedulable
    placed = engine.place(TaskRequest(gpus=2))
    assert not engine.simulate(TaskRequest(gpus=1)).schedulable
    engine.release(placed)
    assert engine.place(TaskRequest(gpus=2)).schedulable


def test_schedule_places_in_order_against_one_snapshot():
    results = schedule(
        make_cluster(make_node("a", gpus=2)), [TaskRequest(gpus=2), TaskRequest(gpus=1)]
    )
    assert [r.schedulable for r in results] == [True, False]
    assert results[1].filter_detail[0].stage == "gpu"


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_places_whole_and_fractional_work(policy):
    cluster = make_cluster(make_node("a", gpus=2), make_node("b", gpus=2, model="A100"))
    requests = [
        TaskRequest(gpus=0.5),
        TaskRequest(gpus=1, gpu_types=("A100",)),
        TaskRequest(gpus=0.5),
        TaskRequest(cpus=2),
    ]
    profile = profile_from_requests(requests)
    results = schedule(cluster, requests, policy=policy, profile=profile)
    assert all(r.schedulable for r in results)
    assert results[1].node_ids == ("b",)


def test_bestfit_prefers_the_fuller_node_and_random_is_seeded():
    held = {i: {"exclusive": True} for i in range(6)}
    cluster = make_cluster(make_node("a", gpus=8), make_node("b", gpus=8, gpu_overrides=held))
    assert PlacementEngine(cluster, policy="bestfit").place(TaskRequest(gpus=1)).node_ids == ("b",)

    def random_picks():
        engines = [PlacementEngine(cluster, policy="random", seed=s) for s in range(40)]
        return [e.place(TaskRequest(gpus=1)).node_ids for e in engines]

    picks = random_picks()
    assert set(picks) == {("a",), ("b",)}
    assert picks == random_picks()


def test_fgd_slices_the_gpu_that_fragments_least():
    # One GPU has 0.3 left, the other is idle; the workload is made of 0.3 and 1.0 tasks.
    profile = WorkloadProfile(
        (TaskShape(1000, 300, 1, weight=0.5), TaskShape(1000, 1000, 1, weight=0.5))
    )
    node = make_node("a", gpus=2, gpu_overrides={0: {"compute_free_milli": 300}})
    for policy in ("fgd", DEFAULT_POLICY):
        engine = PlacementEngine(make_cluster(node), policy=policy, profile=profile)
        result = engine.place(TaskRequest(gpus=0.3, cpus=1))
        assert gpu_uuids(result) == ["GPU-a-0"], policy


def test_fragmentation_amount_follows_the_paper_definition():
    profile = WorkloadProfile(
        (
            TaskShape(0, 0, 0, weight=0.25),  # CPU-only: every idle GPU share is fragment to it
            TaskShape(4000, 500, 1, weight=0.25),  # fits: GPUs with < 500 left are fragment
            TaskShape(4000, 1000, 2, weight=0.25),  # needs two idle GPUs: only one, all is fragment
            TaskShape(1000, 500, 1, ("A100",), weight=0.25),  # wrong model: all is fragment
        )
    )
    frag = FragmentationModel(profile).amount("H100", 8000, (1000, 400, 0))
    idle = 1400
    assert frag == pytest.approx(0.25 * idle + 0.25 * 400 + 0.25 * idle + 0.25 * idle)


def test_profile_keeps_the_most_popular_shapes_up_to_the_coverage():
    counts = {(1000, 0, 0, ()): 50, (2000, 500, 1, ()): 30, (4000, 1000, 8, ()): 20}
    profile = WorkloadProfile.from_counts(counts)
    assert [(s.cpu_milli, s.weight) for s in profile.shapes] == [
        (1000, 0.5),
        (2000, 0.3),
        (4000, 0.2),
    ]
    typical = profile.typical(0.6)
    assert [(s.cpu_milli, round(s.weight, 3)) for s in typical.shapes] == [
        (1000, 0.625),
        (2000, 0.375),
    ]
    assert WorkloadProfile.from_counts(counts, coverage=0.6) == typical


def test_request_validation():
    with pytest.raises(ValueError):
        TaskRequest(gpus=1.5)
    with pytest.raises(ValueError):
        TaskRequest(gpus=1, num_nodes=0)
    with pytest.raises(ValueError):
        TaskRequest(gpus=2, gpu_memory_bytes=GIB)
    with pytest.raises(ValueError, match="known"):
        make_policy("nope")
    assert TaskRequest(gpus=0.5).shared and not TaskRequest(gpus=1).shared
    assert TaskRequest(gpus=1, gpu_memory_bytes=GIB).gpu_milli == 1


def test_default_policy_is_ours_and_every_name_is_registered():
    assert DEFAULT_POLICY == "fragbal"
    assert set(POLICIES) == {"random", "bestfit", "packing", "dotprod", "fgd", "fragbal"}
    assert PlacementEngine(make_cluster(make_node())).policy.name == DEFAULT_POLICY


def test_scheduler_imports_only_the_standard_library_and_itself():
    allowed = set(sys.stdlib_module_names) | {"fleetd"}
    for path in SCHEDULER_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
                if name.startswith("fleetd"):
                    assert name.startswith("fleetd.scheduler"), f"{path.name} imports {name}"
