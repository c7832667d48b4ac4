"""The NVML adapter and device discovery against every fake host shape."""

import inspect

import pytest

from agent import fake_nvml as fake_module
from agent.devices import DeviceManager
from agent.nvml import Nvml, NvmlUnavailable, load_backend
from fleetwire.mig import mig_devices_from_wire
from tests.agent.conftest import SCENARIOS, rewrite_shape, shape_path, wait_until

GiB = 2**30


def discover(path):
    manager = DeviceManager(f"fake:{path}", watch_xids=False)
    try:
        return manager.discover()
    finally:
        manager.close()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_shape_yields_wire_entries_with_exactly_the_server_keys(fake_nvml, scenario):
    inventory = discover(fake_nvml.use(scenario))
    keys = {
        "uuid",
        "index",
        "vendor",
        "model",
        "memory_total_bytes",
        "numa_node",
        "max_tflops",
        "healthy",
        "health_reason",
        "mig_mode",
        "serial",
        "board_part_number",
        "vbios",
        "xids",
        "ecc_uncorrected",
        "mig_devices",
    }
    for gpu in inventory.wire_gpus():
        assert set(gpu) == keys
    uuids = [g["uuid"] for g in inventory.wire_gpus()]
    assert len(uuids) == len(set(uuids))


def test_h100_host_reports_eight_healthy_gpus_with_identity_and_tflops(fake_nvml):
    inventory = discover(fake_nvml.use("h100_x8"))
    assert inventory.driver_version == "550.54.15" and inventory.cuda_version == "12.4"
    assert [d.gpu.index for d in inventory.devices] == list(range(8))
    first = inventory.devices[0]
    assert first.gpu.model == "NVIDIA H100 80GB HBM3"
    assert first.gpu.memory_total_bytes == 81559 * 2**20
    assert first.gpu.healthy and first.gpu.health_reason == ""
    assert first.gpu.max_tflops == 1070.5  # 132 SMs x 1980 MHz x 4096 FLOP/clock
    assert first.sm_count == 132 and first.compute_capability == "9.0"
    assert first.pci_bus_id == "00000000:18:00.0"
    assert [d.gpu.numa_node for d in inventory.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert first.power_limit_w == 700.0 and first.temperature_c == 31


def test_mig_host_reports_mig_mode_and_instances_and_null_for_unsupported_utilization(fake_nvml):
    inventory = discover(fake_nvml.use("a100_mig_x2"))
    assert [d.gpu.mig_mode for d in inventory.devices] == ["enabled", "enabled"]
    assert [len(d.mig_devices) for d in inventory.devices] == [3, 1]
    assert inventory.devices[0].mig_devices[0]["uuid"].startswith("MIG-")
    # NVMLError (NotSupported) on an optional reading degrades to None, the GPU stays healthy.
    assert all(d.utilization_percent is None and d.gpu.healthy for d in inventory.devices)
    assert inventory.devices[0].gpu.max_tflops == 311.9


def test_mig_devices_go_on_the_wire_with_their_profile_and_placement(fake_nvml):
    inventory = discover(fake_nvml.use("a100_mig_x2"))
    first, second = inventory.wire_gpus()
    assert [(d["profile"], d["start"], d["size"]) for d in first["mig_devices"]] == [
        ("2g.10gb", 0, 2),
        ("2g.10gb", 2, 2),
        ("2g.10gb", 4, 2),
    ]
    assert second["mig_devices"] == [
        {
            "uuid": "MIG-7c1d2e3f-0000-4000-8000-000000000100",
            "memory_total_bytes": 42144366592,
            "profile": "7g.40gb",
            "start": 0,
            "size": 8,
        }
    ]
    assert mig_devices_from_wire(first["mig_devices"])  # what fleetd's check accepts


def test_an_h100_mig_host_names_its_profiles_from_the_h100_table(fake_nvml):
    inventory = discover(fake_nvml.use("h100_mig_x2"))
    first, second = inventory.wire_gpus()
    assert [d["profile"] for d in first["mig_devices"]] == ["1g.10gb"] * 7
    assert [d["start"] for d in first["mig_devices"]] == list(range(7))
    assert [(d["profile"], d["start"]) for d in second["mig_devices"]] == [("3g.40gb", 4)]


def test_a_mig_device_whose_gpu_instance_cannot_be_read_has_no_profile(fake_nvml):
    path = fake_nvml.use("a100_mig_x2")
    rewrite_shape(path, lambda shape: shape["gpus"][1]["mig_devices"][0].pop("start"))
    second = discover(path).wire_gpus()[1]
    assert second["mig_devices"][0]["profile"] is None
    assert second["mig_devices"][0]["start"] is None


def test_l4_host_without_mig_support_reports_null_mig_mode(fake_nvml):
    inventory = discover(fake_nvml.use("l4_x4"))
    assert len(inventory.devices) == 4
    assert all(d.gpu.mig_mode is None for d in inventory.devices)
    assert inventory.devices[0].gpu.max_tflops == 121.2


def test_lost_gpu_becomes_one_unhealthy_entry_and_the_others_still_report(fake_nvml):
    inventory = discover(fake_nvml.use("gpu_lost"))
    assert len(inventory.devices) == 4
    lost = inventory.devices[2]
    assert not lost.gpu.healthy and "GPU is lost" in lost.gpu.health_reason
    assert lost.gpu.index == 2 and lost.gpu.uuid == "unknown-gpu-2"
    assert all(d.gpu.healthy for i, d in enumerate(inventory.devices) if i != 2)


def test_gpu_lost_after_discovery_keeps_its_last_known_identity(fake_nvml):
    path = fake_nvml.use("h100_x8")
    manager = DeviceManager(f"fake:{path}", watch_xids=False)
    try:
        uuid = manager.discover().devices[5].gpu.uuid
        version = manager.version
        rewrite_shape(path, lambda d: d["gpus"][5].update(lost=True))
        inventory = manager.poll()
        assert inventory.devices[5].gpu.uuid == uuid
        assert inventory.devices[5].gpu.model == "NVIDIA H100 80GB HBM3"
        assert not inventory.devices[5].gpu.healthy
        assert manager.version == version + 1
    finally:
        manager.close()


def test_optional_reading_error_degrades_to_null(fake_nvml):
    path = fake_nvml.use("h100_x8")
    rewrite_shape(
        path,
        lambda d: d["gpus"][1].update(
            errors={
                "nvmlDeviceGetPowerUsage": "Unknown",
                "nvmlDeviceGetTemperature": "NotSupported",
                "nvmlDeviceGetNumaNodeId": "NoPermission",
            }
        ),
    )
    device = discover(path).devices[1]
    assert device.power_w is None and device.temperature_c is None and device.gpu.numa_node is None
    assert device.gpu.healthy and device.power_limit_w == 700.0


def test_required_reading_error_marks_the_gpu_unhealthy_with_the_reason(fake_nvml):
    path = fake_nvml.use("l4_x4")
    rewrite_shape(
        path, lambda d: d["gpus"][3].update(errors={"nvmlDeviceGetMemoryInfo": "Unknown"})
    )
    device = discover(path).devices[3]
    assert not device.gpu.healthy and "Unknown Error" in device.gpu.health_reason


def test_host_without_driver_is_cpu_only_with_the_reason(fake_nvml):
    inventory = discover(fake_nvml.use("no_driver"))
    assert inventory.devices == []
    assert "no NVIDIA driver" in inventory.reason and "Driver Not Loaded" in inventory.reason
    assert inventory.metrics()["devices_reason"] == inventory.reason


def test_rediscovery_picks_up_a_driver_installed_after_start(fake_nvml):
    path = fake_nvml.use("no_driver")
    manager = DeviceManager(f"fake:{path}", watch_xids=False)
    try:
        assert manager.discover().devices == []
        rewrite_shape(
            path,
            lambda d: d.update(
                no_driver=False,
                gpus=[__import__("json").loads(shape_path("l4_x4").read_text())["gpus"][0]],
            ),
        )
        inventory = manager.discover()
        assert len(inventory.devices) == 1 and inventory.reason == ""
    finally:
        manager.close()


def test_process_registered_on_a_gpu_shows_in_memory_used_and_process_list(fake_nvml):
    path = fake_nvml.use("h100_x8")
    manager = DeviceManager(f"fake:{path}", watch_xids=False)
    try:
        manager.discover()
        fake_nvml.add_process(3, pid=4242, used_bytes=5 * GiB)
        device = manager.poll().devices[3]
        assert device.memory_used_bytes == 5 * GiB
        assert device.processes == [{"pid": 4242, "used_memory_bytes": 5 * GiB}]
        fake_nvml.add_process(3, pid=4242, used_bytes=0)
        assert manager.poll().devices[3].processes == []
    finally:
        manager.close()


def test_critical_xid_marks_the_gpu_unhealthy_but_an_application_xid_does_not(fake_nvml):
    path = fake_nvml.use("h100_x8")
    manager = DeviceManager(f"fake:{path}")
    try:
        manager.discover()
        fake_nvml.inject_xid(2, 13)  # graphics engine exception: the application's fault
        fake_nvml.inject_xid(4, 79)  # fallen off the bus
        device = wait_until(
            lambda: (lambda d: d if not d.gpu.healthy else None)(manager.poll().devices[4]),
            timeout=10,
            message="XID 79 to mark GPU 4 unhealthy",
        )
        assert "critical XID 79" in device.gpu.health_reason
        assert manager.poll().devices[2].gpu.healthy
    finally:
        manager.close()


def test_fake_error_classes_and_constants_match_pynvml():
    pynvml = pytest.importorskip("pynvml")
    err = fake_module.NVMLError(fake_module.NVML_ERROR_GPU_IS_LOST)
    assert type(err).__name__ == "NVMLError_GpuIsLost" and isinstance(err, fake_module.NVMLError)
    assert str(err) == "GPU is lost"
    for name in dir(fake_module):
        if name.startswith(("NVML_", "nvmlEventType")):
            assert getattr(pynvml, name) == getattr(fake_module, name), name
        if name.startswith("NVMLError_"):
            assert hasattr(pynvml, name), name
        if name.startswith("nvml") and callable(getattr(fake_module, name)):
            real = getattr(pynvml, name)
            fake_params = list(inspect.signature(getattr(fake_module, name)).parameters)
            assert len(inspect.signature(real).parameters) == len(fake_params), name


def test_every_nvml_call_the_adapter_makes_exists_in_the_fake():
    import re
    from pathlib import Path

    import agent.nvml

    source = Path(agent.nvml.__file__).read_text()
    called = set(re.findall(r'"(nvml[A-Za-z0-9_]+)"', source)) | set(
        re.findall(r"\.nv\.(nvml[A-Za-z0-9_]+)", source)
    )
    assert called, "the adapter calls nothing?"
    missing = sorted(name for name in called if not hasattr(fake_module, name))
    assert missing == []


def test_backend_is_chosen_only_by_explicit_configuration(tmp_path):
    with pytest.raises(ValueError):
        load_backend("fake")
    with pytest.raises(ValueError):
        load_backend(f"fake:{tmp_path / 'missing.json'}")
    with pytest.raises(ValueError):
        load_backend("auto")


@pytest.mark.gpu
def test_real_nvml_reports_what_nvidia_smi_reports():
    import shutil
    import subprocess

    pynvml = pytest.importorskip("pynvml")
    try:
        Nvml(pynvml).open()
    except NvmlUnavailable as exc:
        pytest.skip(f"no NVML here: {exc}")
    if not shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi not installed")
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    expected = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    inventory = DeviceManager("nvml", watch_xids=False).discover()
    got = [
        [d.gpu.uuid, d.gpu.model, str(d.gpu.memory_total_bytes // 2**20)] for d in inventory.devices
    ]
    assert got == expected


def test_a_gpu_instance_made_and_destroyed_through_nvml_comes_and_goes_with_its_profile(fake_nvml):
    from agent.nvml import DeviceError, create_gpu_instance, destroy_gpu_instance

    nvml = Nvml(load_backend(f"fake:{fake_nvml.use('a100_mig_x2')}"))
    nvml.open()
    try:
        handle = nvml.handle(0)  # three 2g.10gb at 0, 2 and 4: slots 6 and 7 free
        made = create_gpu_instance(nvml, handle, "1_SLICE", 6, 1)
        devices = nvml.properties(handle)["mig_devices"]
        # Named by what the GPU says its profile id is (19), not by NVML's profile index (0).
        assert [(d["compute"], d["start"], d["size"]) for d in devices][-1] == (1, 6, 1)
        with pytest.raises(DeviceError):  # slot 6 is taken now: NVML refuses an overlap
            create_gpu_instance(nvml, handle, "1_SLICE", 6, 1)
        destroy_gpu_instance(nvml, made)
        assert [(d["start"], d["size"]) for d in nvml.properties(handle)["mig_devices"]] == [
            (0, 2),
            (2, 2),
            (4, 2),
        ]
    finally:
        nvml.close()
