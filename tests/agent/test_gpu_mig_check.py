"""scripts/gpu_mig_check.py (run by hand on a real GPU host with MIG mode enabled) compares the
agent's MIG devices with `nvidia-smi mig -lgi` and creates and destroys one GPU instance through
agent.nvml: checked here on nvidia-smi's output format, the fake NVML and a stand-in pynvml."""

import ctypes
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.nvml import (
    CreatedInstance,
    DeviceError,
    Nvml,
    create_gpu_instance,
    destroy_gpu_instance,
    load_backend,
)
from fleetwire.mig import MigDevice, profiles_of

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_mig_check.py"
SPEC = importlib.util.spec_from_file_location("gpu_mig_check", SCRIPT)
assert SPEC is not None and SPEC.loader is not None
check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check)

H100 = profiles_of("NVIDIA H100 80GB HBM3")
LGI = """\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 1g.10gb          19        9          2:1     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb          19       10          3:1     |
+-------------------------------------------------------+
|   0  MIG 3g.40gb           9        2          4:4     |
+-------------------------------------------------------+
|   1  MIG 7g.80gb           0        0          0:8     |
+-------------------------------------------------------+
"""
LCI = """\
+--------------------------------------------------------------------+
| Compute instances:                                                 |
| GPU     GPU       Name             Profile   Instance   Placement  |
|       Instance                       ID        ID                  |
|         ID                                                         |
|====================================================================|
|   0      9       MIG 1g.10gb          0         0          0:1     |
+--------------------------------------------------------------------+
|   0     10       MIG 1g.10gb          0         0          0:1     |
+--------------------------------------------------------------------+
|   0      2       MIG 3g.40gb          2         0          0:3     |
+--------------------------------------------------------------------+
|   1      0       MIG 7g.80gb          4         0          0:7     |
+--------------------------------------------------------------------+
"""
AGENT = (
    MigDevice("MIG-a", 10 << 30, "1g.10gb", 2, 1),
    MigDevice("MIG-b", 10 << 30, "1g.10gb", 3, 1),
    MigDevice("MIG-c", 40 << 30, "3g.40gb", 4, 4),
)


def test_nvidia_smis_gpu_instances_are_read_with_gpu_profile_id_and_placement():
    gis = check.parse_lgi(LGI)
    assert gis[0] == check.GpuInstance(0, "1g.10gb", 19, 9, 2, 1)
    assert [(g.gpu, g.profile, g.instance_id, g.start, g.size) for g in gis[1:]] == [
        (0, "1g.10gb", 10, 3, 1),
        (0, "3g.40gb", 2, 4, 4),
        (1, "7g.80gb", 0, 0, 8),
    ]
    assert check.parse_lci(LCI) == {(0, 9), (0, 10), (0, 2), (1, 0)}


def test_no_gpu_instances_is_an_empty_list_and_an_error_is_not_one():
    assert check.parse_lgi("No GPU instances found: Not Found\n") == []
    assert check.parse_lci("No compute instances found: Not Found\n") == set()
    with pytest.raises(ValueError, match="Insufficient Permissions"):
        check.parse_lgi("Unable to list GPU instances: Insufficient Permissions\n")


def test_agent_mig_devices_equal_to_nvidia_smis_instances_have_no_mismatch():
    gis = check.parse_lgi(LGI)
    assert check.compare(gis, AGENT, 0, H100, check.parse_lci(LCI)) == []
    assert check.compare(gis, (), 1, {}, None) == [
        "GPU instance 0 (7g.80gb at 0:8): nvidia-smi lists it, the agent has no MIG device there"
    ]
    assert check.compare([], (), 0, H100) == []


def test_every_instance_or_device_that_differs_is_named():
    agent = (
        MigDevice("MIG-a", 10 << 30, None, 2, 1),  # a profile the agent could not name
        MigDevice("MIG-c", 40 << 30, "3g.40gb", 4, 4),
        MigDevice("MIG-d", 10 << 30, "1g.10gb", 0, 1),  # nvidia-smi has no instance there
        MigDevice("MIG-e"),  # NVML did not say its GPU instance
    )
    assert check.compare(check.parse_lgi(LGI), agent, 0, H100) == [
        "agent: MIG-e has no placement (NVML did not say its GPU instance)",
        "GPU instance 9 (1g.10gb at 2:1): the agent names it None, expected 1g.10gb",
        "GPU instance 10 (1g.10gb at 3:1): nvidia-smi lists it, the agent has no MIG device there",
        "0:1: the agent has a MIG device (1g.10gb), nvidia-smi no instance",
    ]


def test_an_instance_without_a_compute_instance_is_not_looked_for():
    with_ci = check.parse_lci(LCI) - {(0, 10)}
    assert check.compare(check.parse_lgi(LGI), AGENT[::2], 0, H100, with_ci) == []


def test_a_media_variant_has_no_profile_and_several_compute_instances_count_once():
    gis = check.parse_lgi(
        LGI.replace("MIG 1g.10gb          19        9", "MIG 1g.10gb+me       20        9")
    )
    split = (MigDevice("MIG-c2", 20 << 30, "3g.40gb", 4, 4),)
    agent = (MigDevice("MIG-a", 10 << 30, None, 2, 1), *AGENT[1:], *split)
    assert check.compare(gis, agent, 0, H100) == []
    assert check.compare(gis, AGENT, 0, H100) == [
        "GPU instance 9 (1g.10gb+me at 2:1): the agent names it 1g.10gb, expected None"
    ]


def test_the_one_slot_1g_goes_at_the_lowest_free_slot_and_nowhere_on_a_full_gpu():
    gis = check.parse_lgi(LGI)
    profile, start = check.free_one_slot_1g(gis, 0, H100)
    assert (profile.name, start, profile.size) == ("1g.10gb", 0, 1)
    assert check.free_one_slot_1g(gis, 1, H100) is None  # 7g.80gb takes every slot
    assert check.free_one_slot_1g(gis, 2, H100)[1] == 0  # no instances at all
    assert check.free_one_slot_1g(gis, 0, {}) is None  # a model without MIG profiles
    sevens = [check.GpuInstance(0, "1g.10gb", 19, i + 1, i, 1) for i in range(7)]
    assert check.free_one_slot_1g(sevens, 0, H100) is None  # slot 7 is free, no 1g starts there


def test_the_created_instance_must_be_listed_at_its_placement_and_then_gone():
    gis = check.parse_lgi(LGI)
    assert check.check_listed(gis, 0, 9, "1g.10gb", 2, 1) == []
    assert check.check_listed(gis, 0, 9, "1g.10gb", 0, 1) == [
        "created 1g.10gb at 0:1, nvidia-smi lists GPU instance 9 (1g.10gb at 2:1)"
    ]
    assert check.check_listed(gis, 0, 11, "1g.10gb", 0, 1) == [
        "nvidia-smi does not list the GPU instance 11 just created"
    ]
    assert check.check_gone(gis, 0, 11, 0, 1) == []
    assert check.check_gone(gis, 0, 9, 2, 1) == [
        "after destroying it nvidia-smi still lists GPU instance 9 (1g.10gb at 2:1)"
    ]


def test_the_gpu_with_mig_enabled_is_found_and_read_through_the_agents_nvml(fake_nvml):
    nvml = Nvml(load_backend(f"fake:{fake_nvml.use('h100_mig_x2')}"))
    nvml.open()
    try:
        gpu, handle, ident = check.find_gpu(nvml, 1)
        devices = check.read_agent(nvml, handle, ident)
    finally:
        nvml.close()
    assert gpu == 1 and [(d.profile, d.start, d.size) for d in devices] == [("3g.40gb", 4, 4)]
    smi = check.parse_lgi(LGI.replace("|   0  MIG 3g.40gb", "|   1  MIG 3g.40gb"))
    assert check.compare(smi, devices, 1, profiles_of(ident["name"])) == [
        "GPU instance 0 (7g.80gb at 0:8): nvidia-smi lists it, the agent has no MIG device there"
    ]


def test_without_a_mig_enabled_gpu_or_nvidia_smi_there_is_nothing_to_check(
    fake_nvml, capsys, monkeypatch
):
    nvml = Nvml(load_backend(f"fake:{fake_nvml.use('l4_x4')}"))
    nvml.open()
    try:
        assert check.find_gpu(nvml, None) is None
        assert check.find_gpu(nvml, 9) is None
    finally:
        nvml.close()
    out = capsys.readouterr().out
    assert "no GPU with MIG mode enabled (this check never enables it" in out
    assert "MIG mode not supported" in out and "no GPU 9: NVML sees 4 GPU(s)" in out

    def no_smi(flag):
        raise check.SmiError(f"nvidia-smi mig {flag} failed: not found")

    monkeypatch.setattr(check, "smi_mig", no_smi)
    assert check.main(["--dry-run"]) == 2
    monkeypatch.setattr(check.os, "geteuid", lambda: 1000)
    assert check.main([]) == 2
    assert "needs root" in capsys.readouterr().out


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class StandInNvml:
    """The pynvml calls create_gpu_instance and destroy_gpu_instance make, recorded."""

    NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    c_nvmlGpuInstancePlacement_t = Placement

    class NVMLError(Exception):
        pass

    def __init__(self, fail=None):
        self.calls = []
        self.fail = fail

    def _call(self, name, *args):
        self.calls.append((name, *args))
        if name == self.fail:
            raise self.NVMLError("Insufficient Resources")

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle, profile):
        self._call("gi profile", profile)
        return SimpleNamespace(id=19, sliceCount=1)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle, profile_id, placement):
        self._call("create gi", profile_id, (placement._obj.start, placement._obj.size))
        return "gi"

    def nvmlGpuInstanceGetInfo(self, gi):
        self._call("gi info", gi)
        return SimpleNamespace(id=11)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, profile, engines):
        self._call("ci profile", gi, profile)
        return SimpleNamespace(id=0)

    def nvmlGpuInstanceCreateComputeInstance(self, gi, profile_id):
        self._call("create ci", gi, profile_id)
        return "ci"

    def nvmlComputeInstanceDestroy(self, ci):
        self._call("destroy ci", ci)

    def nvmlGpuInstanceDestroy(self, gi):
        self._call("destroy gi", gi)


def test_a_gpu_instance_is_created_at_its_placement_and_destroyed_compute_instance_first():
    nv = StandInNvml()
    created = create_gpu_instance(Nvml(nv), "gpu", "1_SLICE", 3, 1)
    assert created.id == 11 and created.compute_instance == "ci"
    destroy_gpu_instance(Nvml(nv), created)
    assert nv.calls == [
        ("gi profile", 0),
        ("create gi", 19, (3, 1)),
        ("gi info", "gi"),
        ("ci profile", "gi", 0),
        ("create ci", "gi", 0),
        ("destroy ci", "ci"),
        ("destroy gi", "gi"),
    ]


def test_a_gpu_instance_whose_compute_instance_fails_is_destroyed():
    nv = StandInNvml(fail="create ci")
    with pytest.raises(DeviceError, match="Insufficient Resources"):
        create_gpu_instance(Nvml(nv), "gpu", "1_SLICE", 0, 1)
    assert nv.calls[-2:] == [("create ci", "gi", 0), ("destroy gi", "gi")]
    with pytest.raises(DeviceError, match="no GPU instance profile 9_SLICE"):
        create_gpu_instance(Nvml(nv), "gpu", "9_SLICE", 0, 1)


NEW_GI = "|   0  MIG 1g.10gb          19       11          0:1     |\n"
NEW_CI = "|   0     11       MIG 1g.10gb          0         0          0:1     |\n"


def stand_in_run(monkeypatch, listings, views):
    """Make exercise's NVML and nvidia-smi stand-ins: `listings` (-lgi texts) and `views` (the
    agent's MIG devices) in the order read; returns the NVML calls made."""
    events = []

    def create(nvml, handle, profile, start, size):
        events.append(("create", profile, start, size))
        return CreatedInstance("gi", "ci", 11)

    lgi = iter(listings)
    agent = iter(views)
    monkeypatch.setattr(check, "create_gpu_instance", create)
    monkeypatch.setattr(
        check, "destroy_gpu_instance", lambda nvml, c: events.append(("destroy", c.id))
    )
    monkeypatch.setattr(
        check, "smi_mig", lambda flag: next(lgi) if flag == "-lgi" else LCI + NEW_CI
    )
    monkeypatch.setattr(check, "read_agent", lambda nvml, handle, ident: next(agent))
    return events


def test_a_created_instance_both_list_then_neither_lists_is_no_problem(monkeypatch, capsys):
    created = (*AGENT, MigDevice("MIG-n", 10 << 30, "1g.10gb", 0, 1))
    events = stand_in_run(monkeypatch, [LGI + NEW_GI, LGI], [created, AGENT])
    assert check.exercise(None, None, None, 0, H100, [], H100["1g.10gb"], 0) == []
    assert events == [("create", "1_SLICE", 0, 1), ("destroy", 11)]


def test_what_was_created_is_destroyed_when_a_check_fails_or_the_run_is_stopped(
    monkeypatch, capsys
):
    events = stand_in_run(monkeypatch, [LGI, LGI + NEW_GI], [AGENT, AGENT])
    assert check.exercise(None, None, None, 0, H100, [], H100["1g.10gb"], 0) == [
        "nvidia-smi does not list the GPU instance 11 just created",
        "after destroying it: GPU instance 11 (1g.10gb at 0:1): nvidia-smi lists it, the agent"
        " has no MIG device there",
        "after destroying it nvidia-smi still lists GPU instance 11 (1g.10gb at 0:1)",
    ]
    assert events == [("create", "1_SLICE", 0, 1), ("destroy", 11)]

    def stopped(nvml, handle, ident):
        raise KeyboardInterrupt

    events = stand_in_run(monkeypatch, [LGI + NEW_GI], [])
    monkeypatch.setattr(check, "read_agent", stopped)
    with pytest.raises(KeyboardInterrupt):
        check.exercise(None, None, None, 0, H100, [], H100["1g.10gb"], 0)
    assert events == [("create", "1_SLICE", 0, 1), ("destroy", 11)]
