"""Observability: /metrics agrees with cluster status, DCGM-named GPU gauges, history, storage,
gc."""

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import gpus


def _families(api):
    resp = api.get("/metrics")
    assert resp.status_code == 200 and resp.content_type.startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(resp.get_data(as_text=True))}


def _enrol(api, name="n1", count=2):
    reported = gpus(count)
    for g in reported:
        g["uuid"] = f"{name}-{g['uuid']}"
    reg = api.register(
        api.create_join_token("gpu-a"), machine_id=name, hostname=name, gpus=reported
    )
    return reg["node_id"], reg["session_token"], reported


def _readings(reported, util):
    return {
        "gpus": {
            g["uuid"]: {
                "utilization_percent": util,
                "memory_used_bytes": 2**30,
                "temperature_c": 55,
                "power_w": 300.5,
            }
            for g in reported
        }
    }


def test_metrics_parse_and_gpu_totals_equal_cluster_status(api):
    api.create_fleet("gpu-a")
    node_id, session, reported = _enrol(api)
    api.heartbeat(session, metrics=_readings(reported, 87))
    _enrol(api, "n2", 4)
    api.submit(resources={"gpus": 1})
    families = _families(api)
    status = api.get("/api/v1/cluster/status").get_json()["gpu"]
    by_state = {}
    for sample in families["fleetd_gpus"].samples:
        by_state[sample.labels["state"]] = by_state.get(sample.labels["state"], 0) + sample.value
    assert by_state == {k: status[k] for k in ("total", "used", "free", "blocked")}
    nodes = {s.labels["status"]: s.value for s in families["fleetd_nodes"].samples}
    assert nodes == {"ready": 1, "pending": 1}
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert {(s.labels["UUID"], s.labels["Hostname"], s.labels["gpu"], s.value) for s in util} == {
        (g["uuid"], "n1", str(g["index"]), 87.0) for g in reported
    }
    assert (
        families["DCGM_FI_DEV_GPU_UTIL"].samples[0].labels["modelName"] == "NVIDIA H100 80GB HBM3"
    )
    assert families["DCGM_FI_DEV_FB_USED"].samples[0].value == 1024.0
    assert {s.labels["state"]: s.value for s in families["fleetd_jobs"].samples}["running"] == 1
    latency = [
        s
        for s in families["fleetd_http_request_duration_seconds"].samples
        if s.name.endswith("_count") and s.labels["route"] == "/api/v1/agent/heartbeat"
    ]
    assert latency and latency[0].value == 1
    assert families["fleetd_heartbeats"].samples[0].value == 1


def test_history_keeps_samples_for_the_window_asked_and_at_most_a_day(api, clock):
    api.create_fleet("gpu-a")
    _, session, reported = _enrol(api)
    for util in (10, 20, 30):
        api.heartbeat(session, metrics=_readings(reported, util))
        api.run_task("metrics_sampler")
        clock.advance(600)
    recent = api.get("/api/v1/metrics/history?minutes=15").get_json()
    assert [s["gpu_util_percent"] for s in recent["samples"]] == [30.0]
    day = api.get("/api/v1/metrics/history?minutes=1440").get_json()
    assert [s["gpu_util_percent"] for s in day["samples"]] == [10.0, 20.0, 30.0]
    assert len(day["gpus"]) == 2 and [
        s["utilization_percent"] for s in day["gpus"][0]["samples"]
    ] == [10, 20, 30]
    assert api.get("/api/v1/metrics/history?minutes=1441").status_code == 400
    clock.advance(86400 - 1200)  # the first sample is now older than the 24 h retention
    assert api.run_task("gc")["cluster_samples"] == 1
    assert len(api.get("/api/v1/metrics/history?minutes=1440").get_json()["samples"]) == 2


def test_storage_is_measured_and_goes_stale(api, clock):
    status = api.get("/api/v1/cluster/status").get_json()
    assert status["storage"]["stale"] is True and status["storage"]["measured_at"] is None
    api.run_task("storage")
    storage = api.get("/api/v1/cluster/status").get_json()["storage"]
    assert (
        storage["stale"] is False
        and storage["database_bytes"] > 0
        and storage["disk_total_bytes"] > 0
    )
    assert storage["watermark_percent"] == 85.0
    clock.advance(601)
    assert api.get("/api/v1/cluster/status").get_json()["storage"]["stale"] is True


def test_gc_dry_run_counts_and_real_run_removes_old_jobs_and_orphan_artifacts(api, clock):
    api.create_fleet("gpu-a")
    _, session, _ = _enrol(api)
    api.heartbeat(session)
    sha = api.call(
        "PUT", "/api/v1/artifacts", data=b"data", headers={"X-Artifact-Name": "d"}
    ).get_json()["sha256"]
    old = api.submit(name="old", artifacts=[{"sha256": sha, "path": "d"}])
    assignment = api.start_task(session)
    api.task_call(session, assignment, "logs", lines=[["stdout", "hello"]])
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    clock.advance(3 * 86400)
    api.heartbeat(session)
    recent = api.submit(name="recent")
    body = {"older_than_seconds": 86400, "delete_jobs": True, "dry_run": True}
    dry = api.post("/api/v1/admin/gc", body).get_json()
    assert (dry["jobs"], dry["log_lines"], dry["artifacts"], dry["dry_run"]) == (1, 1, 1, True)
    assert api.get(f"/api/v1/jobs/{old['id']}").status_code == 200
    done = api.post("/api/v1/admin/gc", dict(body, dry_run=False)).get_json()
    assert done["jobs"] == 1 and done["tasks"] == 1
    assert api.get(f"/api/v1/jobs/{old['id']}").status_code == 404
    assert api.get(f"/api/v1/jobs/{recent['id']}").status_code == 200
    assert api.get(f"/api/v1/artifacts/{sha}").status_code == 404


def test_a_sample_of_many_gpus_is_written_in_chunks_with_the_loop_given_away_between(
    api, monkeypatch
):
    from fleetd.models import GpuSample
    from fleetd.services.fleet_ops import metrics

    api.create_fleet("gpu-a")
    for name in ("n1", "n2"):
        _, session, reported = _enrol(api, name, 4)
        api.heartbeat(session, metrics=_readings(reported, 50))
    rt = api.app.extensions["fleetd"]
    monkeypatch.setattr(metrics, "SAMPLE_ROWS_PER_TRANSACTION", 3)
    written = []

    def pause():  # as the event loop would; what came before it is committed
        with api.app.app_context():
            written.append(GpuSample.select().count())

    rt.pause = pause
    assert api.run_task("metrics_sampler") == {"cluster": 1, "gpus": 8}
    assert written == [3, 6]  # 3 + 3 + 2 rows, a pause before each chunk after the first
    day = api.get("/api/v1/metrics/history?minutes=60").get_json()
    assert len(day["gpus"]) == 8 and all(
        g["samples"][0]["utilization_percent"] == 50 for g in day["gpus"]
    )


def test_held_gpus_are_sampled_every_time_and_idle_ones_in_turn_past_the_bound(make_app, clock):
    from fleetd.models import ClusterSample, GpuSample
    from tests.conftest import admin_client

    app = make_app(metrics_idle_gpu_samples_max=3)
    api = admin_client(app, clock)
    api.create_fleet("gpu-a")
    sessions = {}
    for name in ("n1", "n2"):
        _, session, reported = _enrol(api, name, 4)
        sessions[name] = (session, reported)
    for session, reported in sessions.values():
        api.heartbeat(session, metrics=_readings(reported, 40))
    job = api.submit(resources={"gpus": 1})
    [held] = [g for t in api.job(job["id"])["tasks"] for g in t["gpus"]]  # one GPU's uuid
    seen = []
    for _ in range(3):
        assert api.run_task("metrics_sampler")["gpus"] == 4  # the held one and 3 idle ones
        clock.advance(60)
    with app.app_context():
        for at in sorted({s.at for s in GpuSample.select()}):
            seen.append({s.uuid for s in GpuSample.select().where(GpuSample.at == at)})
        utils = [s.gpu_util_percent for s in ClusterSample.select()]
    assert len(seen) == 3 and all(held in sample for sample in seen)
    every = {g["uuid"] for _, reported in sessions.values() for g in reported}
    assert set().union(*seen) == every  # 7 idle GPUs, 3 a sample: each in its turn
    assert utils == [40.0, 40.0, 40.0]  # the cluster's mean is over every GPU
