"""Dynamic MIG on the node (agent/mig.py) against the fake NVML: a target layout replaces an idle
GPU's instances, a held slice leaves the GPU untouched, an NVML failure is reported, each plan is
applied once and its result kept until sent."""

import pytest

from agent.devices import DeviceManager
from agent.mig import MigChanges, held_mig_devices
from agent.workers import Worker, Workers
from fleetwire.mig import MigInstance, MigLayout


@pytest.fixture
def devices(fake_nvml):
    manager = DeviceManager(f"fake:{fake_nvml.use('a100_mig_x2')}", watch_xids=False)
    manager.discover()
    yield manager
    manager.close()


def _gpu0(devices):
    return devices.inventory.devices[0].gpu


def _layout(devices, plan, *instances):
    return MigLayout(_gpu0(devices).uuid, plan, tuple(MigInstance(*i) for i in instances))


def test_an_idle_gpu_gets_the_layout_and_the_inventory_reports_its_new_devices(devices):
    before = devices.version
    changes = MigChanges(devices, set)
    changes.follow([_layout(devices, "p1", ("3g.20gb", 0, 4), ("3g.20gb", 4, 4))])
    [event] = changes.events()
    assert (event.ok, event.plan, event.busy) == (True, "p1", False), event
    gpu = _gpu0(devices)
    assert [(d.profile, d.start, d.size) for d in gpu.mig_devices] == [
        ("3g.20gb", 0, 4),
        ("3g.20gb", 4, 4),
    ]
    assert devices.version > before  # the next heartbeat sends the GPUs anew


def test_a_slice_a_task_holds_leaves_the_gpu_as_it_was(devices):
    held = {_gpu0(devices).mig_devices[1].uuid}
    was = _gpu0(devices).mig_devices
    changes = MigChanges(devices, lambda: held)
    changes.follow([_layout(devices, "p1", ("7g.40gb", 0, 8))])
    [event] = changes.events()
    assert not event.ok and event.busy and next(iter(held)) in event.detail
    assert _gpu0(devices).mig_devices == was


def test_an_nvml_failure_is_reported_with_the_step_it_stopped_at(devices):
    changes = MigChanges(devices, set)
    changes.follow([_layout(devices, "p1", ("1g.10gb", 0, 4))])  # no such GPU instance profile
    [event] = changes.events()
    assert not event.ok and not event.busy
    assert event.detail.startswith("creating 1g.10gb at slot 0")
    assert _gpu0(devices).mig_devices == ()  # what is left is reported as it is


def test_a_gpu_the_node_does_not_have_is_a_failure(devices):
    changes = MigChanges(devices, set)
    changes.follow([MigLayout("GPU-nope", "p1", (MigInstance("7g.40gb", 0, 8),))])
    [event] = changes.events()
    assert not event.ok and "no GPU GPU-nope" in event.detail


def test_a_plan_is_applied_once_and_its_result_kept_until_sent(devices):
    changes = MigChanges(devices, set)
    layout = _layout(devices, "p1", ("7g.40gb", 0, 8))
    changes.follow([layout])
    made = _gpu0(devices).mig_devices
    changes.follow([layout])  # fleetd repeated it before it heard back
    assert _gpu0(devices).mig_devices == made
    events = changes.events()
    assert len(events) == 1
    changes.sent(events)
    assert changes.events() == ()


def test_a_layout_the_gpu_has_already_changes_nothing(devices):
    changes = MigChanges(devices, set)
    was = _gpu0(devices).mig_devices
    layout = _layout(devices, "p1", *((d.profile, d.start, d.size) for d in was))
    changes.follow([layout])
    [event] = changes.events()
    assert event.ok and "already" in event.detail
    assert _gpu0(devices).mig_devices == was


def test_the_devices_tasks_hold_are_those_of_the_workers_grants():
    workers = Workers()
    workers.add(Worker("t1", 1, gpus=[{"uuid": "GPU-a", "mig_device": "MIG-1"}, {"uuid": "GPU-b"}]))
    workers.add(Worker("t2", 1, gpus=[{"uuid": "GPU-c", "mig_device": "MIG-2"}]))
    assert held_mig_devices(workers, None) == {"MIG-1", "MIG-2"}
