"""The dynamic MIG planner (fleetd/scheduler/mig.py): idle GPUs only, layouts the profile tables
allow, hysteresis and a settle time, and a bound on changes per plan."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetd.scheduler.mig import (
    MigGpu,
    Placed,
    SliceProfile,
    SliceState,
    layout_valid,
    pack,
    plan_layouts,
    repartitionable,
    table,
)
from fleetwire.mig import FAMILIES, layout_fits, profiles_of


def profiles(model):
    """A model's table as the planner takes it (fleetwire.mig's, as the service passes it)."""
    return tuple(
        SliceProfile(p.name, p.compute, p.size, p.starts) for p in profiles_of(model).values()
    )


A100 = profiles("NVIDIA A100-SXM4-80GB")
A100_40 = profiles("NVIDIA A100-SXM4-40GB")
H100 = profiles("NVIDIA H100 80GB HBM3")
NOW = 10_000.0
SETTLE = 300.0


def sevens(uuid, busy=(), model=A100, **kw):
    """A GPU with 7 x 1g.10gb, those at the indexes `busy` held by tasks."""
    return MigGpu(
        uuid,
        model,
        slices=tuple(SliceState("1g.10gb", i, 1, busy=i in busy) for i in range(7)),
        **kw,
    )


def layout_of(*pairs):
    return tuple(Placed(p, s, FAMILIES["A100-80GB"][p].size) for p, s in pairs)


def test_an_idle_gpu_is_repartitioned_to_the_profile_the_queue_wants():
    targets = plan_layouts([sevens("g0")], {"3g.40gb": 2}, NOW, SETTLE)
    assert targets == {"g0": layout_of(("3g.40gb", 0), ("3g.40gb", 4))}


def test_a_gpu_with_one_busy_slice_is_never_touched():
    assert plan_layouts([sevens("g0", busy=(3,))], {"3g.40gb": 1}, NOW, SETTLE) == {}


def test_free_slices_elsewhere_meet_the_demand_first():
    gpus = [sevens("busy", busy=(0,)), MigGpu("empty", A100)]
    assert plan_layouts(gpus, {"1g.10gb": 6}, NOW, SETTLE) == {}
    targets = plan_layouts(gpus, {"1g.10gb": 7}, NOW, SETTLE)
    assert list(targets) == ["empty"] and Counter(p.profile for p in targets["empty"]) == {
        "1g.10gb": 7
    }


def test_a_gpu_whose_layout_already_serves_the_demand_is_kept():
    gpus = [sevens("g0"), sevens("g1")]
    assert plan_layouts(gpus, {"1g.10gb": 9}, NOW, SETTLE) == {}
    # one GPU changes to serve both profiles; the other keeps its seven 1g
    targets = plan_layouts(gpus, {"1g.10gb": 3, "4g.40gb": 1}, NOW, SETTLE)
    assert targets == {"g0": layout_of(("4g.40gb", 0), *(("1g.10gb", s) for s in (4, 5, 6)))}


def test_no_demand_changes_nothing():
    assert plan_layouts([MigGpu("g0", A100), sevens("g1")], {}, NOW, SETTLE) == {}


def test_a_gpu_changed_within_the_settle_time_waits():
    gpu = sevens("g0", changed_at=NOW - SETTLE + 1)
    assert plan_layouts([gpu], {"7g.80gb": 1}, NOW, SETTLE) == {}
    later = plan_layouts([gpu], {"7g.80gb": 1}, NOW + 1, SETTLE)
    assert later == {"g0": (Placed("7g.80gb", 0, 8),)}


def test_a_gpu_settles_for_its_own_fleets_time():
    gpu = sevens("g0", changed_at=NOW - 10, settle_seconds=5)
    assert list(plan_layouts([gpu], {"7g.80gb": 1}, NOW, SETTLE)) == ["g0"]


def test_blocked_pending_fixed_and_unknown_slices_are_left_alone():
    unknown = MigGpu("u", A100, slices=(SliceState(None),))
    fixed = sevens("f", fixed=True)
    for gpu in (sevens("b", blocked=True), sevens("p", pending=True), fixed, unknown):
        assert not repartitionable(gpu, NOW, SETTLE)
        assert plan_layouts([gpu], {"7g.80gb": 1}, NOW, SETTLE) == {}


def test_free_slices_of_a_fixed_gpu_count_against_the_demand():
    gpus = [sevens("f", fixed=True), MigGpu("empty", A100)]
    assert plan_layouts(gpus, {"1g.10gb": 7}, NOW, SETTLE) == {}
    assert list(plan_layouts(gpus, {"1g.10gb": 8}, NOW, SETTLE)) == ["empty"]


def test_a_gpu_without_mig_profiles_gets_nothing():
    gpu = MigGpu("l4", ())
    assert plan_layouts([gpu], {"1g.10gb": 1}, NOW, SETTLE) == {}


def test_at_most_max_changes_gpus_change_in_one_plan():
    gpus = [MigGpu(f"g{i}", A100) for i in range(5)]
    assert len(plan_layouts(gpus, {"7g.80gb": 5}, NOW, SETTLE, max_changes=2)) == 2


def test_a_family_gets_only_its_own_profiles():
    targets = plan_layouts([MigGpu("a40", A100_40), MigGpu("h", H100)], {"1g.5gb": 2}, NOW, SETTLE)
    assert list(targets) == ["a40"]


def test_pack_fills_the_room_left_with_the_smallest_wanted_profile():
    table_ = {p.name: p for p in A100}
    layout = pack(table_, {"3g.40gb": 1, "1g.10gb": 1})
    assert [p.profile for p in layout] == ["3g.40gb"] + ["1g.10gb"] * 3
    assert layout_valid(table_, layout)


def test_layout_valid_refuses_overlaps_and_wrong_starts():
    table_ = {p.name: p for p in A100}
    assert not layout_valid(table_, layout_of(("3g.40gb", 0), ("1g.10gb", 2)))
    assert not layout_valid(table_, (Placed("3g.40gb", 2, 4),))
    assert not layout_valid(table_, (Placed("1g.5gb", 0, 1),))  # an A100 40GB profile


def test_the_planners_layouts_fit_fleetwires_own_check():
    """The planner's placement and fleetwire.mig's (which the API and the agent use) agree."""
    for profile in A100:
        layout = pack({p.name: p for p in A100}, {profile.name: 7})
        assert layout_fits("NVIDIA A100-SXM4-80GB", [p.profile for p in layout])


# Properties: any fleet of A100 / H100 GPUs in any state, any demand.
PROFILES = sorted(FAMILIES["A100-80GB"])
MODELS = {A100: "NVIDIA A100-SXM4-80GB", H100: "NVIDIA H100 80GB HBM3"}


@st.composite
def gpus_and_demand(draw):
    gpus = []
    for i in range(draw(st.integers(0, 6))):
        model = draw(st.sampled_from([A100, H100]))
        names = draw(st.lists(st.sampled_from(PROFILES), max_size=7))
        layout = pack({p.name: p for p in model}, Counter(names))
        slices = tuple(
            SliceState(p.profile, p.start, p.size, busy=draw(st.booleans())) for p in layout
        )
        gpus.append(
            MigGpu(
                f"g{i}",
                model,
                slices=slices,
                blocked=draw(st.booleans()),
                pending=draw(st.booleans()),
                changed_at=draw(st.one_of(st.none(), st.floats(NOW - 2 * SETTLE, NOW))),
            )
        )
    demand = draw(st.dictionaries(st.sampled_from(PROFILES), st.integers(0, 20), max_size=6))
    return gpus, demand


@settings(max_examples=300, deadline=None)
@given(gpus_and_demand(), st.one_of(st.none(), st.integers(0, 4)))
def test_every_target_fits_the_table_and_touches_no_busy_gpu(case, max_changes):
    gpus, demand = case
    targets = plan_layouts(gpus, demand, NOW, SETTLE, max_changes)
    by_id = {g.uuid: g for g in gpus}
    for uuid, layout in targets.items():
        gpu = by_id[uuid]
        assert layout and layout_valid(table(gpu), layout)
        assert layout_fits(MODELS[gpu.profiles], [p.profile for p in layout])
        assert not any(s.busy for s in gpu.slices)
        assert not gpu.blocked and not gpu.pending
        assert gpu.changed_at is None or NOW - gpu.changed_at >= SETTLE
    if max_changes is not None:
        assert len(targets) <= max_changes


@settings(max_examples=300, deadline=None)
@given(gpus_and_demand())
def test_planning_again_after_a_plan_is_applied_changes_nothing(case):
    gpus, demand = case
    gpus = [MigGpu(g.uuid, g.profiles, slices=g.slices, blocked=g.blocked) for g in gpus]
    targets = plan_layouts(gpus, demand, NOW, 0)
    applied = [
        MigGpu(
            g.uuid,
            g.profiles,
            slices=tuple(SliceState(p.profile, p.start, p.size) for p in targets[g.uuid]),
            blocked=g.blocked,
        )
        if g.uuid in targets
        else g
        for g in gpus
    ]
    assert plan_layouts(applied, demand, NOW, 0) == {}  # no flapping, even with no settle time
    assert plan_layouts(applied, {}, NOW, 0) == {}
