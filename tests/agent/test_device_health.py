"""assess_health and fatal_health pinned together: the same inputs, both outputs.

fatal_health names a subset of assess_health's reasons (those that stop running tasks), in the
same order and words; these cases hold both to what they return today.
"""

import pytest

from agent.devices import HEALTH_REASON_MAX, assess_health, fatal_health

ECC = "uncorrectable ECC error(s) since driver load"
RETIRED = "retired pages pending: GPU reset required"
REMAP_FAILED = "row remapping failed"
REMAP_PENDING = "remapped rows pending: GPU reset required"
EVERY_PROBLEM = {
    "ecc_uncorrected_volatile": 3,
    "retired_pages_pending": True,
    "remapped_rows_failure": True,
    "remapped_rows_pending": True,
    "slowdown_temperature_c": 85,
}
MANY_XIDS = list(range(1000, 1200))
MANY_XIDS_REASON = ("critical XID " + ", ".join(str(x) for x in MANY_XIDS))[:HEALTH_REASON_MAX]


@pytest.mark.parametrize(
    "health, temperature, xids, assessed, fatal",
    [
        ({}, None, [], (True, ""), ""),
        ({}, 40, [13, 31, 43, 45, 68, 109], (True, ""), ""),  # the application's own XIDs
        (
            {
                "ecc_uncorrected_volatile": 0,
                "retired_pages_pending": False,
                "remapped_rows_failure": None,
                "remapped_rows_pending": None,
                "slowdown_temperature_c": None,
            },
            95,
            [],
            (True, ""),
            "",
        ),
        ({"ecc_uncorrected_volatile": 2}, 40, [], (False, f"2 {ECC}"), f"2 {ECC}"),
        ({"retired_pages_pending": True}, 40, [], (False, RETIRED), ""),
        ({"remapped_rows_failure": True}, 40, [], (False, REMAP_FAILED), REMAP_FAILED),
        ({"remapped_rows_pending": True}, 40, [], (False, REMAP_PENDING), ""),
        ({"slowdown_temperature_c": 87}, 86, [], (True, ""), ""),
        (
            {"slowdown_temperature_c": 87},
            87,
            [],
            (False, "temperature 87 C at or above the slowdown threshold 87 C"),
            "",
        ),
        (
            {"slowdown_temperature_c": 87},
            90,
            [],
            (False, "temperature 90 C at or above the slowdown threshold 87 C"),
            "",
        ),
        ({"slowdown_temperature_c": 87}, None, [], (True, ""), ""),
        ({"slowdown_temperature_c": 0}, 90, [], (True, ""), ""),  # no threshold known
        ({}, 40, [79], (False, "critical XID 79"), "critical XID 79"),
        ({}, 40, [48, 13, 79, 48], (False, "critical XID 48, 79"), "critical XID 48, 79"),
        (
            {"remapped_rows_pending": True, "slowdown_temperature_c": 80},
            81,
            [43],
            (False, f"{REMAP_PENDING}; temperature 81 C at or above the slowdown threshold 80 C"),
            "",
        ),
        (
            {"ecc_uncorrected_volatile": 1, "remapped_rows_pending": True},
            30,
            [79],
            (False, f"critical XID 79; 1 {ECC}; {REMAP_PENDING}"),
            f"critical XID 79; 1 {ECC}",
        ),
        (
            EVERY_PROBLEM,
            90,
            [94, 13, 48],
            (
                False,
                f"critical XID 48, 94; 3 {ECC}; {RETIRED}; {REMAP_FAILED}; {REMAP_PENDING}; "
                "temperature 90 C at or above the slowdown threshold 85 C",
            ),
            f"critical XID 48, 94; 3 {ECC}; {REMAP_FAILED}",
        ),
        (
            EVERY_PROBLEM,
            10,
            [],
            (False, f"3 {ECC}; {RETIRED}; {REMAP_FAILED}; {REMAP_PENDING}"),
            f"3 {ECC}; {REMAP_FAILED}",
        ),
        (
            EVERY_PROBLEM,
            90,
            MANY_XIDS,
            (False, MANY_XIDS_REASON),
            MANY_XIDS_REASON,
        ),  # cut at HEALTH_REASON_MAX
    ],
)
def test_assess_and_fatal_health_for_the_same_readings(health, temperature, xids, assessed, fatal):
    assert assess_health(health, temperature, xids) == assessed
    assert fatal_health(health, xids) == fatal
