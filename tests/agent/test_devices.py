"""Health rules and the max TFLOPS figure."""

import pytest

from agent.devices import DeviceManager, assess_health, max_tflops
from tests.agent.conftest import rewrite_shape


@pytest.mark.parametrize(
    "health, temperature, xids, reason",
    [
        ({"ecc_uncorrected_volatile": 2}, 40, [], "2 uncorrectable ECC error(s) since driver load"),
        ({"retired_pages_pending": True}, 40, [], "retired pages pending: GPU reset required"),
        ({"remapped_rows_pending": True}, 40, [], "remapped rows pending: GPU reset required"),
        ({"remapped_rows_failure": True}, 40, [], "row remapping failed"),
        (
            {"slowdown_temperature_c": 87},
            87,
            [],
            "temperature 87 C at or above the slowdown threshold 87 C",
        ),
        ({}, 40, [48, 48], "critical XID 48"),
    ],
)
def test_each_health_problem_makes_the_gpu_unhealthy_with_its_reason(
    health, temperature, xids, reason
):
    assert assess_health(health, temperature, xids) == (False, reason)


def test_no_problem_and_unknown_readings_mean_healthy():
    health = {
        "ecc_uncorrected_volatile": None,
        "retired_pages_pending": None,
        "remapped_rows_pending": False,
        "remapped_rows_failure": None,
        "slowdown_temperature_c": None,
    }
    assert assess_health(health, None, [13, 43]) == (True, "")
    assert assess_health({"slowdown_temperature_c": 87}, 86, []) == (True, "")


def test_several_problems_are_all_named():
    healthy, reason = assess_health(
        {"ecc_uncorrected_volatile": 1, "remapped_rows_pending": True}, 30, [79]
    )
    assert not healthy
    assert reason == (
        "critical XID 79; 1 uncorrectable ECC error(s) since driver load; "
        "remapped rows pending: GPU reset required"
    )


def test_max_tflops_is_null_for_unknown_architecture_or_missing_readings():
    assert max_tflops((9, 0), 16896, 1980) == 1070.5
    assert max_tflops((8, 0), 6912, 1410) == 311.9
    assert max_tflops((6, 0), 3584, 1480) is None
    assert max_tflops((9, 0), None, 1980) is None
    assert max_tflops(None, 16896, 1980) is None


def test_health_change_on_a_poll_bumps_the_inventory_version(fake_nvml):
    path = fake_nvml.use("l4_x4")
    manager = DeviceManager(f"fake:{path}", watch_xids=False)
    try:
        manager.discover()
        version = manager.version
        assert (
            manager.poll() and manager.version == version
        )  # live readings alone change nothing on the wire
        fake_nvml.update_gpu(0, temperature_c=12)
        manager.poll()
        assert manager.version == version
        rewrite_shape(path, lambda d: d["gpus"][1].update(ecc_uncorrected_volatile=3))
        gpu = manager.poll().devices[1].gpu
        assert not gpu.healthy and "3 uncorrectable ECC" in gpu.health_reason
        assert manager.version == version + 1
    finally:
        manager.close()
