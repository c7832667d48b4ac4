"""MIG devices in the placement engine (issue 50): a MIG profile request takes free MIG devices of
that profile, a GPU in MIG mode takes nothing else, and nodes with different MIG devices free are
never one class."""

import pytest

from fleetd.scheduler import MigSlice, PlacementEngine, TaskRequest
from tests.fleetd.scheduler.factories import make_cluster, make_node


def slices(gpu, profile, count, held=()):
    """`count` MIG devices of `profile` on GPU `gpu`, those at the indexes `held` held."""
    return tuple(MigSlice(f"MIG-{gpu}-{i}", profile, free=i not in held) for i in range(count))


def mig_node(node_id="n0", layout=None, gpus=2, **overrides):
    """A node whose GPUs' MIG devices are `layout` {gpu index: (MigSlice...)}; the others whole."""
    layout = layout or {}
    return make_node(
        node_id,
        gpus=gpus,
        model="NVIDIA A100-SXM4-80GB",
        gpu_overrides={i: {"mig_devices": devices} for i, devices in layout.items()},
        **overrides,
    )


def test_a_mig_request_gets_free_devices_of_its_profile_without_limits():
    node = mig_node(layout={0: slices("a", "1g.10gb", 7, held=(0,))})
    engine = PlacementEngine(make_cluster(node))
    placement = engine.place(TaskRequest(gpus=2, mig="1g.10gb"))
    [rank] = placement.ranks
    assert [(g.uuid, g.mig_device) for g in rank.gpus] == [
        ("GPU-n0-0", "MIG-a-1"),
        ("GPU-n0-0", "MIG-a-2"),
    ]
    assert all(g.exclusive and g.memory_limit_bytes == 0 for g in rank.gpus)
    assert rank.link_class is None


def test_a_gpu_in_mig_mode_is_never_given_whole_or_as_a_software_slice():
    node = mig_node(layout={0: slices("a", "1g.10gb", 7), 1: ()})
    engine = PlacementEngine(make_cluster(node))
    assert not engine.place(TaskRequest(gpus=1)).schedulable
    assert not engine.place(TaskRequest(gpus=0.5)).schedulable
    [detail] = engine.explain(TaskRequest(gpus=1))
    assert detail.stage == "gpu_count"


def test_a_whole_gpu_request_takes_the_gpu_outside_mig_mode():
    node = mig_node(layout={0: slices("a", "1g.10gb", 7)})
    [rank] = PlacementEngine(make_cluster(node)).place(TaskRequest(gpus=1)).ranks
    assert [g.uuid for g in rank.gpus] == ["GPU-n0-1"] and rank.gpus[0].mig_device is None


def test_a_profile_no_node_has_free_waits_and_says_why():
    node = mig_node(layout={0: slices("a", "3g.40gb", 2, held=(0,))})
    engine = PlacementEngine(make_cluster(node))
    result = engine.place(TaskRequest(gpus=2, mig="3g.40gb"), explain=True)
    assert not result.schedulable
    assert "1 free MIG device(s) of profile 3g.40gb, job needs 2" in result.reason
    whole = make_node("w", gpus=2)
    [detail] = PlacementEngine(make_cluster(whole)).explain(TaskRequest(mig="1g.10gb", gpus=1))
    assert detail.stage == "mig" and "no GPU in MIG mode" in detail.reason


def test_devices_come_from_the_fullest_gpu_first_so_an_emptier_one_stays_free():
    node = mig_node(
        layout={0: slices("a", "1g.10gb", 7), 1: slices("b", "1g.10gb", 7, held=(0, 1, 2))}
    )
    [rank] = PlacementEngine(make_cluster(node)).place(TaskRequest(mig="1g.10gb")).ranks
    assert rank.gpus[0].mig_device == "MIG-b-3"


def test_nodes_with_different_mig_devices_free_are_not_one_class():
    one = mig_node("a", layout={0: slices("a", "1g.10gb", 7)})
    other = mig_node("b", layout={0: slices("b", "3g.40gb", 2)})
    engine = PlacementEngine(make_cluster(one, other))
    assert one.gpus[0].mig_devices != other.gpus[0].mig_devices
    [rank] = engine.place(TaskRequest(mig="3g.40gb")).ranks
    assert rank.node_id == "b"  # the first node's class would have said 1g.10gb only


def test_placements_reserve_devices_until_released():
    node = mig_node(layout={0: slices("a", "2g.20gb", 3)})
    engine = PlacementEngine(make_cluster(node))
    placed = [engine.place(TaskRequest(mig="2g.20gb")) for _ in range(4)]
    assert [p.schedulable for p in placed] == [True, True, True, False]
    devices = {p.ranks[0].gpus[0].mig_device for p in placed[:3]}
    assert devices == {"MIG-a-0", "MIG-a-1", "MIG-a-2"}
    after = engine.snapshot().nodes[0].gpus[0].mig_devices
    assert not any(d.free for d in after)
    engine.release(placed[1])
    again = engine.place(TaskRequest(mig="2g.20gb"))
    assert again.ranks[0].gpus[0].mig_device == placed[1].ranks[0].gpus[0].mig_device


def test_a_mig_request_without_a_count_takes_one_device():
    assert TaskRequest(mig="1g.10gb").gpus == 1


def test_a_gang_of_mig_ranks_takes_one_node_each():
    nodes = [mig_node(f"n{i}", layout={0: slices(f"g{i}", "1g.10gb", 2)}) for i in range(2)]
    placement = PlacementEngine(make_cluster(*nodes)).place(
        TaskRequest(mig="1g.10gb", gpus=2, num_nodes=2)
    )
    assert sorted(placement.node_ids) == ["n0", "n1"]


def test_an_unhealthy_gpu_gives_none_of_its_mig_devices():
    node = mig_node(layout={0: slices("a", "1g.10gb", 7)}, gpus=1)
    sick = make_node(
        "n0",
        gpus=1,
        model="NVIDIA A100-SXM4-80GB",
        gpu_overrides={0: {"mig_devices": slices("a", "1g.10gb", 7), "healthy": False}},
    )
    assert PlacementEngine(make_cluster(node)).place(TaskRequest(mig="1g.10gb")).schedulable
    assert not PlacementEngine(make_cluster(sick)).place(TaskRequest(mig="1g.10gb")).schedulable


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpus": 0.5},
        {"gpus": 1, "gpu_memory_bytes": 1024**3},
        {"gpus": 1, "gpu_compute_percent": 50},
    ],
)
def test_mig_excludes_fractions_memory_and_compute_shares(kwargs):
    with pytest.raises(ValueError, match="mig takes whole MIG devices"):
        TaskRequest(mig="1g.10gb", **kwargs)
