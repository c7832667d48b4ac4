"""Aligned GPU sets inside a node: the engine reads NodeSnapshot.links (issue 50)."""

import pytest

from fleetd.scheduler import PlacementEngine, TaskRequest
from fleetd.scheduler.topology import Topology
from tests.fleetd.scheduler.factories import (
    A100_NVLINK_PAIRS_X4,
    CONSUMER_X2,
    H100_NVSWITCH_X8,
    L40S_PCIE_X8,
    make_cluster,
    make_node,
)


def _indices(rank):
    return sorted(int(g.uuid.rsplit("-", 1)[1]) for g in rank.gpus)


def _engine(*nodes, policy=None):
    return PlacementEngine(make_cluster(*nodes), policy=policy)


def _place(engine, gpus, **kw):
    result = engine.place(TaskRequest(gpus=gpus, **kw))
    assert result.schedulable, getattr(result, "reason", "")
    return result.ranks[0]


def test_two_gpu_job_on_nvlink_pairs_box_gets_a_pair_and_the_next_the_other_pair():
    engine = _engine(make_node("a100", gpus=4, model="A100", links=A100_NVLINK_PAIRS_X4))
    first = _place(engine, 2)
    second = _place(engine, 2)
    assert (_indices(first), first.link_class) == ([0, 1], "nvlink")
    assert (_indices(second), second.link_class) == ([2, 3], "nvlink")
    assert "aligned" in first.link_note


def test_two_gpu_job_on_nvlink_pairs_box_avoids_the_pair_a_one_gpu_job_broke():
    engine = _engine(make_node("a100", gpus=4, model="A100", links=A100_NVLINK_PAIRS_X4))
    single = _place(engine, 1)
    pair = _place(engine, 2)
    assert single.link_class == "self"
    assert _indices(pair) == [2, 3] and pair.link_class == "nvlink"
    assert not set(_indices(single)) & set(_indices(pair))


def test_l40s_two_gpu_job_takes_a_pcie_switch_pair_and_four_take_one_socket():
    engine = _engine(make_node("l40s", gpus=8, model="L40S", links=L40S_PCIE_X8))
    pair = _place(engine, 2)
    four = _place(engine, 4)
    assert pair.link_class == "pcie_switch" and _indices(pair) in ([0, 1], [2, 3], [4, 5], [6, 7])
    assert four.link_class == "numa"
    assert _indices(four) in ([0, 1, 2, 3], [4, 5, 6, 7])
    assert not set(_indices(pair)) & set(_indices(four))


def test_l40s_one_gpu_jobs_keep_pcie_pairs_whole():
    engine = _engine(make_node("l40s", gpus=8, model="L40S", links=L40S_PCIE_X8))
    first = _place(engine, 1)
    second = _place(engine, 1)  # the other half of the pair the first one broke
    pairs = [_place(engine, 2) for _ in range(3)]
    assert _indices(first)[0] // 2 == _indices(second)[0] // 2
    assert all(p.link_class == "pcie_switch" for p in pairs)


def test_one_gpu_job_then_two_gpu_job_still_finds_an_aligned_pair_on_every_shape():
    for links, count in ((A100_NVLINK_PAIRS_X4, 4), (L40S_PCIE_X8, 8), (H100_NVSWITCH_X8, 8)):
        engine = _engine(make_node("n", gpus=count, links=links))
        _place(engine, 1)
        pair = _place(engine, 2)
        best = Topology(links).best_full[2]
        assert Topology(links).weakest(sum(1 << i for i in _indices(pair))) == best


def test_h100_nvswitch_box_gives_any_set_and_calls_it_nvswitch():
    engine = _engine(make_node("h100", gpus=8, links=H100_NVSWITCH_X8))
    assert _place(engine, 8).link_class == "nvswitch"


def test_consumer_box_two_gpus_are_aligned_at_system():
    engine = _engine(make_node("pc", gpus=2, model="RTX4090", links=CONSUMER_X2))
    rank = _place(engine, 2, topology="required")
    assert rank.link_class == "system"


def _a100_with_one_gpu_of_each_pair_held():
    held = {"exclusive": True}
    return make_node(
        "a100",
        gpus=4,
        model="A100",
        links=A100_NVLINK_PAIRS_X4,
        gpu_overrides={0: held, 2: held},
    )


def test_required_waits_with_a_topology_reason_when_only_unaligned_gpus_are_free():
    engine = _engine(_a100_with_one_gpu_of_each_pair_held())
    result = engine.place(TaskRequest(gpus=2, topology="required"), explain=True)
    assert not result.schedulable
    (detail,) = result.filter_detail
    assert detail.stage == "topology"
    assert "nvlink" in detail.reason and "required" in detail.reason
    assert "topology: 1 node(s)" in result.reason and "nvlink" in result.reason


def test_preferred_takes_unaligned_gpus_and_says_so():
    engine = _engine(_a100_with_one_gpu_of_each_pair_held())
    rank = _place(engine, 2)
    assert _indices(rank) == [1, 3] and rank.link_class == "system"
    assert "no such set is free" in rank.link_note


def test_preferred_goes_to_the_node_with_an_aligned_set_free_even_against_packing():
    engine = _engine(_a100_with_one_gpu_of_each_pair_held(), make_node("b", gpus=8))
    # Packing alone would fill the half-used A100 box; its free GPUs are on no common NVLink.
    rank = _place(engine, 2, gpu_types=())
    assert rank.node_id == "b"


def test_required_goes_to_a_node_with_an_aligned_set():
    engine = _engine(
        _a100_with_one_gpu_of_each_pair_held(),
        make_node("b", gpus=4, model="A100", links=A100_NVLINK_PAIRS_X4),
    )
    rank = _place(engine, 2, topology="required")
    assert rank.node_id == "b" and rank.link_class == "nvlink"


def test_required_takes_a_node_whose_links_are_unknown_as_before():
    engine = _engine(make_node("old", gpus=4, model="A100"))
    rank = _place(engine, 2, topology="required")
    assert rank.link_class is None and rank.link_note == ""


def test_nodes_with_the_same_free_shares_but_different_free_positions_are_not_interchangeable():
    broken = _a100_with_one_gpu_of_each_pair_held()
    intact = make_node(
        "intact",
        gpus=4,
        model="A100",
        links=A100_NVLINK_PAIRS_X4,
        gpu_overrides={0: {"exclusive": True}, 1: {"exclusive": True}},
    )
    engine = _engine(broken, intact)
    assert engine.by_id["a100"].key != engine.by_id["intact"].key
    assert _place(engine, 2).node_id == "intact"


def test_unknown_links_keep_the_numa_grouping_and_no_link_class():
    engine = _engine(make_node("old", gpus=8))
    rank = _place(engine, 4)
    assert _indices(rank) == [0, 1, 2, 3] and rank.link_class is None


def test_a_links_matrix_of_the_wrong_size_is_taken_as_unknown():
    engine = _engine(make_node("odd", gpus=8, links=A100_NVLINK_PAIRS_X4))
    assert engine.by_id["odd"].topo is None


def test_topology_mode_must_be_known():
    with pytest.raises(ValueError, match="topology"):
        TaskRequest(gpus=2, topology="strict")


def test_pick_memoises_per_free_mask_and_count():
    topo = Topology(L40S_PCIE_X8)
    first = topo.pick(topo.full, 4)
    assert topo.pick(topo.full, 4) == first and (topo.full, 4) in topo._pick


def test_large_node_uses_the_greedy_pick():
    links = tuple(
        tuple("self" if i == j else "nvlink" if i // 2 == j // 2 else "system" for j in range(16))
        for i in range(16)
    )
    engine = _engine(make_node("big", gpus=16, links=links))
    rank = _place(engine, 2)
    assert rank.link_class == "nvlink"
