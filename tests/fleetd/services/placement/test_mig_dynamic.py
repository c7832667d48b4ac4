"""Dynamic MIG through the real API (issue 50): fleetd plans a layout for an idle GPU from the
queue, the node learns it on its heartbeat answer, the agent's results are recorded as events; a
failure blocks that GPU (never its node) until an operator clears it. The agent's side is played
by hand here; tests/agent/test_mig_dynamic_e2e.py runs the real agent."""

from tests.support.gpus import mig_gpu

A100 = "NVIDIA A100-SXM4-80GB"
SEVEN = [("1g.10gb", slot, 1) for slot in range(7)]
TWO_THREES = [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)]


def _node(api, gpus, fleet_mig=None):
    """A ready node in a dynamic fleet reporting these GPUs: (node id, session token)."""
    api.create_fleet("gpu-a", mig=fleet_mig or {"mode": "dynamic"})
    reg = api.register(api.create_join_token(), gpus=gpus)
    api.heartbeat(reg["session_token"], gpus=gpus)
    return reg["node_id"], reg["session_token"]


def _kinds(api, node_id):
    return [e["kind"] for e in api.get(f"/api/v1/nodes/{node_id}/events").get_json()["items"]]


def test_an_idle_gpu_gets_the_layout_the_queue_needs_and_the_job_runs_once_applied(api):
    gpus = [dict(mig_gpu(0, SEVEN), serial="1320000000001")]
    node_id, session = _node(api, gpus)
    job = api.submit(name="big", resources={"mig": "3g.40gb"})
    assert job["state"] == "queued"
    assert api.run_task("mig_planning")["planned"] == 1
    [layout] = api.heartbeat(session)["mig_layouts"]
    assert layout["gpu_uuid"] == gpus[0]["uuid"]
    assert [(i["profile"], i["start"]) for i in layout["instances"]] == [
        ("3g.40gb", 0),
        ("3g.40gb", 4),
    ]
    assert api.node(node_id)["gpus"][0]["mig_target"]["plan"] == layout["plan"]
    assert api.run_task("mig_planning")["planned"] == 0  # pending: not planned twice
    # The agent applies it and reports the result with its GPUs anew.
    applied = [dict(mig_gpu(0, TWO_THREES), serial="1320000000001")]
    event = {"gpu_uuid": gpus[0]["uuid"], "plan": layout["plan"], "ok": True}
    reply = api.heartbeat(session, gpus=applied, mig_events=[event])
    assert "mig_layouts" not in reply
    api.run_task("scheduling")
    assert api.job(job["id"])["state"] == "running"
    assert {"gpu.mig_planned", "gpu.mig_changed"} <= set(_kinds(api, node_id))
    assert api.node(node_id)["gpus"][0]["mig_target"] is None
    # The same result again (a heartbeat retried) records nothing more.
    api.heartbeat(session, mig_events=[event])
    assert _kinds(api, node_id).count("gpu.mig_changed") == 1


def test_a_gpu_with_a_busy_slice_is_never_planned(api):
    node_id, session = _node(api, [mig_gpu(0, SEVEN)])
    api.submit(name="nb", resources={"mig": "1g.10gb"})
    api.run_task("scheduling")
    api.start_task(session)
    api.submit(name="big", resources={"mig": "7g.80gb"})
    assert api.run_task("mig_planning")["planned"] == 0
    assert "mig_layouts" not in api.heartbeat(session)


def test_a_pending_target_keeps_mig_work_off_the_gpu(api):
    node_id, session = _node(api, [mig_gpu(0, SEVEN)])
    api.submit(name="big", resources={"mig": "7g.80gb"})
    api.run_task("mig_planning")
    small = api.submit(name="nb", resources={"mig": "1g.10gb"})
    api.run_task("scheduling")
    assert api.job(small["id"])["state"] == "queued"  # its 1g slices are about to go


def test_a_failed_repartition_blocks_that_gpu_not_the_node_until_cleared(api):
    gpus = [dict(mig_gpu(0, SEVEN), serial="1320000000002"), mig_gpu(1, SEVEN)]
    node_id, session = _node(api, gpus)
    api.submit(name="big", resources={"mig": "7g.80gb"})
    api.run_task("mig_planning")
    [layout] = api.heartbeat(session)["mig_layouts"]
    assert layout["gpu_uuid"] == gpus[0]["uuid"]
    failed = {
        "gpu_uuid": gpus[0]["uuid"],
        "plan": layout["plan"],
        "ok": False,
        "detail": "nvmlDeviceCreateGpuInstanceWithPlacement: Insufficient Resources",
    }
    api.heartbeat(session, mig_events=[failed])
    node = api.node(node_id)
    assert node["status"] == "ready"
    assert "Insufficient Resources" in node["gpus"][0]["mig_blocked"]
    assert "gpu.mig_failed" in _kinds(api, node_id)
    listed = api.get("/api/v1/gpus", query_string={"state": "mig_blocked"}).get_json()
    assert [g["serial"] for g in listed["items"]] == ["1320000000002"]
    # Blocked: no work on it, and it is not planned again; the other GPU still takes 1g work.
    nb = api.submit(name="nb", resources={"mig": "1g.10gb"})
    api.run_task("scheduling")
    assert api.job(nb["id"])["state"] == "running"
    # Cleared by an operator: it takes work again; clearing twice is a conflict.
    resp = api.delete("/api/v1/gpus/1320000000002/mig-block")
    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json()["mig_blocked"] == ""
    assert api.delete("/api/v1/gpus/1320000000002/mig-block").status_code == 409
    assert api.delete("/api/v1/gpus/no-such-serial/mig-block").status_code == 404


def test_a_busy_answer_leaves_the_gpu_as_it_was_without_a_block(api):
    gpus = [mig_gpu(0, SEVEN)]
    node_id, session = _node(api, gpus)
    api.submit(name="big", resources={"mig": "7g.80gb"})
    api.run_task("mig_planning")
    [layout] = api.heartbeat(session)["mig_layouts"]
    busy = {"gpu_uuid": gpus[0]["uuid"], "plan": layout["plan"], "ok": False, "busy": True}
    api.heartbeat(session, mig_events=[busy])
    node = api.node(node_id)
    assert node["gpus"][0]["mig_blocked"] == "" and node["gpus"][0]["mig_target"] is None
    assert "gpu.mig_skipped" in _kinds(api, node_id)


def test_a_gpu_is_not_repartitioned_again_within_its_settle_time(api, clock):
    gpus = [mig_gpu(0, SEVEN)]
    node_id, session = _node(api, gpus, {"mode": "dynamic", "settle_seconds": 600})
    big = api.submit(name="big", resources={"mig": "7g.80gb"})
    api.run_task("mig_planning")
    [layout] = api.heartbeat(session)["mig_layouts"]
    applied = [mig_gpu(0, [("7g.80gb", 0, 8)])]
    event = {"gpu_uuid": gpus[0]["uuid"], "plan": layout["plan"], "ok": True}
    api.heartbeat(session, gpus=applied, mig_events=[event])
    api.post(f"/api/v1/jobs/{big['id']}/cancel")
    api.submit(name="nb", resources={"mig": "1g.10gb"})
    assert api.run_task("mig_planning")["planned"] == 0
    clock.advance(601)
    api.heartbeat(session)
    assert api.run_task("mig_planning")["planned"] == 1


def test_an_unanswered_target_blocks_its_gpu_after_the_timeout(api, clock):
    gpus = [mig_gpu(0, SEVEN)]
    node_id, session = _node(api, gpus)
    api.submit(name="big", resources={"mig": "7g.80gb"})
    api.run_task("mig_planning")
    clock.advance(601)
    api.heartbeat(session)  # an old agent: it ignores mig_layouts
    assert api.run_task("mig_planning")["expired"] == 1
    assert "did not apply" in api.node(node_id)["gpus"][0]["mig_blocked"]


def test_a_fixed_fleet_is_never_repartitioned(api):
    node_id, session = _node(api, [mig_gpu(0, SEVEN)], {"mode": "fixed"})
    api.submit(name="big", resources={"mig": "7g.80gb"})
    assert api.run_task("mig_planning")["planned"] == 0


def test_a_pending_target_counts_as_the_slices_it_will_offer(api):
    gpus = [mig_gpu(0, SEVEN), mig_gpu(1, SEVEN)]
    node_id, session = _node(api, gpus)
    api.submit(name="big", resources={"mig": "7g.80gb"})
    assert api.run_task("mig_planning")["planned"] == 1
    # The agent has not answered yet: the same demand repartitions no second GPU.
    assert api.run_task("mig_planning")["planned"] == 0
    api.submit(name="big-2", resources={"mig": "7g.80gb"})
    assert api.run_task("mig_planning")["planned"] == 1


def test_a_job_naming_a_fleet_repartitions_only_that_fleets_gpus(api):
    api.create_fleet("dyn-a", mig={"mode": "dynamic"})
    api.create_fleet("dyn-b", mig={"mode": "dynamic"})
    nodes = {}
    for fleet in ("dyn-a", "dyn-b"):
        gpus = [mig_gpu(0, SEVEN)]
        reg = api.register(
            api.create_join_token(fleet), machine_id=fleet, hostname=fleet, gpus=gpus
        )
        api.heartbeat(reg["session_token"], gpus=gpus)
        nodes[fleet] = reg
    api.submit(name="big", resources={"mig": "7g.80gb"}, node_selector={"fleet": "dyn-b"})
    assert api.run_task("mig_planning")["planned"] == 1
    assert "mig_layouts" not in api.heartbeat(nodes["dyn-a"]["session_token"])
    assert len(api.heartbeat(nodes["dyn-b"]["session_token"])["mig_layouts"]) == 1


def test_a_job_naming_no_fleet_repartitions_one_gpu_across_dynamic_fleets(api):
    sessions = {}
    for fleet in ("dyn-a", "dyn-b"):
        api.create_fleet(fleet, mig={"mode": "dynamic"})
        gpus = [mig_gpu(0, SEVEN)]
        reg = api.register(
            api.create_join_token(fleet), machine_id=fleet, hostname=fleet, gpus=gpus
        )
        api.heartbeat(reg["session_token"], gpus=gpus)
        sessions[fleet] = reg["session_token"]
    api.submit(name="big", resources={"mig": "7g.80gb"})
    assert api.run_task("mig_planning")["planned"] == 1
    told = [len(api.heartbeat(s).get("mig_layouts", [])) for s in sessions.values()]
    assert sorted(told) == [0, 1]


def test_a_result_with_a_number_for_ok_is_refused_in_the_error_envelope(api):
    gpus = [mig_gpu(0, SEVEN)]
    _node_id, session = _node(api, gpus)
    event = {"gpu_uuid": gpus[0]["uuid"], "plan": "p1", "ok": True, "busy": 0}
    body = api.heartbeat(session, expect=400, mig_events=[event])
    assert body["error"]["code"] == "invalid_request" and "true or false" in str(body)
