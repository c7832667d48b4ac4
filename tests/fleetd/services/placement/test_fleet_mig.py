"""A fleet's MIG setting through the API (issue 50): {mode: off | fixed | dynamic, layout?,
settle_seconds?}, validated (400
in the error envelope), what placement does with it, and the validation gate's layout check.
Real API, the agent's side played by hand."""

import pytest

from tests.support.gpus import mig_gpu

A100 = "NVIDIA A100-SXM4-80GB"
SEVEN = [("1g.10gb", slot, 1) for slot in range(7)]
PASS = {"status": "passed", "detail": "ok"}


def test_a_fleet_shows_its_mig_setting_in_force_and_takes_a_fixed_layout(api):
    assert api.create_fleet("gpu-a")["mig"] == {"mode": "fixed"}
    layout = {A100: ["4g.40gb", "2g.20gb", "1g.10gb"]}
    resp = api.patch("/api/v1/fleets/gpu-a", {"mig": {"mode": "fixed", "layout": layout}})
    assert resp.status_code == 200, resp.get_json()
    assert api.get("/api/v1/fleets/gpu-a").get_json()["mig"] == {"mode": "fixed", "layout": layout}
    assert api.patch("/api/v1/fleets/gpu-a", {"mig": None}).get_json()["mig"] == {"mode": "fixed"}
    made = api.create_fleet("gpu-b", mig={"mode": "off"})
    assert made["mig"] == {"mode": "off"}
    dynamic = {"mode": "dynamic", "settle_seconds": 60}
    assert api.create_fleet("gpu-c", mig=dynamic)["mig"] == dynamic


@pytest.mark.parametrize(
    ("mig", "says"),
    [
        ({"mode": "sometimes"}, "mig.mode must be off, fixed or dynamic"),
        ({"mode": "dynamic", "settle_seconds": -1}, "settle_seconds"),
        ({"mode": "dynamic", "settle_seconds": "5"}, "settle_seconds"),
        ({"mode": "fixed", "settle_seconds": 60}, "with mode dynamic only"),
        ({"mode": "dynamic", "layout": {A100: ["7g.80gb"]}}, "with mode fixed only"),
        ({}, "Missing data for required field"),
        ({"mode": "fixed", "extra": 1}, "Unknown field"),
        ({"mode": "fixed", "layout": {A100: ["1g.5gb"]}}, "1g.5gb not a profile of this model"),
        ({"mode": "fixed", "layout": {"NVIDIA L4": ["1g.10gb"]}}, "not a MIG-capable GPU model"),
        ({"mode": "fixed", "layout": {A100: ["4g.40gb", "4g.40gb"]}}, "do not fit on one GPU"),
        ({"mode": "fixed", "layout": {A100: ["1g.10gb"] * 8}}, "a GPU holds 1 to 7 MIG devices"),
        ({"mode": "fixed", "layout": {A100: []}}, "a GPU holds 1 to 7 MIG devices"),
        ({"mode": "off", "layout": {A100: ["7g.80gb"]}}, "with mode fixed only"),
    ],
)
def test_a_mig_setting_that_means_nothing_or_cannot_be_is_refused_in_the_error_envelope(
    api, mig, says
):
    api.create_fleet("gpu-a")
    resp = api.patch("/api/v1/fleets/gpu-a", {"mig": mig})
    assert resp.status_code == 400, resp.get_json()
    body = resp.get_json()
    assert body["error"]["code"] == "invalid_request"
    assert says in str(body["error"])
    created = api.post("/api/v1/fleets", {"name": "gpu-b", "mig": mig})
    assert created.status_code == 400 and says in str(created.get_json()["error"])


def test_a_fleet_with_mig_off_places_no_mig_work_on_its_mig_gpus(api):
    api.create_fleet("gpu-a", mig={"mode": "off"})
    gpus = [mig_gpu(0, SEVEN)]
    reg = api.register(api.create_join_token(), gpus=gpus)
    api.heartbeat(reg["session_token"], gpus=gpus)
    job = api.submit(name="nb", resources={"mig": "1g.10gb"})
    assert job["state"] == "queued"
    api.patch("/api/v1/fleets/gpu-a", {"mig": {"mode": "fixed"}})  # wakes it: its node changed
    api.run_task("scheduling")
    assert api.job(job["id"])["state"] == "running"


def _validate(api, gpus):
    """Enrol a node with these GPUs in the gated fleet and pass every agent check: the node's
    status and validation once fleetd added its own checks."""
    reg = api.register(api.create_join_token(), gpus=gpus)
    reply = api.heartbeat(reg["session_token"], gpus=gpus)
    assert reply["status"] == "validating"
    resp = api.post(
        f"/api/v1/agent/validations/{reply['validation']['id']}",
        {
            "checks": [dict(PASS, name="gpu_health", gpu=g["index"]) for g in gpus],
            "system": {"driver_version": "550.54.15", "cuda_version": "12.4"},
        },
        token=reg["session_token"],
        agent=True,
    )
    assert resp.status_code == 204, resp.get_json()
    node = api.get(f"/api/v1/nodes/{reg['node_id']}").get_json()
    return node, api.get(f"/api/v1/nodes/{reg['node_id']}/validation").get_json()


def test_the_gate_fails_a_node_whose_mig_gpu_lacks_the_fixed_layout_naming_the_gpu(api):
    layout = {A100: ["1g.10gb"] * 7}
    api.create_fleet("gpu-a", validation={}, mig={"mode": "fixed", "layout": layout})
    wrong = mig_gpu(1, [("3g.40gb", 0, 4), ("1g.10gb", 4, 1)])
    node, validation = _validate(api, [mig_gpu(0, SEVEN), wrong])
    assert node["status"] == "failed_validation"
    [failed] = [c for c in validation["checks"] if not c["passed"]]
    assert (failed["name"], failed["gpu"], failed["uuid"]) == ("mig_layout", 1, wrong["uuid"])
    assert "[1g.10gb, 3g.40gb]" in failed["detail"] and wrong["uuid"] in node["status_reason"]


def test_the_gate_passes_mig_gpus_with_the_layout_and_ignores_other_models(api):
    layout = {A100: ["1g.10gb"] * 7, "NVIDIA H100 80GB HBM3": ["7g.80gb"]}
    api.create_fleet("gpu-a", validation={}, mig={"mode": "fixed", "layout": layout})
    other = mig_gpu(1, [("3g.40gb", 0, 4)], model="NVIDIA A100-SXM4-40GB")
    node, validation = _validate(api, [mig_gpu(0, SEVEN), other])
    assert node["status"] == "ready", validation
    [check] = [c for c in validation["checks"] if c["name"] == "mig_layout"]
    assert check["passed"] and check["gpu"] is None


def test_the_gate_of_a_dynamic_fleet_checks_the_profile_table_not_a_layout(api):
    api.create_fleet("gpu-a", validation={}, mig={"mode": "dynamic"})
    mixed = mig_gpu(1, [("3g.40gb", 0, 4), ("1g.10gb", 4, 1)])
    node, validation = _validate(api, [mig_gpu(0, SEVEN), mixed])
    assert node["status"] == "ready", validation
    [check] = [c for c in validation["checks"] if c["name"] == "mig_layout"]
    assert check["passed"]


def test_the_gate_of_a_dynamic_fleet_fails_a_placement_the_table_does_not_allow(api):
    api.create_fleet("gpu-a", validation={}, mig={"mode": "dynamic"})
    wrong = mig_gpu(0, [("3g.40gb", 2, 4)])  # a 3g starts at slot 0 or 4 only
    node, validation = _validate(api, [wrong])
    assert node["status"] == "failed_validation"
    [failed] = [c for c in validation["checks"] if not c["passed"]]
    assert failed["name"] == "mig_layout" and "3g.40gb@2" in failed["detail"]
