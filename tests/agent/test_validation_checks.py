"""The built-in validation checks against the fake NVML: each bad reading fails its check on its
GPU, a reading the GPU does not support is reported, not failed; DCGM and the fleet's command run
with a time limit and their output kept (agent/validation.py, agent/validator.py)."""

import os
import threading

from agent.devices import DeviceManager
from agent.isolation import Isolation
from agent.validation import Suite, run_checks
from agent.validator import Validator
from tests.agent.conftest import rewrite_shape

SUITE = {
    "checks": [
        "gpus_present",
        "gpu_health",
        "driver_version",
        "cuda_version",
        "persistence_mode",
        "ecc_mode",
        "retired_pages",
        "row_remap",
        "ecc_errors",
        "pcie_link",
        "clocks_throttle",
        "temperature",
        "mig_mode",
    ],
    "expected_gpus": 8,
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
    "max_temperature_c": 85,
}


def _results(path, suite=SUITE):
    manager = DeviceManager(f"fake:{path}", watch_xids=False)
    try:
        manager.discover()
        return run_checks(Suite.from_wire(suite), *manager.validation_readings())
    finally:
        manager.close()


def _failed(results):
    return {(r["name"], r["gpu"]) for r in results if r["status"] == "failed"}


def test_a_healthy_h100_host_passes_every_check_with_its_idle_link_trained_down(fake_nvml):
    results = _results(fake_nvml.use("h100_x8"))
    assert _failed(results) == set()
    assert len([r for r in results if r["name"] == "pcie_link"]) == 8
    assert {r["status"] for r in results if r["name"] in ("persistence_mode", "ecc_mode")} == {
        "passed"
    }


def test_each_bad_reading_fails_its_check_on_its_gpu(fake_nvml):
    path = fake_nvml.use("h100_x8")

    def break_it(shape):
        gpus = shape["gpus"]
        gpus[0]["persistence_mode"] = False
        gpus[1]["ecc_mode_pending"] = "disabled"
        gpus[2]["pcie"] = dict(gpus[2]["pcie"], max_gen=4)
        gpus[3]["clock_event_reasons"] = ["gpu_idle", "hw_slowdown"]
        gpus[4]["temperature_c"] = 88
        gpus[5]["remapped_rows"] = {
            "correctable": 1,
            "uncorrectable": 0,
            "pending": False,
            "failure": True,
        }
        gpus[6]["ecc_uncorrected_volatile"] = 2
        gpus[7]["mig_mode_pending"] = "enabled"
        shape["driver_version"] = "535.161.08"

    rewrite_shape(path, break_it)
    results = _results(path)
    assert _failed(results) == {
        ("persistence_mode", 0),
        ("ecc_mode", 1),
        ("pcie_link", 2),
        ("clocks_throttle", 3),
        ("temperature", 4),
        ("row_remap", 5),
        ("ecc_errors", 6),
        ("mig_mode", 7),
        ("driver_version", None),
    }
    detail = {(r["name"], r["gpu"]): r["detail"] for r in results}
    assert "link max Gen4, the GPU supports Gen5" in detail[("pcie_link", 2)]
    assert detail[("clocks_throttle", 3)] == "clocks held down at idle: hw_slowdown"
    assert (
        detail[("driver_version", None)]
        == "driver version 535.161.08, expected 550.54.15 (what the fleet's "
        "validated nodes run)"
    )


def test_readings_a_gpu_does_not_support_are_reported_not_failed_and_a_missing_gpu_fails(fake_nvml):
    results = _results(
        fake_nvml.use("l4_x4"), dict(SUITE, expected_gpus=5, driver_version=None, cuda_version=None)
    )
    assert _failed(results) == {("gpus_present", None)}
    statuses = {r["name"]: r["status"] for r in results if r["gpu"] == 0}
    assert (
        statuses["pcie_link"]
        == statuses["persistence_mode"]
        == statuses["clocks_throttle"]
        == "not_supported"
    )
    results = _results(
        fake_nvml.use("a100_mig_x2"), dict(SUITE, expected_gpus=2, mig_mode="disabled")
    )
    assert ("mig_mode", 0) in _failed(results)


def test_the_fleets_command_runs_unprivileged_with_a_time_limit_and_dcgm_is_skipped_where_absent(
    fake_nvml, tmp_path
):
    manager = DeviceManager(f"fake:{fake_nvml.use('h100_x8')}", watch_xids=False)
    manager.discover()
    stop = threading.Event()
    validator = Validator(manager, None, Isolation(), str(tmp_path), stop, dcgmi="")
    try:
        body = validator.run_suite(
            "v1",
            Suite.from_wire(
                dict(
                    SUITE,
                    checks=["gpus_present", "dcgm"],
                    dcgm_level=1,
                    command=["sh", "-c", "echo started; id -u; exec sleep 30"],
                    timeout_seconds=1,
                    future_field="ignored",
                )
            ),
        )
    finally:
        manager.close()
    by_name = {r["name"]: r for r in body["checks"]}
    assert by_name["dcgm"]["status"] == "skipped" and "not installed" in by_name["dcgm"]["detail"]
    command = by_name["command"]
    assert command["status"] == "failed" and "did not finish in 1 s" in command["detail"]
    assert command["output"].splitlines()[0] == "started"
    if os.geteuid() == 0:
        assert command["output"].splitlines()[1] != "0"  # as nobody, like tasks
    assert body["system"] == {"driver_version": "550.54.15", "cuda_version": "12.4"}
    assert os.listdir(tmp_path / "validation") == []  # its directory and output file are gone
