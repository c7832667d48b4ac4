"""The validation gate in process: a gated fleet's new node validates before it takes work, a repair
drain validates on undrain, an operator's request returns the node where it was; the agent's
results decide, per check and GPU; GPUs are known by serial and an RMA drains their node. Real API,
the agent's side played by hand (tests/agent/test_validation_e2e.py runs real agents)."""

import pytest

from tests.conftest import gpus

PASS = {"status": "passed", "detail": "ok"}


def _gpus(count, prefix="S"):
    return [
        dict(
            g,
            serial=f"{prefix}{g['index']:04d}",
            board_part_number="699-2G520-0200-000",
            vbios="96.00.74.00.01",
        )
        for g in gpus(count)
    ]


def _report(api, session, validation_id, checks, expect=204, system=None):
    resp = api.post(
        f"/api/v1/agent/validations/{validation_id}",
        {
            "checks": checks,
            "system": system or {"driver_version": "550.54.15", "cuda_version": "12.4"},
        },
        token=session,
        agent=True,
    )
    assert resp.status_code == expect, resp.get_json()


def _enrol(api, name, fleet="gpu-a", count=2, prefix="S"):
    reg = api.register(
        api.create_join_token(fleet), machine_id=name, hostname=name, gpus=_gpus(count, prefix)
    )
    return reg["node_id"], reg["session_token"]


@pytest.fixture
def gated(api):
    api.create_fleet("gpu-a", validation={})
    return api


def test_a_fleet_without_a_gate_makes_new_nodes_ready_at_their_first_heartbeat(api):
    api.create_fleet("gpu-a")
    assert api.get("/api/v1/fleets/gpu-a").get_json()["validation"] is None
    node_id, session = _enrol(api, "plain")
    reply = api.heartbeat(session)
    assert reply["status"] == "ready" and reply.get("validation") is None


def test_a_new_node_validates_takes_no_work_and_is_ready_once_its_checks_pass(gated):
    api = gated
    node_id, session = _enrol(api, "host-a")
    reply = api.heartbeat(session)
    assert reply["status"] == "validating"
    suite = reply["validation"]["suite"]
    assert (
        suite["expected_gpus"] == 2 and "pcie_link" in suite["checks"] and suite["dcgm_level"] == 1
    )
    job = api.submit(resources={"gpus": 1})
    api.run_task("scheduling")
    assert api.job(job["id"])["state"] == "queued"
    shown = api.get(f"/api/v1/nodes/{node_id}/validation").get_json()
    assert shown["state"] == "running" and shown["returns_to"] == "ready"

    _report(
        api,
        session,
        reply["validation"]["id"],
        [
            dict(PASS, name="persistence_mode", gpu=0),
            dict(PASS, name="persistence_mode", gpu=1),
            {"name": "dcgm", "status": "skipped", "detail": "no dcgmi"},
        ],
    )
    assert api.node(node_id)["status"] == "ready"
    shown = api.get(f"/api/v1/nodes/{node_id}/validation").get_json()
    assert shown["state"] == "passed" and {c["name"] for c in shown["checks"]} == {
        "persistence_mode",
        "dcgm",
        "rma",
    }
    assert shown["checks"][0]["serial"] == "S0000"  # fleetd names each GPU's board
    api.run_task("scheduling")
    assert api.job(job["id"])["state"] == "running"
    assert api.heartbeat(session).get("validation") is None
    # A retried report of a finished validation changes nothing.
    _report(
        api,
        session,
        reply["validation"]["id"],
        [dict(name="pcie_link", gpu=0, status="failed", detail="x8")],
    )
    assert api.node(node_id)["status"] == "ready"


def test_a_failing_check_leaves_the_node_failed_validation_naming_the_check_and_gpu(gated):
    api = gated
    hook = api.post(
        "/api/v1/webhooks",
        {
            "url": "http://127.0.0.1:9/x",
            "secret": "0123456789abcdef",
            "events": ["node.validation"],
        },
    ).get_json()
    node_id, session = _enrol(api, "host-b")
    validation = api.heartbeat(session)["validation"]
    _report(
        api,
        session,
        validation["id"],
        [
            dict(PASS, name="pcie_link", gpu=0),
            {
                "name": "pcie_link",
                "gpu": 1,
                "status": "failed",
                "detail": "max link width x8, expected x16",
            },
            {
                "name": "clocks_throttle",
                "gpu": 0,
                "status": "not_supported",
                "detail": "NotSupported",
            },
        ],
    )
    node = api.node(node_id)
    assert node["status"] == "failed_validation"
    assert "pcie_link GPU 1 (serial S0001): max link width x8" in node["status_reason"]
    shown = api.get(f"/api/v1/nodes/{node_id}/validation").get_json()
    assert [c["passed"] for c in shown["checks"] if c["name"] != "rma"] == [True, False, True]
    history = api.get("/api/v1/gpus/S0001").get_json()["history"]
    assert "failed: pcie_link: max link width x8" in history[-1]["reason"]
    assert "validation" in api.get("/api/v1/gpus/S0000").get_json()["history"][-1]["kind"]
    assert [
        d["event"] for d in api.get(f"/api/v1/webhooks/{hook['id']}/deliveries").get_json()["items"]
    ] == ["node.validation"]

    # An operator validates it again: it passes, and is ready.
    assert api.post(f"/api/v1/nodes/{node_id}/validate").get_json()["status"] == "validating"
    again = api.heartbeat(session)["validation"]
    assert again["id"] != validation["id"]
    _report(api, session, again["id"], [dict(PASS, name="pcie_link", gpu=1)])
    assert api.node(node_id)["status"] == "ready"


def test_an_operator_validation_returns_a_cordoned_node_cordoned_and_is_refused_while_tasks_run(
    api,
):
    api.create_root_fleet("gpu-a")
    node_id, session = api.ready_node(api.create_join_token(), "host-c")
    api.submit(resources={"gpus": 1})
    api.start_task(session)
    resp = api.post(f"/api/v1/nodes/{node_id}/validate")
    assert resp.status_code == 409 and "drain it first" in resp.get_json()["error"]["message"]
    node_id, session = api.ready_node(api.create_join_token(), "host-d")
    api.post(f"/api/v1/nodes/{node_id}/cordon")
    assert api.post(f"/api/v1/nodes/{node_id}/validate").get_json()["status"] == "validating"
    validation = api.heartbeat(session)["validation"]
    _report(api, session, validation["id"], [dict(PASS, name="gpus_present")])
    assert api.node(node_id)["status"] == "cordoned"
    assert api.post("/api/v1/nodes/nope/validate").status_code == 404
    assert api.get("/api/v1/nodes/nope/validation").status_code == 404


def test_a_repair_drain_validates_on_undrain_even_without_a_gate(api):
    api.create_fleet("gpu-a")
    node_id, session = api.ready_node(api.create_join_token(), "host-e")
    drained = api.post(
        f"/api/v1/nodes/{node_id}/drain", {"reason": "replace GPU 1", "repair": True}
    ).get_json()
    assert drained["status"] == "drained" and drained["drain"]["repair"] is True
    assert api.post(f"/api/v1/nodes/{node_id}/undrain").get_json()["status"] == "validating"
    validation = api.heartbeat(session)["validation"]
    assert validation["suite"]["checks"][0] == "gpus_present"
    _report(
        api,
        session,
        validation["id"],
        [
            {
                "name": "row_remap",
                "gpu": 0,
                "status": "failed",
                "detail": "remapped rows pending: GPU reset required",
            }
        ],
    )
    node = api.node(node_id)
    assert node["status"] == "failed_validation" and "row_remap GPU 0" in node["status_reason"]
    assert (
        api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "again", "repair": True}).get_json()[
            "status"
        ]
        == "drained"
    )


def test_no_result_by_the_deadline_fails_the_validation(gated, clock):
    api = gated
    node_id, session = _enrol(api, "host-f")
    validation = api.heartbeat(session)["validation"]
    clock.advance(3600)
    assert api.heartbeat(session)["status"] == "failed_validation"
    assert "deadline" in api.node(node_id)["status_reason"]
    _report(api, session, validation["id"], [dict(PASS, name="gpus_present")])  # too late: ignored
    assert api.node(node_id)["status"] == "failed_validation"


def test_a_result_for_another_nodes_validation_is_not_found(gated):
    api = gated
    _, session_a = _enrol(api, "host-g")
    _, session_b = _enrol(api, "host-h", prefix="T")
    validation = api.heartbeat(session_a)["validation"]
    _report(api, session_b, validation["id"], [dict(PASS, name="gpus_present")], expect=404)


def test_a_gpu_serial_keeps_its_history_across_hosts_and_an_rma_mark_flags_it_where_it_returns(api):
    api.create_root_fleet("gpu-a")
    node_a, session_a = _enrol(api, "host-a")
    api.heartbeat(session_a)
    xid = _gpus(2)
    xid[1] = dict(
        xid[1], xids=[79], healthy=False, health_reason="critical XID 79", ecc_uncorrected=3
    )
    api.heartbeat(session_a, gpus=xid)
    marked = api.post("/api/v1/gpus/S0001/rma", {"reason": "XID 79 twice"}).get_json()
    assert marked["rma"]["reason"] == "XID 79 twice" and marked["healthy"] is False
    node = api.node(node_a)
    assert node["drain"]["repair"] is True and node["status"] in ("draining", "drained")

    # The board moves to another host: its history follows its serial, and it is flagged there.
    api.heartbeat(session_a, gpus=_gpus(1))
    node_b, session_b = _enrol(api, "host-b", count=1, prefix="B")
    moved = [dict(_gpus(1)[0], serial="S0001", uuid="GPU-moved", index=0)]
    api.heartbeat(session_b, gpus=moved)
    shown = api.get("/api/v1/gpus/S0001").get_json()
    assert shown["node_id"] == node_b and shown["hostname"] == "host-b"
    assert "seen again in node" in shown["flagged"] and shown["healthy"] is False
    kinds = [e["kind"] for e in shown["history"]]
    assert kinds[0] == "gpu.seen" and {
        "gpu.xid",
        "gpu.ecc",
        "gpu.health",
        "gpu.rma",
        "gpu.flagged",
    } <= set(kinds)
    reasons = " | ".join(e["reason"] for e in shown["history"])
    assert "host-a" in reasons and "host-b" in reasons and "critical XID 79" in reasons
    assert [g["serial"] for g in api.node(node_b)["gpus"]] == ["S0001"]
    assert api.node(node_b)["gpus"][0]["health_reason"].startswith("marked for RMA")
    assert api.get("/api/v1/gpus/nope").status_code == 404
    assert api.post("/api/v1/gpus/nope/rma", {"reason": "x"}).status_code == 404
    assert api.post("/api/v1/gpus/S0001/rma", {}).status_code == 400

    # The fleet's boards as assets: by state and model; a repaired board's mark is cleared.
    def listed(query=""):
        return [g["serial"] for g in api.get(f"/api/v1/gpus{query}").get_json()["items"]]

    assert listed() == ["B0000", "S0000", "S0001"]  # B0000: host-b's own board, seen once
    assert listed("?state=rma") == listed("?state=flagged") == ["S0001"]
    assert listed("?state=ok") == ["B0000", "S0000"]
    assert listed(f"?model={_gpus(1)[0]['model']}") == ["B0000", "S0000", "S0001"]
    assert listed("?model=A100") == []
    assert api.get("/api/v1/gpus?state=broken").status_code == 400
    cleared = api.delete("/api/v1/gpus/S0001/rma").get_json()
    assert (cleared["rma"], cleared["flagged"], cleared["healthy"]) == (None, "", True)
    assert cleared["history"][-1]["kind"] == "gpu.rma_cleared"
    assert api.node(node_b)["gpus"][0]["health_reason"] == ""
    assert listed("?state=ok") == ["B0000", "S0000", "S0001"]
    assert api.delete("/api/v1/gpus/S0001/rma").status_code == 409  # not marked any more
    assert api.delete("/api/v1/gpus/nope/rma").status_code == 404


def test_marking_a_gpu_again_keeps_its_nodes_repair_drain_and_a_validating_node_fails_on_it(gated):
    api = gated
    node_id, session = _enrol(api, "host-r")
    assert (
        api.post("/api/v1/gpus/S0000/rma", {"reason": "first"}).status_code == 200
    )  # validating: not drained
    validation = api.heartbeat(session)["validation"]
    _report(api, session, validation["id"], [dict(PASS, name="gpus_present")])
    node = api.node(node_id)
    assert (
        node["status"] == "failed_validation"
        and "serial S0000 is marked for RMA: first" in node["status_reason"]
    )
    assert (
        api.post("/api/v1/gpus/S0000/rma", {"reason": "again"}).get_json()["rma"]["reason"]
        == "again"
    )
    assert api.node(node_id)["drain"]["repair"] is True
    assert (
        api.post("/api/v1/gpus/S0000/rma", {"reason": "third"}).status_code == 200
    )  # already drained for repair
    assert [e["kind"] for e in api.get("/api/v1/gpus/S0000").get_json()["history"]].count(
        "gpu.rma"
    ) == 3


def test_a_gpu_that_fell_off_the_bus_is_still_expected_at_the_next_validation(gated):
    api = gated
    node_id, session = _enrol(api, "host-s")
    _report(
        api, session, api.heartbeat(session)["validation"]["id"], [dict(PASS, name="gpus_present")]
    )
    api.heartbeat(session, gpus=_gpus(1))  # one GPU is gone: the health policy drains the node
    assert api.post(f"/api/v1/nodes/{node_id}/validate").get_json()["status"] == "validating"
    assert api.heartbeat(session)["validation"]["suite"]["expected_gpus"] == 2


def test_the_operators_cordon_reason_stays_in_its_own_field_through_upgrades_and_validations(api):
    api.create_fleet("gpu-a")
    node_id, session = api.ready_node(api.create_join_token(), "host-e")
    assert api.node(node_id)["cordon"] is None
    cordoned = api.post(f"/api/v1/nodes/{node_id}/cordon", {"reason": "fan noise"}).get_json()
    assert cordoned["status_reason"] == "cordon: fan noise"
    cordon = cordoned["cordon"]
    assert (cordon["reason"], cordon["actor"]) == ("fan noise", "token:admin"), cordon
    # fleetd's own reasons replace one another in status_reason; the operator's stays beside them.
    api.post(f"/api/v1/nodes/{node_id}/upgrade", {"reason": "to 0.2.0"})
    upgraded = api.post(f"/api/v1/nodes/{node_id}/upgrade/end", {"outcome": "succeeded"})
    assert upgraded.get_json()["status_reason"].startswith("upgrade done (to 0.2.0)")
    assert api.post(f"/api/v1/nodes/{node_id}/validate").get_json()["cordon"] == cordon
    validation = api.heartbeat(session)["validation"]
    _report(api, session, validation["id"], [dict(PASS, name="gpus_present")])
    node = api.node(node_id)
    assert node["status"] == "cordoned" and node["status_reason"].startswith("validation ")
    assert node["cordon"] == cordon, node
    # Back in service, no cordon holds; a cordon without words says none were given.
    assert api.post(f"/api/v1/nodes/{node_id}/uncordon").get_json()["cordon"] is None
    bare = api.post(f"/api/v1/nodes/{node_id}/cordon").get_json()
    assert bare["status_reason"] == "cordoned by admin" and bare["cordon"]["reason"] == ""
    api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "RMA pending", "deadline_seconds": 60})
    assert api.post(f"/api/v1/nodes/{node_id}/undrain").get_json()["cordon"] is None


def test_an_rma_drain_keeps_its_reason_in_the_drain_through_a_validation_that_passes(api):
    api.create_fleet("gpu-a")
    node_id, session = _enrol(api, "host-f", prefix="R")
    api.heartbeat(session)
    api.post("/api/v1/gpus/R0001/rma", {"reason": "XID 79 twice", "deadline_seconds": 0})
    api.heartbeat(session)
    assert api.node(node_id)["status"] == "drained"
    api.delete("/api/v1/gpus/R0001/rma")  # the board is back from repair
    api.post(f"/api/v1/nodes/{node_id}/validate")
    validation = api.heartbeat(session)["validation"]
    _report(api, session, validation["id"], [dict(PASS, name="gpus_present")])
    node = api.node(node_id)
    assert node["status"] == "drained" and node["status_reason"].startswith("validation ")
    assert "marked for RMA: XID 79 twice" in node["drain"]["reason"], node["drain"]
