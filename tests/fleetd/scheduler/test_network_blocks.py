"""Gangs across network blocks (issue 50): the fewest blocks, then leaves; same_block required
waits with a reason; nodes without a place; and gangs on a fleet with no places go as before."""

import pytest

from fleetd.scheduler import (
    STAGES,
    NetworkPlace,
    PlacementEngine,
    TaskRequest,
    Unschedulable,
)
from fleetd.scheduler.model import STAGE_NETWORK
from fleetd.scheduler.network import choose_nodes, network_key
from tests.fleetd.scheduler.factories import make_cluster, make_gpu, make_node


def _node(node_id, block=None, leaf=None, spine=None, free=8):
    """An 8-GPU node with `free` idle GPUs, in this place (None: no place known)."""
    place = None if block is leaf is spine is None else NetworkPlace(block, leaf, spine)
    busy = {i: {"exclusive": True} for i in range(free, 8)}
    return make_node(node_id, gpu_overrides=busy, network=place)


def _fleet(fills, leaf_size=5):
    """Blocks b0, b1, ... where `fills[b]` nodes of block b are free (the rest full), leaves of
    `leaf_size` nodes, all blocks under spine s0 (block b's nodes are b<b>-n<i>)."""
    nodes = []
    for b, (size, free) in enumerate(fills):
        for i in range(size):
            nodes.append(
                _node(
                    f"b{b}-n{i:02d}",
                    f"b{b}",
                    f"b{b}-l{i // leaf_size}",
                    "s0",
                    free=8 if i < free else 0,
                )
            )
    return make_cluster(*nodes)


def _blocks(placement):
    return {r.block for r in placement.ranks}


def _leaves(placement):
    return {r.leaf for r in placement.ranks}


@pytest.mark.parametrize("k", [2, 4, 16])
def test_a_gang_lands_in_one_block_when_one_holds_it_even_if_others_score_first(k):
    # b0 and b1 have a few free nodes each (first in the order); b2 is the one block with room
    engine = PlacementEngine(_fleet([(20, 3), (20, 3), (20, 17)]))
    placed = engine.place(TaskRequest(gpus=8, num_nodes=k))
    assert placed.schedulable
    assert len(placed.ranks) == k and len(set(placed.node_ids)) == k
    if k <= 3:
        assert len(_blocks(placed)) == 1
    else:
        assert _blocks(placed) == {"b2"}
    assert all("block" in r.network_note for r in placed.ranks)


def test_the_fewest_leaves_win_within_the_blocks_that_hold_the_gang():
    # b0: 12 free nodes over three leaves (5, 5, 2); b1: 10 free nodes over two full leaves
    engine = PlacementEngine(_fleet([(15, 12), (10, 10)]))
    placed = engine.place(TaskRequest(gpus=8, num_nodes=10))
    assert _blocks(placed) == {"b1"} and len(_leaves(placed)) == 2


def test_a_small_gang_takes_the_fullest_block_that_holds_it_and_one_leaf():
    engine = PlacementEngine(_fleet([(20, 20), (20, 5), (20, 20)]))
    placed = engine.place(TaskRequest(gpus=8, num_nodes=4))
    assert _blocks(placed) == {"b1"} and _leaves(placed) == {"b1-l0"}


def test_a_gang_no_block_holds_takes_the_fewest_blocks_when_preferred():
    engine = PlacementEngine(_fleet([(20, 4), (20, 9), (20, 10), (20, 3)]))
    placed = engine.place(TaskRequest(gpus=8, num_nodes=16))
    assert placed.schedulable
    assert _blocks(placed) == {"b1", "b2"}
    assert "no block holds all 16" in placed.ranks[0].network_note


def test_a_gang_that_requires_one_block_waits_and_says_which_block_came_closest():
    engine = PlacementEngine(_fleet([(20, 4), (20, 9), (20, 10), (20, 3)]))
    result = engine.place(TaskRequest(gpus=8, num_nodes=16, same_block="required"), explain=True)
    assert isinstance(result, Unschedulable)
    assert "same_block required" in result.reason and "10 (b2)" in result.reason
    network = [d for d in result.filter_detail if d.stage == STAGE_NETWORK]
    assert len(network) == 26 and STAGE_NETWORK in STAGES
    assert any("block b2 has 10" in d.reason for d in network)
    assert engine.place(TaskRequest(gpus=8, num_nodes=10, same_block="required")).schedulable


def test_nodes_without_a_place_count_as_blocks_of_their_own():
    nodes = [_node(f"x{i}") for i in range(6)] + [
        _node(f"b0-n{i}", "b0", "b0-l0") for i in range(4)
    ]
    engine = PlacementEngine(make_cluster(*nodes))
    placed = engine.place(TaskRequest(gpus=8, num_nodes=4))
    assert _blocks(placed) == {"b0"}
    spread = engine.place(TaskRequest(gpus=8, num_nodes=3))  # b0 is full now
    assert spread.schedulable and _blocks(spread) == {None}
    waiting = engine.place(TaskRequest(gpus=8, num_nodes=2, same_block="required"))
    assert isinstance(waiting, Unschedulable) and "no node that fits" in waiting.reason


def test_a_block_without_leaves_and_a_leaf_without_a_block_each_count_as_one_block():
    nodes = [_node(f"a{i}", block="blk") for i in range(3)]
    nodes += [_node(f"l{i}", leaf="leafy") for i in range(3)]
    engine = PlacementEngine(make_cluster(*nodes))
    first = engine.place(TaskRequest(gpus=8, num_nodes=3, same_block="required"))
    second = engine.place(TaskRequest(gpus=8, num_nodes=3, same_block="required"))
    assert {frozenset(first.node_ids), frozenset(second.node_ids)} == {
        frozenset({"a0", "a1", "a2"}),
        frozenset({"l0", "l1", "l2"}),
    }


def test_the_fewest_spines_win_among_equally_few_blocks():
    nodes = [_node(f"p{i}", "p", "p-l", "s1") for i in range(3)]
    nodes += [_node(f"q{i}", "q", "q-l", "s2") for i in range(3)]
    nodes += [_node(f"r{i}", "r", "r-l", "s2") for i in range(3)]
    placed = PlacementEngine(make_cluster(*nodes)).place(TaskRequest(gpus=8, num_nodes=5))
    assert _blocks(placed) == {"q", "r"}


def test_gangs_on_a_fleet_without_places_go_rank_by_rank_as_before():
    nodes = [make_node(f"n{i}", gpus=8) for i in range(6)]
    with_place = [make_node(f"n{i}", gpus=8, network=NetworkPlace(f"b{i}")) for i in range(6)]
    before = PlacementEngine(make_cluster(*nodes)).place(TaskRequest(gpus=4, num_nodes=4))
    after = PlacementEngine(make_cluster(*with_place)).place(TaskRequest(gpus=4, num_nodes=4))
    assert before.node_ids == after.node_ids
    assert [r.gpus for r in before.ranks] == [r.gpus for r in after.ranks]


def test_a_gang_reserves_what_it_takes_and_a_release_gives_it_back():
    engine = PlacementEngine(_fleet([(10, 10)]))
    placed = engine.place(TaskRequest(gpus=8, num_nodes=10))
    assert not engine.place(TaskRequest(gpus=1, num_nodes=2)).schedulable
    engine.release(placed)
    again = engine.place(TaskRequest(gpus=8, num_nodes=10, same_block="required"))
    assert again.schedulable and _blocks(again) == {"b0"}


def test_simulate_reserves_nothing_for_a_gang():
    engine = PlacementEngine(_fleet([(4, 4)]))
    assert engine.simulate(TaskRequest(gpus=8, num_nodes=4)).schedulable
    assert engine.place(TaskRequest(gpus=8, num_nodes=4)).schedulable


def test_too_few_nodes_for_a_gang_keeps_the_gang_reason():
    engine = PlacementEngine(_fleet([(5, 3)]))
    result = engine.place(TaskRequest(gpus=8, num_nodes=4))
    assert isinstance(result, Unschedulable) and "only 3 of 4" in result.reason


def test_choose_nodes_takes_the_smallest_leaf_that_holds_the_rest():
    places = [NetworkPlace("b", "big")] * 5 + [NetworkPlace("b", "small")] * 2
    nets = [network_key(p, f"n{i}") for i, p in enumerate(places)]
    pick = choose_nodes(nets, 2, required=True)
    assert {nets[i][1] for i in pick.picks} == {"small"}
    pick = choose_nodes(nets, 6, required=True)
    assert len(pick.picks) == 6 and sum(nets[i][1] == "big" for i in pick.picks) == 5


def test_mixed_gpu_fill_inside_blocks_still_needs_whole_free_nodes():
    # b0 nodes each have 4 free GPUs, b1 nodes 8: a gang of 8-GPU ranks fits only b1
    nodes = [_node(f"b0-{i}", "b0", "b0-l", free=4) for i in range(6)]
    nodes += [_node(f"b1-{i}", "b1", "b1-l", free=8) for i in range(4)]
    engine = PlacementEngine(make_cluster(*nodes))
    four = engine.place(TaskRequest(gpus=4, num_nodes=6, same_block="required"))
    assert _blocks(four) == {"b0"}
    eight = engine.place(TaskRequest(gpus=8, num_nodes=4, same_block="required"))
    assert _blocks(eight) == {"b1"}
    assert make_gpu().idle
