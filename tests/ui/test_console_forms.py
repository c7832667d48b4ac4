"""The console's create forms through Flask's test client: deploy an instance and submit a job with
the API's own schemas and services (the same errors, beside their fields), roles as the API's,
CSRF."""

import re

from tests.conftest import gpus
from tests.ui.conftest import UiClient, enrol

H100 = gpus(1)[0]["model"]


def field_error(page, name):
    match = re.search(
        rf'<span class="field-error" id="err-{name}" role="alert">(.*?)</span>', page, re.S
    )
    return match.group(1) if match else None


def deploy_form(**fields):
    form = {
        "name": "nb",
        "gpus": "1",
        "command": "python3 -m http.server 8888",
        "ports": "8888/http, 22/tcp",
        "volume_gib": "2",
        "volume_mount_path": "/data",
        "env_name": ["HF_TOKEN", ""],
        "env_value": ["hf_secret", ""],
        "priority_class": "on-demand",
        "restart": "always",
    }
    form.update(fields)
    return form


def test_deploy_form_creates_the_instance_the_api_would(admin_ui, api):
    enrol(api, gpu_count=2)
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.5, "spot_min_bid": 0.8})
    page = admin_ui.text("/ui/instances/new")
    assert (
        '<label for="i-name">Name</label>' in page
        and '<label for="i-gpu-type">GPU type</label>' in page
    )
    assert f"{H100} · 2 of 2 free · 2.50/GPU-h · spot from 0.8" in page
    assert "Minimum bid per GPU-hour: " in page and 'type="password"' in page
    resp = admin_ui.post(
        "/ui/instances/new", deploy_form(gpu_type=H100, idle_below="5", idle_minutes="30")
    )
    assert resp.status_code == 302, resp.get_data(as_text=True)
    inst_id = resp.headers["Location"].rsplit("/", 1)[1]
    inst = api.get(f"/api/v1/instances/{inst_id}").get_json()
    spec = inst["spec"]
    assert spec["command"] == ["python3", "-m", "http.server", "8888"] and spec["env"] == {
        "HF_TOKEN": "hf_secret"
    }
    assert spec["ports"] == [{"port": 8888, "protocol": "http"}, {"port": 22, "protocol": "tcp"}]
    assert spec["volume_bytes"] == 2 * 2**30 and spec["volume_mount_path"] == "/data"
    assert spec["resources"]["gpu_types"] == [H100] and spec["restart"] == "always"
    assert spec["idle_stop"] == {"gpu_util_below_percent": 5.0, "for_seconds": 1800}
    shown = admin_ui.text(f"/ui/instances/{inst_id}")
    assert "created: this page follows it until it runs" in shown
    assert "hf_secret" not in shown  # env values are masked on its page


def test_deploy_form_shows_the_apis_errors_beside_their_fields(admin_ui, api):
    enrol(api, gpu_count=2)
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"spot_min_bid": 0.8})
    admin_ui.get("/ui/instances/new")
    refused = admin_ui.post(
        "/ui/instances/new",
        deploy_form(
            ports="abc/http", gpus="-1", command="", image="", env_name=["FLEET_X"], env_value=["1"]
        ),
    )
    page = refused.get_data(as_text=True)
    assert refused.status_code == 400
    assert "valid integer" in field_error(page, "ports") and field_error(page, "gpus")
    assert (
        'id="i-ports" name="ports" class="mono" placeholder="8888/http, 22/tcp" value="abc/http" '
        "aria-invalid" in page
    )
    # The schema's own message for a missing command, as the API gives it.
    api_answer = api.post(
        "/api/v1/instances", {"name": "x", "command": [], "resources": {"gpus": 1}}
    ).get_json()
    no_command = admin_ui.post("/ui/instances/new", deploy_form(command="", image=""))
    assert field_error(no_command.get_data(as_text=True), "command") == " ".join(
        api_answer["error"]["details"]["fields"]["json"]["command"]
    )
    # The service's own refusal (the bid rules) lands beside the bid, in the API's words.
    low = admin_ui.post("/ui/instances/new", deploy_form(priority_class="spot", bid="0.1"))
    assert (
        low.status_code == 400 and field_error(low.get_data(as_text=True), "bid") == "at least 0.8"
    )
    assert api.get("/api/v1/instances").get_json()["items"] == []  # nothing stored
    ok = admin_ui.post("/ui/instances/new", deploy_form())
    assert ok.status_code == 302
    taken = admin_ui.post("/ui/instances/new", deploy_form())
    assert taken.status_code == 400 and "is taken by instance" in field_error(
        taken.get_data(as_text=True), "name"
    )


def test_job_form_checks_the_fit_then_submits_and_the_spec_box_shows_schema_errors(admin_ui, api):
    enrol(api, gpu_count=2)
    form = {
        "mode": "fields",
        "name": "train",
        "command": "python train.py",
        "gpus": "4",
        "num_nodes": "1",
        "priority_class": "on-demand",
    }
    admin_ui.get("/ui/jobs/new")
    check = admin_ui.post("/ui/jobs/new", dict(form, action="check"))
    page = check.get_data(as_text=True)
    assert check.status_code == 200 and 'id="never-fits"' in page and 'id="fits-not-now"' in page
    assert api.get("/api/v1/jobs").get_json()["items"] == []  # a check submits nothing
    partial = admin_ui.post(
        "/ui/jobs/new", dict(form, gpus="1", action="check"), headers={"HX-Request": "true"}
    )
    assert partial.get_data(as_text=True).startswith(
        '<div id="job-fit"'
    ) and "It fits now" in partial.get_data(as_text=True)
    submitted = admin_ui.post("/ui/jobs/new", dict(form, gpus="1", num_nodes="1", action="submit"))
    assert submitted.status_code == 302
    job = api.get("/api/v1/jobs").get_json()["items"][0]
    assert job["name"] == "train" and job["spec"]["command"] == ["python", "train.py"]
    bad = admin_ui.post(
        "/ui/jobs/new",
        {
            "mode": "spec",
            "action": "submit",
            "spec": "name: t\ncommand: [x]\nresources:\n  gpus: lots\n",
        },
    )
    text = bad.get_data(as_text=True)
    assert bad.status_code == 400 and re.search(
        r'<ul class="field-error" id="err-spec" role="alert"><li>'
        r"resources\.gpus: [^<]+</li>",
        text,
    )
    broken = admin_ui.post(
        "/ui/jobs/new", {"mode": "spec", "action": "submit", "spec": "name: [unclosed"}
    )
    assert broken.status_code == 400 and "not YAML or JSON: line 1" in broken.get_data(as_text=True)
    gang = admin_ui.post(
        "/ui/jobs/new",
        {
            "mode": "spec",
            "action": "submit",
            "spec": '{"name": "gang", "command": ["x"], "num_nodes": 2}',
        },
    )
    assert gang.status_code == 302
    assert api.get("/api/v1/jobs?name=gang").get_json()["items"][0]["spec"]["num_nodes"] == 2


def test_a_submitter_deploys_its_own_but_neither_sees_anothers_nor_the_admin_pages(signed_in, api):
    enrol(api, gpu_count=2)
    alice, bob = signed_in("submitter", "alice"), signed_in("submitter", "bob")
    alice.get("/ui/instances/new")
    assert alice.post("/ui/instances/new", deploy_form()).status_code == 302
    mine = alice.text("/ui/instances")
    inst_id = re.search(r'data-instance="([0-9a-f]{20})"', mine).group(1)
    assert bob.get(f"/ui/instances/{inst_id}").status_code == 404
    assert inst_id not in bob.text("/ui/instances")
    for path in ("/ui/api-tokens", "/ui/join-tokens", "/ui/maintenance"):
        assert bob.get(path).status_code == 403, path
    assert (
        bob.post("/ui/instances/new", deploy_form(), csrf=False).status_code == 400
    )  # no CSRF token


def test_metrics_tokens_cannot_open_the_forms(signed_in):
    reader = signed_in("metrics")
    assert reader.get("/ui/instances/new").status_code == 403
    assert reader.get("/ui/jobs/new").status_code == 403


def test_the_overview_queued_card_equals_the_sum_of_its_series_rows(admin_ui, api):
    enrol(api, gpu_count=2)
    api.submit(
        name="any-model", command=["x"], resources={"gpus": 3}
    )  # accepts any model: a row of its own
    api.submit(name="h100", command=["x"], resources={"gpus": 4, "gpu_types": [H100]})
    api.submit(name="unknown", command=["x"], resources={"gpus": 1, "gpu_types": ["NVIDIA B200"]})
    page = admin_ui.text("/ui/")
    card = float(re.search(r'<dd id="gpu-queued">([^<]+)</dd>', page).group(1))
    rows = [float(v) for v in re.findall(r'<td class="n" data-k="queued">([^<]+)</td>', page)]
    status = api.get("/api/v1/cluster/status").get_json()["gpu"]
    assert card == status["queued"] == sum(rows) == 8
    assert len(rows) == len(status["series"]) and 'data-series="any"' in page


def test_lists_filter_by_fleet_and_by_a_part_of_the_name(admin_ui, api):
    _, session = enrol(api, fleet="gpu-a", gpu_count=2)
    placed = api.submit(name="Train-LLM", command=["x"], resources={"gpus": 1})
    api.start_task(session)
    waiting = api.submit(name="sweep_50%", command=["x"], resources={"gpus": 64})
    jobs_in_a = admin_ui.text("/ui/jobs?state=any&fleet=gpu-a")
    assert (
        f'data-job="{placed["id"]}"' in jobs_in_a and f'data-job="{waiting["id"]}"' not in jobs_in_a
    )
    assert f'data-job="{placed["id"]}"' not in admin_ui.text("/ui/jobs?state=any&fleet=other")
    by_name = admin_ui.text("/ui/jobs?state=any&name=llm")
    assert f'data-job="{placed["id"]}"' in by_name and f'data-job="{waiting["id"]}"' not in by_name
    literal = admin_ui.text(
        "/ui/jobs?state=any&name=_50%25"
    )  # LIKE's wildcards are plain characters
    assert f'data-job="{waiting["id"]}"' in literal and f'data-job="{placed["id"]}"' not in literal
    inst = api.post(
        "/api/v1/instances", {"name": "Notebook", "command": ["x"], "resources": {"gpus": 1}}
    ).get_json()
    assert inst["node_id"]
    assert f'data-instance="{inst["id"]}"' in admin_ui.text("/ui/instances?fleet=gpu-a&name=BOOK")
    assert f'data-instance="{inst["id"]}"' not in admin_ui.text("/ui/instances?fleet=other")
    assert f'data-instance="{inst["id"]}"' not in admin_ui.text("/ui/instances?name=train")


def test_a_submitter_names_only_its_own_team_in_the_job_form(app, api):
    token = api.post(
        "/api/v1/tokens", {"name": "carol", "role": "submitter", "team": "ml"}
    ).get_json()["token"]
    carol = UiClient(app)
    carol.login(token)
    carol.get("/ui/jobs/new")
    form = {
        "mode": "fields",
        "name": "t",
        "command": "x",
        "gpus": "0",
        "num_nodes": "1",
        "action": "submit",
    }
    other = carol.post("/ui/jobs/new", dict(form, team="vision"))
    assert other.status_code == 400
    assert (
        field_error(other.get_data(as_text=True), "team")
        == "this token submits for team ml, not vision"
    )
    assert carol.post("/ui/jobs/new", form).status_code == 302
    reserved = carol.post("/ui/jobs/new", dict(form, name="new"))
    assert reserved.status_code == 400 and "is reserved" in field_error(
        reserved.get_data(as_text=True), "name"
    )
