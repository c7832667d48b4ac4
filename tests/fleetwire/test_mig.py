"""MIG profile tables (fleetwire.mig): each family's profiles and placements as NVIDIA's MIG user
guide lists them, and where a profile goes beside the slices in use."""

import pytest

from fleetwire.heartbeat import Heartbeat, HeartbeatReply
from fleetwire.mig import (
    FAMILIES,
    PROFILE_NAME,
    PROFILE_NAMES,
    MigEvent,
    MigInstance,
    MigLayout,
    family_of,
    layout_fits,
    place,
    profile_of,
    profiles_of,
    valid_placement,
)

A100_40 = "NVIDIA A100-SXM4-40GB"
A100_80 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
GB = 1024**3


@pytest.mark.parametrize(
    ("name", "memory", "family"),
    [
        (A100_40, None, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", None, "A100-40GB"),
        (A100_80, None, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", None, "A100-80GB"),
        (H100, None, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81559 * 1024**2, "H100-80GB"),
        ("NVIDIA H100 NVL", 95830 * 1024**2, "H100-94GB"),
        ("NVIDIA H200", 143771 * 1024**2, "H200-141GB"),
        ("NVIDIA L40S", 48 * GB, None),
        ("NVIDIA GeForce RTX 4090", 24 * GB, None),
        ("NVIDIA H100 PCIe", None, None),  # no memory to tell 80 from 94 GB
    ],
)
def test_a_gpu_model_maps_to_its_mig_family_or_to_none(name, memory, family):
    assert family_of(name, memory) == family


def test_an_unknown_model_offers_no_profile_and_no_placement():
    assert profiles_of("NVIDIA L4", 24 * GB) == {}
    assert profile_of("NVIDIA L4", "1g.10gb", 24 * GB) is None


@pytest.mark.parametrize(
    ("family", "names"),
    [
        ("A100-40GB", ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        ("A100-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("H100-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("H100-94GB", ["1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"]),
        ("H200-141GB", ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    ],
)
def test_each_family_has_the_profiles_nvidia_lists(family, names):
    assert sorted(FAMILIES[family]) == sorted(names)
    assert all(PROFILE_NAME.match(name) for name in names)
    assert set(names) <= PROFILE_NAMES


def test_the_a100_40gb_placements_match_the_mig_user_guide():
    table = FAMILIES["A100-40GB"]
    got = {name: (p.compute, p.size, p.starts) for name, p in table.items()}
    assert got == {
        "1g.5gb": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
        "1g.10gb": (1, 2, (0, 2, 4, 6)),
        "2g.10gb": (2, 2, (0, 2, 4)),
        "3g.20gb": (3, 4, (0, 4)),
        "4g.20gb": (4, 4, (0,)),
        "7g.40gb": (7, 8, (0,)),
    }
    assert table["3g.20gb"].memory_gb == 20
    assert table["3g.20gb"].placements == ((0, 4), (4, 4))


def test_every_placement_stays_inside_the_eight_memory_slots():
    for table in FAMILIES.values():
        for profile in table.values():
            assert all(0 <= start and start + size <= 8 for start, size in profile.placements)


def test_a_profile_goes_to_the_lowest_valid_start_that_is_free():
    one = profile_of(H100, "1g.10gb")
    three = profile_of(H100, "3g.40gb")
    assert place(one, []) == 0
    assert place(one, [(0, 1), (1, 1)]) == 2
    assert place(three, [(0, 1)]) == 4  # 3g only starts at 0 or 4
    assert place(three, [(0, 1), (5, 1)]) is None


def test_a_two_slot_profile_skips_odd_starts():
    two = profile_of(A100_40, "2g.10gb")
    assert place(two, [(0, 1)]) == 2
    assert place(two, [(0, 2), (3, 1)]) == 4
    assert place(two, [(0, 2), (2, 2), (4, 2)]) is None  # 2g may not start at 6


def test_a_full_gpu_takes_nothing_more():
    assert place(profile_of(A100_80, "1g.10gb"), [(0, 8)]) is None
    assert place(profile_of(A100_80, "7g.80gb"), [(6, 1)]) is None


def test_spent_compute_slices_refuse_a_profile_whose_memory_would_fit():
    one = profile_of(A100_80, "1g.10gb")
    assert place(one, [(0, 4)], compute_in_use=7) is None
    assert place(one, [(0, 4)], compute_in_use=3) == 4


def test_a_placement_is_valid_only_at_a_listed_start_and_size():
    three = profile_of(A100_40, "3g.20gb")
    assert valid_placement(three, 4, 4)
    assert not valid_placement(three, 2, 4)
    assert not valid_placement(three, 0, 2)


@pytest.mark.parametrize(
    ("profiles", "fits"),
    [
        (["1g.10gb"] * 7, True),
        (["1g.10gb"] * 8, False),
        (["3g.40gb", "3g.40gb"], True),
        (["4g.40gb", "3g.40gb"], True),
        (["4g.40gb", "4g.40gb"], False),
        (["2g.20gb"] * 3 + ["1g.10gb"], True),
        (["7g.80gb", "1g.10gb"], False),
        (["1g.5gb"], False),  # an A100 40GB profile, not an H100's
    ],
)
def test_a_layout_fits_one_gpu_only_when_nvidia_allows_it(profiles, fits):
    assert layout_fits(H100, profiles) is fits


# Dynamic MIG on the wire: target layouts and their results.


def test_a_target_layout_and_a_result_read_back_from_their_json():
    layout = MigLayout(
        "GPU-1",
        "0190aa55bbcc01234567",
        (MigInstance("3g.40gb", 0, 4), MigInstance("3g.40gb", 4, 4)),
    )
    assert MigLayout.from_wire(layout.to_wire()) == layout
    event = MigEvent("GPU-1", layout.plan, False, "NVML said no", busy=False)
    assert MigEvent.from_wire(event.to_wire()) == event
    reply = HeartbeatReply("ready", 10, mig_layouts=(layout,))
    assert HeartbeatReply.from_wire(reply.to_wire()).mig_layouts == (layout,)
    beat = Heartbeat(mig_events=(event,))
    assert Heartbeat.from_wire(beat.to_wire()).mig_events == (event,)
    assert "mig_layouts" not in HeartbeatReply("ready", 10).to_wire()  # older agents see nothing


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"gpu_uuid": "G", "plan": "p", "instances": []}, "1 to 7 instances"),
        ({"gpu_uuid": "G", "plan": "p q", "instances": [{}]}, "plan id"),
        (
            {
                "gpu_uuid": "G",
                "plan": "p",
                "instances": [
                    {"profile": "3g.40gb", "start": 0, "size": 4},
                    {"profile": "1g.10gb", "start": 3, "size": 1},
                ],
            },
            "share a memory slot",
        ),
        (
            {
                "gpu_uuid": "G",
                "plan": "p",
                "instances": [{"profile": "7g.80gb", "start": 1, "size": 8}],
            },
            "within the 8 memory slots",
        ),
        (
            {
                "gpu_uuid": "G",
                "plan": "p",
                "instances": [{"profile": "big", "start": 0, "size": 1}],
            },
            "profile name",
        ),
    ],
)
def test_a_target_layout_that_cannot_be_is_refused_naming_why(data, says):
    with pytest.raises(ValueError, match=says):
        MigLayout.from_wire(data)


def test_a_result_must_say_ok_as_a_boolean():
    with pytest.raises(ValueError, match="true or false"):
        MigEvent.from_wire({"gpu_uuid": "G", "plan": "p", "ok": "yes"})
