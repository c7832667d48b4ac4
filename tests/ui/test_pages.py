"""UI pages through Flask's test client: the same numbers and actions as the API, readable
errors."""

import datetime as dt
import re

from fleetd.ui.charts import line_chart
from tests.ui.conftest import enrol
from tests.ui.test_console_forms import field_error


def _number(page, element_id):
    match = re.search(rf'id="{element_id}">([^<]+)<', page)
    assert match, element_id
    return match.group(1)


# ---------------------------------------------------------------- overview


def test_overview_numbers_equal_cluster_status_with_blocked_and_queued_gpus(admin_ui, api):
    a, _ = enrol(api, name="a", gpu_count=4)
    enrol(api, name="b", gpu_count=2)
    api.post(f"/api/v1/nodes/{a}/cordon")
    api.submit(name="waits", resources={"gpus": 8})
    api.submit(name="runs", resources={"gpus": 1})
    status = api.get("/api/v1/cluster/status").get_json()["gpu"]
    page = admin_ui.text("/ui/")
    for key in ("total", "used", "free", "blocked"):
        assert _number(page, f"gpu-{key}") == str(status[key]), key
    assert _number(page, "gpu-queued") == "8"
    assert status["blocked"] == 4 and status["used"] == 1 and status["queued"] == 8
    series = status["series"][0]
    row = re.search(rf'data-series="{series["id"]}">(.*?)</tr>', page, re.S).group(1)
    assert re.findall(r'data-k="(\w+)">([^<]+)<', row) == [
        (k, str(series[k]).removesuffix(".0"))
        for k in ("total", "used", "free", "blocked", "queued")
    ]
    assert "4 NVIDIA H100 80GB HBM3 GPUs</strong>: node cordoned by an admin." in page
    assert 'data-status="cordoned">1<' in page and 'data-status="ready">1<' in page
    partial = admin_ui.text("/ui/?partial=capacity")
    assert partial.startswith('\n<div id="capacity"') or partial.lstrip().startswith(
        '<div id="capacity"'
    )
    assert "<html" not in partial


def test_overview_shows_next_open_at_as_a_time_element_for_the_readers_zone(admin_ui, api, clock):
    enrol(api, gpu_count=1)
    # Open only 01:00-02:00 UTC; the clock says 12:00, so the window opens tomorrow at 01:00.
    resp = api.patch(
        "/api/v1/fleets/gpu-a",
        {"availability": {"timezone": "UTC", "windows": [{"start": "01:00", "end": "02:00"}]}},
    )
    assert resp.status_code == 200, resp.get_json()
    notes = api.get("/api/v1/cluster/status").get_json()["gpu"]["blocked_notes"]
    assert notes[0]["code"] == "outside_window"
    page = admin_ui.text("/ui/")
    assert f'<time datetime="{notes[0]["next_open_at"]}" data-local>' in page
    assert "fleet outside its availability window; open again at" in page


def test_overview_draws_the_24h_history_from_the_metrics_samples(admin_ui, api):
    enrol(api, gpu_count=2)
    api.submit(name="runs", resources={"gpus": 1})
    assert "no-history" in admin_ui.text("/ui/")
    api.run_task("metrics_sampler")
    page = admin_ui.text("/ui/")
    assert "no-history" not in page
    assert page.count('<svg class="chart"') == 2
    assert "1 running, 0 waiting, 1 of 2 GPUs used" in page


def test_line_chart_breaks_lines_at_missing_values_and_clamps_to_the_window():
    end = dt.datetime(2026, 1, 2, 0, 0)
    start = end - dt.timedelta(hours=24)
    samples = [
        {"at": "2026-01-01T12:00:00.000Z", "v": 50.0},
        {"at": "2026-01-01T13:00:00.000Z", "v": None},
        {"at": "2026-01-01T14:00:00.000Z", "v": 100.0},
        {"at": "2026-01-01T15:00:00.000Z", "v": 0.0},
    ]
    svg = str(
        line_chart(samples, [("v", "s-util", "util")], start, end, y_max=100, unit="%", title="t")
    )
    assert svg.count("<circle") == 1 and svg.count("<polyline") == 1  # 50 alone, then 100 -> 0
    assert ">100%<" in svg and ">now<" in svg and ">-24h<" in svg
    many = [
        {"at": (start + dt.timedelta(seconds=10 * i)).isoformat() + "Z", "v": 100.0 * (i % 2)}
        for i in range(8640)
    ]  # a sample every 10 s for 24 h: averaged per pixel column
    dense = str(line_chart(many, [("v", "s-util", "util")], start, end, y_max=100, title="t"))
    points = re.search(r'points="([^"]+)"', dense).group(1).split()
    assert len(points) <= 720 - 44 - 10 + 1
    # 0 and 100 alternate: every column's mean is near 50 (y = 92 on this plot), never 0 or 100.
    assert all(75.6 <= float(p.split(",")[1]) <= 108.4 for p in points)
    empty = str(line_chart([], [("v", "s-util", "util")], start, end, title="<x>"))
    assert "<polyline" not in empty and "&lt;x&gt;" in empty


# ---------------------------------------------------------------- nodes


def test_node_table_filters_by_fleet_and_status(admin_ui, api):
    a, _ = enrol(api, fleet="gpu-a", name="alpha")
    enrol(api, fleet="gpu-b", name="beta")
    api.post(f"/api/v1/nodes/{a}/cordon")
    page = admin_ui.text("/ui/nodes")
    assert "alpha" in page and "beta" in page and "all healthy" in page
    only_b = admin_ui.text("/ui/nodes?fleet=gpu-b")
    assert "beta" in only_b and ">alpha<" not in only_b
    cordoned = admin_ui.text("/ui/nodes?status=cordoned")
    assert "alpha" in cordoned and ">beta<" not in cordoned
    assert admin_ui.get("/ui/nodes?status=nonsense").status_code == 400


def test_node_table_searches_hostnames_by_a_part_in_any_case(admin_ui, api):
    alpha, _ = enrol(api, fleet="gpu-a", name="rack7-alpha")
    beta, _ = enrol(api, fleet="gpu-a", name="rack9-beta")
    page = admin_ui.text("/ui/nodes?name=RACK7")
    assert f'data-node="{alpha}"' in page and f'data-node="{beta}"' not in page
    assert 'id="f-name" name="name" value="RACK7"' in page  # the filter keeps what was asked
    both = admin_ui.text("/ui/nodes?name=rack")
    assert f'data-node="{alpha}"' in both and f'data-node="{beta}"' in both
    none = admin_ui.text("/ui/nodes?name=nowhere&fleet=gpu-a")
    assert "data-node=" not in none and "No nodes match these filters." in none
    assert "data-node=" not in admin_ui.text(
        "/ui/nodes?name=%25"
    )  # a % is a character, not a wildcard
    assert admin_ui.get("/ui/nodes?name=" + "x" * 5000).status_code == 200


def test_node_page_shows_unhealthy_gpus_and_live_readings(admin_ui, api):
    api.create_fleet("gpu-a")
    from tests.conftest import gpus

    reported = gpus(2)
    reported[1] = dict(reported[1], healthy=False, health_reason="XID 79: GPU fell off the bus")
    reg = api.register(api.create_join_token("gpu-a"), gpus=reported)
    api.heartbeat(
        reg["session_token"],
        metrics={
            "gpus": {
                reported[0]["uuid"]: {
                    "utilization_percent": 87,
                    "memory_used_bytes": 10 * 2**30,
                    "temperature_c": 61,
                    "power_w": 412,
                }
            }
        },
    )
    page = admin_ui.text(f"/ui/nodes/{reg['node_id']}")
    assert "XID 79: GPU fell off the bus" in page
    assert "87%" in page and "61 °C" in page and "412 W" in page and "10.0 GiB" in page
    listing = admin_ui.text("/ui/nodes")
    assert "1 unhealthy" in listing and "GPU 1: XID 79" in listing


def test_node_page_shows_a_pending_mig_repartition_and_a_mig_block(admin_ui, api):
    from tests.support.gpus import mig_gpu

    api.create_fleet("gpu-a", mig={"mode": "dynamic"})
    seven = [("1g.10gb", slot, 1) for slot in range(7)]
    reported = [mig_gpu(0, seven), mig_gpu(1, seven)]
    reg = api.register(api.create_join_token("gpu-a"), gpus=reported)
    api.heartbeat(reg["session_token"], gpus=reported)
    api.submit(name="big", resources={"mig": "7g.80gb"})
    api.submit(name="big-2", resources={"mig": "7g.80gb"})
    api.run_task("mig_planning")
    layouts = api.heartbeat(reg["session_token"])["mig_layouts"]
    assert len(layouts) == 2
    assert admin_ui.text(f"/ui/nodes/{reg['node_id']}").count("MIG repartition pending") == 2
    failed = dict(layouts[0], ok=False, detail="Insufficient Resources")
    del failed["instances"]
    api.heartbeat(reg["session_token"], mig_events=[failed])
    page = admin_ui.text(f"/ui/nodes/{reg['node_id']}")
    assert "MIG blocked" in page and "Insufficient Resources" in page
    assert page.count("MIG repartition pending") == 1


def test_node_page_draws_the_gpu_topology_and_the_nodes_place_in_the_network(admin_ui, api):
    from tests.support.gpus import topology_x3

    api.create_fleet("gpu-a")
    labels = {"topology.fleetd/block": "b07", "topology.fleetd/leaf": "leaf-3"}
    reg = api.register(
        api.create_join_token("gpu-a"), gpu_count=3, topology=topology_x3(), labels=labels
    )
    page = admin_ui.text(f"/ui/nodes/{reg['node_id']}")
    table = re.search(r'<table id="node-topology".*?</table>', page, re.S).group(0)
    rows = [re.findall(r"<t[hd][^>]*>([^<]*)</t[hd]>", row) for row in table.split("<tr>")[1:]]
    # The agent listed GPU 2 first; the matrix names GPUs by their index, NVLinks by their count.
    assert rows == [
        ["", "GPU2", "GPU0", "GPU1", "NIC0"],
        ["GPU2", "X", "SYS", "SYS", "SYS"],
        ["GPU0", "SYS", "X", "NV12", "PIX"],
        ["GPU1", "SYS", "NV12", "X", "PHB"],
    ]
    assert "mlx5_0" in page and 'block <span class="mono">b07</span>' in page
    bare = api.register(api.create_join_token("gpu-a"), machine_id="m2", hostname="h2")
    assert 'id="topology-h"' not in admin_ui.text(f"/ui/nodes/{bare['node_id']}")
    # A two-GPU job on it gets the NVLinked pair, and its page says how they are linked.
    api.heartbeat(reg["session_token"])
    job = api.submit(name="pair", resources={"gpus": 2})  # the other node never heartbeat
    tasks = re.search(
        r'<table id="tasks">.*?</table>', admin_ui.text(f"/ui/jobs/{job['id']}"), re.S
    )
    assert "linked by nvlink" in tasks.group(0)


def test_drain_from_the_node_page_asks_for_confirmation_then_drains(admin_ui, api):
    node_id, _ = enrol(api)
    page = admin_ui.text(f"/ui/nodes/{node_id}")
    assert 'name="reason"' in page
    confirm = admin_ui.post(
        f"/ui/nodes/{node_id}/drain", {"reason": "BIOS update", "deadline_minutes": "10"}
    )
    assert confirm.status_code == 200 and "Drain gpu-host-1?" in confirm.get_data(as_text=True)
    assert api.node(node_id)["status"] == "ready"  # nothing happens before the confirmation
    done = admin_ui.post(
        f"/ui/nodes/{node_id}/drain",
        {"reason": "BIOS update", "deadline_minutes": "10", "confirm": "yes"},
    )
    assert done.status_code == 302
    node = api.node(node_id)
    assert node["status"] == "drained" and node["drain"]["reason"] == "BIOS update"
    deadline = dt.datetime.fromisoformat(node["drain"]["deadline"].rstrip("Z"))
    started = dt.datetime.fromisoformat(node["drain"]["started_at"].rstrip("Z"))
    assert deadline - started == dt.timedelta(minutes=10)
    assert "gpu-host-1 is now drained." in admin_ui.text(f"/ui/nodes/{node_id}")
    admin_ui.post(f"/ui/nodes/{node_id}/undrain", {"confirm": "yes"})
    assert api.node(node_id)["status"] == "ready"


def test_drain_form_errors_stand_beside_their_fields_on_the_node_page(admin_ui, api):
    node_id, _ = enrol(api)
    admin_ui.get(f"/ui/nodes/{node_id}")
    for form, field, message in [
        ({"reason": "", "deadline_minutes": "5"}, "reason", "required"),
        ({"reason": "x", "deadline_minutes": "soon"}, "deadline_minutes", "integer"),
        ({"reason": "x", "deadline_minutes": "-1"}, "deadline_minutes", "0"),
        ({"reason": "x" * 501}, "reason", "500"),
    ]:
        resp = admin_ui.post(f"/ui/nodes/{node_id}/drain", dict(form, confirm="yes"))
        body = resp.get_data(as_text=True)
        assert resp.status_code == 400 and message in (field_error(body, field) or ""), (form, body)
        assert (
            'id="node-facts"' in body and "Traceback" not in body
        )  # the node's own page, not an error page
        input_id = {"reason": "drain-reason", "deadline_minutes": "drain-deadline"}[field]
        tag = re.search(rf'<input id="{input_id}"[^>]*>', body).group(0)
        assert f'aria-describedby="err-{field}"' in tag and 'aria-invalid="true"' in tag
    kept = admin_ui.post(
        f"/ui/nodes/{node_id}/drain", {"reason": "BIOS <update>", "deadline_minutes": "soon"}
    )
    assert 'value="BIOS &lt;update&gt;"' in kept.get_data(
        as_text=True
    )  # what was typed stays, escaped
    assert api.node(node_id)["status"] == "ready"


def test_impossible_actions_show_the_services_message(admin_ui, api):
    node_id, _ = enrol(api)
    admin_ui.get(f"/ui/nodes/{node_id}")
    resp = admin_ui.post(f"/ui/nodes/{node_id}/undrain", {"confirm": "yes"})
    assert resp.status_code == 409
    assert "is ready, not draining or drained" in resp.get_data(as_text=True)
    assert admin_ui.get("/ui/nodes/nope").status_code == 404


def test_node_page_lists_its_running_tasks_for_admins_only(admin_ui, api, signed_in):
    node_id, session = enrol(api)
    job = api.submit(name="train", resources={"gpus": 1})
    api.start_task(session)
    page = admin_ui.text(f"/ui/nodes/{node_id}")
    tasks = re.search(r'<table id="node-tasks">(.*?)</table>', page, re.S).group(1)
    assert job["id"] in tasks and "running" in tasks
    assert "node-tasks" not in signed_in("submitter").text(f"/ui/nodes/{node_id}")


def test_revoke_with_confirmation(admin_ui, api):
    node_id, session = enrol(api)
    admin_ui.get(f"/ui/nodes/{node_id}")
    assert "session token stops working" in admin_ui.post(f"/ui/nodes/{node_id}/revoke").get_data(
        as_text=True
    )
    assert admin_ui.post(f"/ui/nodes/{node_id}/revoke", {"confirm": "yes"}).status_code == 302
    assert api.node(node_id)["status"] == "revoked"
    api.heartbeat(session, expect=200)  # a revoked node still hears that it is revoked
    page = admin_ui.text(f"/ui/nodes/{node_id}")
    assert "Revoke…" not in page and "Drain…" not in page


# ---------------------------------------------------------------- jobs


def _running_job(api, node_session):
    job = api.submit(
        name="train", command=["python", "train.py"], resources={"gpus": 1}, team="vision"
    )
    assignment = api.start_task(node_session)
    return job, assignment


def test_job_page_shows_spec_tasks_events_and_the_log_tail_then_follows_it(admin_ui, api):
    node_id, session = enrol(api)
    job, assignment = _running_job(api, session)
    api.task_call(
        session, assignment, "logs", lines=[["stdout", "epoch 1 <loss 0.9>"], ["stderr", "warn"]]
    )
    page = admin_ui.text(f"/ui/jobs/{job['id']}")
    assert "epoch 1 &lt;loss 0.9&gt;" in page and "train.py" in page and "gpu-host-1" in page
    assert "job.submitted" in page and assignment["gpus"][0]["uuid"] in page
    poll_url = re.search(r'id="log-poller" hx-get="([^"]+)"', page).group(1).replace("&amp;", "&")
    api.task_call(session, assignment, "logs", lines=[["stdout", "epoch 2"]])
    partial = admin_ui.text(poll_url)
    assert (
        "epoch 2" in partial
        and "epoch 1" not in partial
        and 'hx-swap-oob="beforeend:#log-lines"' in partial
    )
    next_url = re.search(r'hx-get="([^"]+)"', partial).group(1).replace("&amp;", "&")
    assert "epoch 2" not in admin_ui.text(next_url)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    ended = admin_ui.text(next_url)
    assert "hx-get" not in ended and "the log is complete" in ended


def test_queued_job_page_explains_why_it_waits_with_the_simulation(admin_ui, api):
    enrol(api, gpu_count=2)
    job = api.submit(name="big", resources={"gpus": 4})
    page = admin_ui.text(f"/ui/jobs/{job['id']}")
    sim = api.post("/api/v1/cluster/simulate-schedule", job["spec"]).get_json()
    assert sim["schedulable"] is False
    assert 'id="simulation">It does not fit now' in page
    for detail in sim["filter_detail"]:
        assert detail["reason"] in page


def test_jobs_list_filters_by_state_owner_and_team(admin_ui, api, app):
    _, session = enrol(api, gpu_count=1)
    running, _ = _running_job(api, session)
    queued = api.submit(name="later", resources={"gpus": 1}, team="nlp")
    default = admin_ui.text("/ui/jobs")
    assert running["id"] in default and queued["id"] in default
    reason = api.get(f"/api/v1/jobs/{queued['id']}").get_json()["pending_reason"]
    assert reason and f"<td>{reason}</td>" in default
    assert running["id"] not in admin_ui.text("/ui/jobs?team=nlp")
    assert queued["id"] in admin_ui.text("/ui/jobs?team=nlp")
    assert queued["id"] not in admin_ui.text("/ui/jobs?state=running")
    assert queued["id"] not in admin_ui.text("/ui/jobs?state=any&owner=someone-else")
    assert admin_ui.get("/ui/jobs?state=bogus").status_code == 400


def test_cancel_from_the_job_page_with_confirmation(admin_ui, api):
    _, session = enrol(api)
    job, _ = _running_job(api, session)
    admin_ui.get(f"/ui/jobs/{job['id']}")
    assert "Cancel job train?" in admin_ui.post(f"/ui/jobs/{job['id']}/cancel").get_data(
        as_text=True
    )
    assert api.get(f"/api/v1/jobs/{job['id']}").get_json()["state"] == "running"
    assert admin_ui.post(f"/ui/jobs/{job['id']}/cancel", {"confirm": "yes"}).status_code == 302
    # Its process runs on until the node stops it: cancelling, then cancelled.
    assert api.get(f"/api/v1/jobs/{job['id']}").get_json()["state"] == "cancelling"
    assert api.heartbeat(
        session, tasks=[{"id": job["tasks"][0]["id"], "epoch": 1, "state": "running"}]
    )["cancel"] == [job["tasks"][0]["id"]]


def test_a_job_name_goes_to_its_job_or_lists_the_jobs_of_that_name(admin_ui, api, signed_in):
    only = api.submit(name="eval")
    resp = admin_ui.get("/ui/jobs/eval")
    assert resp.status_code == 302 and resp.headers["Location"] == f"/ui/jobs/{only['id']}"
    first, second = api.submit(name="train"), api.submit(name="train")
    page = admin_ui.text("/ui/jobs/train")
    assert "Several jobs are named train" in page
    assert re.findall(r'<tr data-match="([0-9a-f]+)">', page) == [first["id"], second["id"]]
    assert f'href="/ui/jobs/{first["id"]}"' in page
    assert admin_ui.get("/ui/jobs/nope").status_code == 404
    assert (
        signed_in("submitter").get("/ui/jobs/eval").status_code == 404
    )  # another's job, even by name


def test_a_hostname_goes_to_its_node(admin_ui, api):
    node_id, _ = enrol(api, name="gpu-host-7")
    resp = admin_ui.get("/ui/nodes/gpu-host-7")
    assert resp.status_code == 302 and resp.headers["Location"] == f"/ui/nodes/{node_id}"
    assert "gpu-host-7" in admin_ui.text(resp.headers["Location"])
    assert admin_ui.get("/ui/nodes/gpu-host-8").status_code == 404


# ---------------------------------------------------------------- tokens, maintenance, GPU types


def test_join_token_is_shown_once_and_listed_without_its_secret(admin_ui, api):
    api.create_fleet("gpu-a")
    admin_ui.get("/ui/join-tokens")
    resp = admin_ui.post(
        "/ui/join-tokens/create",
        {"fleet": "gpu-a", "ttl_seconds": "2", "max_uses": "1", "description": "rack 4"},
    )
    page = resp.get_data(as_text=True)
    token = re.search(r'id="new-token" class="mono" readonly value="(flj_[^"]+)"', page).group(1)
    assert f'FLEET_AGENT_JOIN_TOKEN={token} fleet-agent join --server http://localhost"' in page
    assert resp.headers["Cache-Control"] == "no-store"
    listed = api.get("/api/v1/fleets/gpu-a/join-tokens").get_json()["items"]
    assert listed[0]["max_uses"] == 1 and listed[0]["description"] == "rack 4"
    expires = dt.datetime.fromisoformat(listed[0]["expires_at"].rstrip("Z"))
    assert expires - dt.datetime(2026, 1, 1, 12) == dt.timedelta(hours=2)
    again = admin_ui.text("/ui/join-tokens")
    assert token not in again and token.split(".")[1] not in again and listed[0]["id"] in again
    api.register(token)  # the shown token works


def test_join_token_form_errors_are_shown_beside_the_form(admin_ui, api):
    api.create_fleet("gpu-a")
    admin_ui.get("/ui/join-tokens")
    resp = admin_ui.post(
        "/ui/join-tokens/create", {"fleet": "gpu-a", "ttl_seconds": "0", "max_uses": "zero"}
    )
    body = resp.get_data(as_text=True)
    assert resp.status_code == 400 and "err-ttl_seconds" in body and "err-max_uses" in body
    assert api.get("/api/v1/fleets/gpu-a/join-tokens").get_json()["items"] == []
    assert admin_ui.post("/ui/join-tokens/create", {"fleet": "nope"}).status_code == 404


def test_join_token_revoke(admin_ui, api):
    api.create_fleet("gpu-a")
    token = api.create_join_token("gpu-a")
    token_id = token[4:24]
    admin_ui.get("/ui/join-tokens")
    assert "Revoke join token" in admin_ui.post(f"/ui/join-tokens/{token_id}/revoke").get_data(
        as_text=True
    )
    admin_ui.post(f"/ui/join-tokens/{token_id}/revoke", {"confirm": "yes", "fleet": "gpu-a"})
    assert api.get("/api/v1/fleets/gpu-a/join-tokens").get_json()["items"][0]["revoked"] is True
    api.register(token, expect=401)


def test_api_token_create_show_once_and_revoke(admin_ui, api, app):
    admin_ui.get("/ui/api-tokens")
    bad = admin_ui.post("/ui/api-tokens/create", {"name": "", "role": "root"})
    assert (
        bad.status_code == 400
        and "err-name" in bad.get_data(as_text=True)
        and "err-role" in bad.get_data(as_text=True)
    )
    page = admin_ui.post(
        "/ui/api-tokens/create",
        {"name": "ci", "role": "submitter", "team": "vision", "expires_in_seconds": "30"},
    ).get_data(as_text=True)
    token = re.search(r'value="(fla_[^"]+)"', page).group(1)
    from tests.conftest import ApiClient

    who = ApiClient(app, token).get("/api/v1/whoami").get_json()
    assert {k: who[k] for k in ("principal", "role", "team", "node_id", "token_id")} == {
        "principal": "token:ci",
        "role": "submitter",
        "team": "vision",
        "node_id": None,
        "token_id": token[4:24],
    }
    assert token not in admin_ui.text("/ui/api-tokens")
    token_id = token[4:24]
    admin_ui.post(f"/ui/api-tokens/{token_id}/revoke", {"confirm": "yes"})
    assert ApiClient(app, token).get("/api/v1/whoami").status_code == 401


def test_revoking_your_own_token_signs_you_out(signed_in, app):
    client = signed_in("admin", name="me")
    page = client.text("/ui/api-tokens")
    own_id = re.search(r'data-token="(\w+)">\s*<td>me<', page).group(1)
    assert "you will be signed out" in client.post(f"/ui/api-tokens/{own_id}/revoke").get_data(
        as_text=True
    )
    resp = client.post(f"/ui/api-tokens/{own_id}/revoke", {"confirm": "yes"})
    assert resp.headers["Location"] == "/ui/login"
    assert client.get("/ui/").status_code == 302


def test_maintenance_lists_tasks_and_runs_one_now(admin_ui, api):
    page = admin_ui.text("/ui/maintenance")
    assert 'data-task="liveness_sweep"' in page and "not run yet" in page
    assert admin_ui.post("/ui/maintenance/liveness_sweep/run").status_code == 302
    page = admin_ui.text("/ui/maintenance")
    assert "liveness_sweep ran: ok." in page
    tasks = {t["name"]: t for t in api.get("/api/v1/admin/tasks").get_json()["items"]}
    assert tasks["liveness_sweep"]["last_status"] == "ok"
    assert admin_ui.post("/ui/maintenance/nope/run").status_code == 404


def test_gpu_types_prices_are_set_and_validated(admin_ui, api, signed_in):
    enrol(api, gpu_count=2)
    admin_ui.get("/ui/gpu-types")
    model = "NVIDIA H100 80GB HBM3"
    assert (
        admin_ui.post(
            "/ui/gpu-types/set", {"model": model, "price_per_hour": "2.5", "spot_min_bid": "0.8"}
        ).status_code
        == 302
    )
    types = api.get("/api/v1/gpu-types").get_json()["items"]
    assert types == [
        {
            "model": model,
            "display_name": "H100 80GB HBM3",
            "manufacturer": "NVIDIA",
            "memory_bytes": 80 * 2**30,
            "total": 2,
            "available": 2,
            "max_per_node": 2,
            "price_per_hour": 2.5,
            "spot_min_bid": 0.8,
        }
    ]
    bad = admin_ui.post("/ui/gpu-types/set", {"model": model, "price_per_hour": "-1"})
    assert bad.status_code == 400 and "price_per_hour" in bad.get_data(as_text=True)
    assert api.get("/api/v1/gpu-types").get_json()["items"][0]["price_per_hour"] == 2.5
    reader = signed_in("submitter")
    page = reader.text("/ui/gpu-types")
    assert "2.5" in page and "Save" not in page


def test_unexpected_errors_are_a_readable_page_without_a_traceback(admin_ui, monkeypatch):
    from fleetd.services.placement import status

    def boom(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(status, "cluster_status", boom)
    resp = admin_ui.get("/ui/")
    body = resp.get_data(as_text=True)
    assert resp.status_code == 500 and "something went wrong on the server" in body
    assert "secret internals" not in body and "Traceback" not in body


def test_pages_forbid_framing_and_inline_script(admin_ui):
    resp = admin_ui.get("/ui/")
    assert resp.headers["X-Frame-Options"] == "DENY"
    assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
    assert "<script>" not in resp.get_data(as_text=True)
    assert admin_ui.get("/ui/no/such/page").status_code == 404


def test_node_pages_tell_a_cpu_only_host_from_a_driver_error(admin_ui, api):
    cpu, cpu_session = enrol(api, name="cpu-host", gpu_count=0)
    broken, broken_session = enrol(api, name="broken-host", gpu_count=0)
    api.heartbeat(
        cpu_session,
        metrics={"devices_reason": "nvidia-ml-py is not installed (no module named pynvml)"},
    )
    api.heartbeat(
        broken_session,
        metrics={"devices_reason": "no NVIDIA driver: NVML init failed: Unknown Error"},
    )
    listing = admin_ui.text("/ui/nodes")
    assert "CPU only: nvidia-ml-py is not installed" in listing and "driver error" in listing
    assert (
        "This GPU host's driver failed: no NVIDIA driver: NVML init failed: Unknown Error"
        in admin_ui.text(f"/ui/nodes/{broken}")
    )
    assert "A CPU-only host: nvidia-ml-py is not installed" in admin_ui.text(f"/ui/nodes/{cpu}")
