"""A MIG device in quotas and the usage ledger (issue 50): a slice counts as its profile's compute
slices over the GPU's 7, never as a whole GPU. Real API, the agent's side played by hand."""

import pytest

from fleetd.models import Task
from fleetd.services.accounting.ledger import record_for_run
from fleetwire.mig import gpu_fraction
from tests.support.gpus import mig_gpu

SEVEN = [("1g.10gb", slot, 1) for slot in range(7)]


def _node(api):
    api.create_fleet()
    gpus = [mig_gpu(0, SEVEN)]
    reg = api.register(api.create_join_token(), gpus=gpus)
    api.heartbeat(reg["session_token"], gpus=gpus)
    return reg


def test_a_profile_counts_its_compute_slices_over_seven():
    assert gpu_fraction("1g.10gb") == pytest.approx(1 / 7)
    assert gpu_fraction("3g.40gb") == pytest.approx(3 / 7)
    assert gpu_fraction("7g.80gb") == 1.0


def test_a_quota_of_one_gpu_holds_seven_1g_slices_not_one(api):
    _node(api)
    assert api.call("PUT", "/api/v1/quotas/vision", json={"max_gpus": 1}).status_code == 200
    jobs = [
        api.submit(name=f"nb{i}", team="vision", resources={"mig": "1g.10gb"}) for i in range(6)
    ]
    assert [j["state"] for j in jobs] == ["running"] * 6  # 6/7 of a GPU: within the quota
    two = api.submit(name="two", team="vision", resources={"mig": "1g.10gb", "gpus": 2})
    assert two["state"] == "queued"  # 8/7 would be over
    assert api.job(two["id"])["pending_reason"].startswith("team vision at its quota")


def test_the_ledger_counts_a_mig_task_as_its_share_of_a_gpu(api):
    _node(api)
    job = api.submit(name="nb", resources={"mig": "1g.10gb", "gpus": 2})
    [task] = api.job(job["id"])["tasks"]
    row = Task.get_by_id(task["id"])
    record = record_for_run(row.id, row.epoch, None, row.node_id, row.gpus)
    assert record.gpus == pytest.approx(2 / 7)
    assert record.gpu_model == "NVIDIA A100-SXM4-80GB"
