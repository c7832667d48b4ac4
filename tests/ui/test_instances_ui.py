"""The Instances pages: through Flask's test client (roles, CSRF, what each page shows, every action
behind its confirmation) and in Debian's headless Chromium against a real `fleetd serve` (-m
integration), with the agent's side of a run spoken by the test."""

import os
import re

import pytest

from fleetd.ui import roles
from tests.conftest import ApiClient, gpus
from tests.fleetd.services.workloads.test_instances import create, show
from tests.support.browser import CHROMIUM
from tests.ui.conftest import UiClient, enrol
from tests.ui.test_browser import agent_call, artifacts, http, page, server, shot, sign_in  # noqa: F401
from tests.ui.test_browser import enrol as enrol_over_http
from tests.ui.test_console_forms import field_error

H100 = gpus(1)[0]["model"]


def start(api, session, ports=()):
    """The node acquires its instance run and reports it started with these (port, host port,
    protocol)."""
    assignment = api.acquire(session)
    assert assignment is not None and assignment["instance"] is not None
    api.task_call(
        session,
        assignment,
        "start",
        pid=4242,
        ports=[{"port": p, "host_port": h, "protocol": proto} for p, h, proto in ports],
    )
    return assignment


def running(api, session, **spec):
    """An instance with ports 8888 (http) and 22 (tcp) that its node started: (instance,
    assignment)."""
    spec.setdefault("ports", [{"port": 8888, "protocol": "http"}, {"port": 22, "protocol": "tcp"}])
    inst = create(api, **spec)
    assignment = start(api, session, [(8888, 40888, "http"), (22, 40022, "tcp")])
    assert show(api, inst["id"])["state"] == "running"
    return inst, assignment


def row_of(page, instance_id):
    match = re.search(rf'<tr data-instance="{instance_id}">(.*?)</tr>', page, re.S)
    return match.group(1) if match else None


# ---------------------------------------------------------------- test client


def test_the_list_shows_where_each_runs_and_why_others_wait_and_filters_by_state(admin_ui, api):
    node_id, session = enrol(api, gpu_count=2)
    up, _ = running(api, session)
    waits = create(api, name="big", resources={"gpus": 4})
    reason = show(api, waits["id"])["pending_reason"]
    assert reason
    page = admin_ui.text("/ui/instances")
    assert '<a href="/ui/instances" aria-current="page">Instances</a>' in page
    up_row, waits_row = row_of(page, up["id"]), row_of(page, waits["id"])
    http_url = api.get(f"/api/v1/instances/{up['id']}/connection?port=8888").get_json()["url"]
    assert "status-running" in up_row and f'href="/ui/nodes/{node_id}"' in up_row
    assert (
        f'<a href="{http_url}" rel="noopener noreferrer" target="_blank">{http_url}</a>' in up_row
    )  # the URL
    assert "status-pending" in waits_row and f"<td>{reason}</td>" in waits_row
    only_pending = admin_ui.text("/ui/instances?state=pending")
    assert row_of(only_pending, waits["id"]) and not row_of(only_pending, up["id"])
    only_running = admin_ui.text("/ui/instances?state=running")
    assert row_of(only_running, up["id"]) and not row_of(only_running, waits["id"])
    assert admin_ui.get("/ui/instances?state=bogus").status_code == 400
    assert api.delete(f"/api/v1/instances/{waits['id']}").status_code == 204
    assert not row_of(admin_ui.text("/ui/instances"), waits["id"])  # deleted: only when asked for
    assert row_of(admin_ui.text("/ui/instances?state=deleted"), waits["id"])


def test_the_list_filters_by_owner_and_team_within_what_the_viewer_may_see(app, admin_ui, api):
    def teammate(name, team):
        resp = api.post("/api/v1/tokens", {"name": name, "role": "submitter", "team": team})
        assert resp.status_code == 201, resp.get_json()
        return resp.get_json()["token"]

    alice_token, bob_token = teammate("alice", "vision"), teammate("bob", "nlp")
    alices = create(ApiClient(app, alice_token), name="a-nb", resources={"gpus": 4})
    bobs = create(ApiClient(app, bob_token), name="b-nb", resources={"gpus": 4})
    admins = create(api, name="admin-nb", resources={"gpus": 4})
    assert (show(api, alices["id"])["owner"], show(api, alices["id"])["team"]) == (
        "alice",
        "vision",
    )

    def shown(client, query):
        page = client.text(f"/ui/instances?{query}")
        return {i["id"] for i in (alices, bobs, admins) if row_of(page, i["id"])}

    assert shown(admin_ui, "owner=alice") == {alices["id"]}
    assert shown(admin_ui, "team=nlp") == {bobs["id"]}
    assert shown(admin_ui, "owner=alice&team=nlp") == set()  # both filters hold at once
    assert shown(admin_ui, "owner=") == {
        alices["id"],
        bobs["id"],
        admins["id"],
    }  # an empty filter is none
    assert 'id="f-owner" name="owner" value="alice"' in admin_ui.text("/ui/instances?owner=alice")
    assert 'id="f-team" name="team" value="nlp"' in admin_ui.text("/ui/instances?team=nlp")
    alice = UiClient(app)
    alice.login(alice_token)
    assert (
        shown(alice, "owner=bob") == set() and shown(alice, "team=nlp") == set()
    )  # not another's, by filter
    assert shown(alice, "team=vision") == {alices["id"]}


def test_an_instance_page_shows_its_runtime_ports_as_links_its_log_and_events(admin_ui, api, clock):
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.5})
    node_id, session = enrol(api, gpu_count=2)
    inst, assignment = running(api, session, volume_bytes=2**30)
    clock.advance(
        3725
    )  # before the heartbeat: a node's figures older than a couple of minutes are not shown
    api.heartbeat(
        session,
        tasks=[{"id": assignment["task_id"], "epoch": assignment["epoch"], "state": "running"}],
        instances=[
            {
                "task_id": assignment["task_id"],
                "epoch": assignment["epoch"],
                "uptime_seconds": 3725,
                "restarts": 3,
                "gpus": [
                    {
                        "uuid": assignment["gpus"][0]["uuid"],
                        "gpu_util_percent": 37.0,
                        "memory_util_percent": 61.2,
                    }
                ],
                "container": {"cpu_percent": 85.0, "memory_percent": 3.1},
                "volume_used_bytes": 2**29,
            }
        ],
    )
    api.task_call(
        session,
        assignment,
        "logs",
        lines=[["stdout", "serving <http> on 8888"], ["stderr", "warn"]],
    )
    page = admin_ui.text(f"/ui/instances/{inst['id']}")
    http_url = api.get(f"/api/v1/instances/{inst['id']}/connection?port=8888").get_json()["url"]
    tcp_url = api.get(f"/api/v1/instances/{inst['id']}/connection?port=22").get_json()["url"]
    assert (http_url, tcp_url) == ("http://10.0.0.1:40888/", "tcp://10.0.0.1:40022")
    ports = re.search(r'<table id="instance-ports">(.*?)</table>', page, re.S).group(1)
    assert f'<a href="{http_url}" rel="noopener noreferrer" target="_blank">{http_url}</a>' in ports
    assert f'<span class="mono">{tcp_url}</span>' in ports and f'href="{tcp_url}"' not in ports
    assert '<dd id="instance-state">running</dd>' in page
    assert f'href="/ui/nodes/{node_id}">gpu-host-1</a>' in page
    assert (
        '<dd id="runtime-uptime">1 h 02 min</dd>' in page
        and '<dd id="runtime-restarts">3</dd>' in page
    )
    assert '<dd id="runtime-container">85% CPU, 3% memory</dd>' in page
    assert '<dd id="runtime-volume">0.5 GiB of 1.0 GiB</dd>' in page
    gpu = re.search(
        rf'<tr data-gpu="{assignment["gpus"][0]["uuid"]}">(.*?)</tr>', page, re.S
    ).group(1)
    assert re.findall(r'class="n">([^<]+)<', gpu) == ["37%", "61%"]
    assert '<dd id="instance-price">2.50</dd>' in page
    assert '<dd id="instance-cost">2.59</dd>' in page  # 2.50 an hour for 3725 s
    assert "serving &lt;http&gt; on 8888" in page and 'class="l l-stderr"' in page
    events = re.search(r'<table id="instance-events">(.*?)</table>', page, re.S).group(1)
    assert events.index("starting → running") < events.index("pending → starting")  # newest first
    assert "Stop…" in page and "Delete…" in page and "Resume…" not in page


def test_the_instance_page_shows_whose_listener_each_port_has_and_withholds_a_taken_ports_url(
    admin_ui, api
):
    _, session = enrol(api, gpu_count=2)
    inst, assignment = running(api, session)
    page = admin_ui.text(f"/ui/instances/{inst['id']}")
    assert page.count('data-state="unknown"') == 2  # nothing reported yet
    api.heartbeat(
        session,
        tasks=[{"id": assignment["task_id"], "epoch": assignment["epoch"], "state": "running"}],
        instances=[
            {
                "task_id": assignment["task_id"],
                "epoch": assignment["epoch"],
                "ports": [
                    {"port": 8888, "host_port": 40888, "state": "taken_by_other_process"},
                    {"port": 22, "host_port": 40022, "state": "ok"},
                ],
            }
        ],
    )
    page = admin_ui.text(f"/ui/instances/{inst['id']}")
    taken = re.search(r'<tr data-port="8888">(.*?)</tr>', page, re.S).group(1)
    assert 'data-state="taken_by_other_process"' in taken and "another process" in taken
    assert "http://10.0.0.1:40888/" not in taken and "withheld" in taken
    ok = re.search(r'<tr data-port="22">(.*?)</tr>', page, re.S).group(1)
    assert 'data-state="ok"' in ok and "tcp://10.0.0.1:40022" in ok


def test_a_waiting_instance_says_why_and_its_ports_are_reached_once_it_runs(admin_ui, api):
    enrol(api, gpu_count=2)
    inst = create(api, resources={"gpus": 8}, ports=[{"port": 8888}])
    page = admin_ui.text(f"/ui/instances/{inst['id']}")
    reason = show(api, inst["id"])["pending_reason"]
    assert f'<dd id="pending-reason">{reason}</dd>' in page
    ports = re.search(r'<table id="instance-ports">(.*?)</table>', page, re.S).group(1)
    assert "once it runs" in ports and "href" not in ports
    assert 'id="instance-runtime"' not in page


def test_stop_resume_and_delete_each_ask_first_then_do_what_the_api_does(admin_ui, api):
    _, session = enrol(api, gpu_count=2)
    inst, assignment = running(api, session)
    iid = inst["id"]
    admin_ui.get(f"/ui/instances/{iid}")
    confirm = admin_ui.post(f"/ui/instances/{iid}/stop").get_data(as_text=True)
    assert "Stop instance nb?" in confirm and "Its volume stays on its node" in confirm
    assert show(api, iid)["state"] == "running"  # nothing happens before the confirmation
    done = admin_ui.post(f"/ui/instances/{iid}/stop", {"confirm": "yes"})
    assert done.status_code == 302 and done.headers["Location"].endswith(f"/ui/instances/{iid}")
    assert show(api, iid)["state"] == "stopping"
    assert "Instance nb is now stopping." in admin_ui.text(f"/ui/instances/{iid}")
    api.task_call(session, assignment, "finish", outcome="cancelled", exit_code=143)
    page = admin_ui.text(f"/ui/instances/{iid}")
    assert "Resume…" in page and "Stop…" not in page and 'id="resume-gpus"' in page

    for value, message in (("many", "a number"), ("1.5", "an integer from 0 to 1024")):
        resp = admin_ui.post(f"/ui/instances/{iid}/resume", {"gpus": value, "confirm": "yes"})
        body = resp.get_data(as_text=True)
        assert resp.status_code == 400 and message in (field_error(body, "gpus") or ""), value
        tag = re.search(r'<input id="resume-gpus"[^>]*>', body).group(
            0
        )  # the instance's page, the field kept
        assert (
            'aria-describedby="err-gpus"' in tag
            and f'value="{value}"' in tag
            and "Traceback" not in body
        )
    on_demand = admin_ui.post(
        f"/ui/instances/{iid}/resume", {"bid": "2", "confirm": "yes"}
    )  # the service's no
    assert on_demand.status_code == 400 and "spot only" in field_error(
        on_demand.get_data(as_text=True), "bid"
    )
    assert show(api, iid)["state"] == "stopped"
    confirm = admin_ui.post(f"/ui/instances/{iid}/resume", {"gpus": "2"}).get_data(as_text=True)
    assert (
        "Resume instance nb?" in confirm
        and '<input type="hidden" name="gpus" value="2">' in confirm
    )
    assert (
        admin_ui.post(f"/ui/instances/{iid}/resume", {"gpus": "2", "confirm": "yes"}).status_code
        == 302
    )
    resumed = show(api, iid)
    assert resumed["state"] in ("pending", "starting") and resumed["spec"]["resources"]["gpus"] == 2
    resp = admin_ui.post(f"/ui/instances/{iid}/resume", {"confirm": "yes"})
    assert (
        resp.status_code == 409
        and "only a stopped, interrupted or failed instance" in resp.get_data(as_text=True)
    )

    assert "This cannot be undone" in admin_ui.post(f"/ui/instances/{iid}/delete").get_data(
        as_text=True
    )
    done = admin_ui.post(f"/ui/instances/{iid}/delete", {"confirm": "yes"})
    assert done.status_code == 302 and done.headers["Location"].endswith("/ui/instances")
    # Its run was placed on a node that keeps its volume: deleting until that node has removed it.
    assert show(api, iid)["state"] == "deleting"
    listing = admin_ui.text("/ui/instances")
    assert "Instance nb is deleting" in listing and 'status-deleting">deleting<' in row_of(
        listing, iid
    )
    assert 'id="action-delete"' not in admin_ui.text(f"/ui/instances/{iid}")


def test_a_spot_resume_under_the_minimum_bid_is_refused_beside_the_bid_on_the_instance_page(
    admin_ui, api
):
    _, session = enrol(api, gpu_count=2)
    assert (
        api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"spot_min_bid": 0.8}).status_code == 200
    )
    inst, assignment = running(api, session, priority_class="spot", bid=1.0)
    api.post(f"/api/v1/instances/{inst['id']}/stop")
    api.task_call(session, assignment, "finish", outcome="cancelled", exit_code=143)
    admin_ui.get(f"/ui/instances/{inst['id']}")
    resp = admin_ui.post(f"/ui/instances/{inst['id']}/resume", {"bid": "0.5", "confirm": "yes"})
    body = resp.get_data(as_text=True)
    assert resp.status_code == 400 and field_error(body, "bid") == "at least 0.8"
    tag = re.search(r'<input id="resume-bid"[^>]*>', body).group(0)
    assert 'value="0.5"' in tag and 'aria-invalid="true"' in tag and 'id="action-resume"' in body
    assert (
        show(api, inst["id"])["state"] == "stopped" and show(api, inst["id"])["spec"]["bid"] == 1.0
    )


def test_an_action_without_the_csrf_token_is_refused_and_changes_nothing(admin_ui, api):
    _, session = enrol(api)
    inst, _ = running(api, session)
    for action in ("stop", "delete"):
        resp = admin_ui.post(f"/ui/instances/{inst['id']}/{action}", {"confirm": "yes"}, csrf=False)
        assert resp.status_code == 400 and "did not come from this site" in resp.get_data(
            as_text=True
        )
    assert show(api, inst["id"])["state"] == "running"


def test_a_submitter_sees_and_acts_on_only_its_own_instances(app, api, signed_in):
    _, session = enrol(api, gpu_count=1)
    alice_token, bob_token = (
        api.create_token("submitter", "alice"),
        api.create_token("submitter", "bob"),
    )
    alice_api, bob_api = ApiClient(app, alice_token), ApiClient(app, bob_token)
    alice_inst = create(alice_api, name="alice-nb", resources={"gpus": 4})
    bob_inst = create(bob_api, name="bob-nb", resources={"gpus": 4})
    admins = create(api, name="admin-nb", resources={"gpus": 4})
    alice = UiClient(app)
    alice.login(alice_token)
    page = alice.text("/ui/instances")
    assert ">Instances<" in page
    assert (
        row_of(page, alice_inst["id"])
        and not row_of(page, bob_inst["id"])
        and not row_of(page, admins["id"])
    )
    assert alice.get(f"/ui/instances/{bob_inst['id']}").status_code == 404
    for action in ("stop", "resume", "delete"):
        assert (
            alice.post(f"/ui/instances/{bob_inst['id']}/{action}", {"confirm": "yes"}).status_code
            == 404
        ), action
    assert show(bob_api, bob_inst["id"])["state"] == "pending"
    alice.get(f"/ui/instances/{alice_inst['id']}")
    assert (
        alice.post(f"/ui/instances/{alice_inst['id']}/stop", {"confirm": "yes"}).status_code == 302
    )
    assert show(alice_api, alice_inst["id"])["state"] == "stopped"
    metrics = signed_in("metrics")
    assert ">Instances<" not in metrics.text("/ui/")
    assert metrics.get("/ui/instances").status_code == 403
    assert metrics.get(f"/ui/instances/{admins['id']}").status_code == 403


def test_an_instance_name_goes_to_its_page_or_lists_the_instances_of_that_name(app, api, admin_ui):
    alice_token = api.create_token("submitter", "alice")
    alices = create(ApiClient(app, alice_token), name="web", resources={"gpus": 4})
    alice = UiClient(app)
    alice.login(alice_token)
    resp = alice.get("/ui/instances/web")
    assert resp.status_code == 302 and resp.headers["Location"] == f"/ui/instances/{alices['id']}"
    assert "web" in alice.text(resp.headers["Location"])
    mine = create(api, name="web", resources={"gpus": 4})
    page = admin_ui.text("/ui/instances/web")  # the admin sees both
    assert "Several instances are named web" in page
    assert re.findall(r'<tr data-match="([0-9a-f]+)">', page) == [alices["id"], mine["id"]]
    assert "<td>alice</td>" in page and f'href="/ui/instances/{mine["id"]}"' in page
    assert (
        alice.get("/ui/instances/web").headers["Location"] == f"/ui/instances/{alices['id']}"
    )  # hers alone
    for unknown in ("nope", mine["id"]):
        assert alice.get(f"/ui/instances/{unknown}").status_code == 404, unknown
    assert "Deploy an instance" in alice.text(
        "/ui/instances/new"
    )  # the reserved name: the deploy form


def test_bad_input_gets_a_readable_refusal_never_a_server_error(admin_ui, api):
    enrol(api)
    inst = create(api)
    for path, status in [
        ("/ui/instances?cursor=garbage", 400),
        ("/ui/instances?state=%00", 400),
        ("/ui/instances?owner=" + "o" * 5000, 200),
        ("/ui/instances/" + "x" * 3000, 404),
        ("/ui/instances/%00", 400),
        (f"/ui/instances/{inst['id']}?partial=live&actions=x", 204),
    ]:
        assert admin_ui.get(path).status_code == status, path
    admin_ui.get(f"/ui/instances/{inst['id']}")
    api.post(f"/api/v1/instances/{inst['id']}/stop")
    for form, field in [
        ({"gpus": "nan"}, "gpus"),
        ({"gpus": "1e400"}, "gpus"),
        ({"gpus": "x" * 100_000}, "gpus"),
        ({"bid": "nan"}, "bid"),
        ({"bid": "-1"}, "bid"),
    ]:
        resp = admin_ui.post(f"/ui/instances/{inst['id']}/resume", dict(form, confirm="yes"))
        body = resp.get_data(as_text=True)
        assert resp.status_code == 400 and field_error(body, field) and "Traceback" not in body, (
            form
        )
        assert len(body) < 100_000  # what was typed is kept, not all of it
    resp = admin_ui.post(f"/ui/instances/{inst['id']}/resume", {"bid": "5", "confirm": "yes"})
    assert resp.status_code == 400 and "a bid applies to spot instances only" in resp.get_data(
        as_text=True
    )
    assert show(api, inst["id"])["state"] == "stopped"


def test_instance_pages_admit_exactly_the_roles_of_their_api_routes(app):
    from fleetd.api import instances
    from fleetd.auth import allowed_roles

    def api_roles(view, method):  # the roles named, with what they imply, as the API checks them
        return frozenset(allowed_roles(getattr(view, method).required_roles, method.upper()))

    assert app.view_functions["ui.instance_list"].required_roles == api_roles(
        instances.Instances, "get"
    )
    assert app.view_functions["ui.instance_page"].required_roles == api_roles(
        instances.InstanceById, "get"
    )
    assert roles.INSTANCE_ACTIONS == {
        "stop": api_roles(instances.InstanceStop, "post"),
        "resume": api_roles(instances.InstanceResume, "post"),
        "delete": api_roles(instances.InstanceById, "delete"),
    }
    assert ("ui.instance_list", "Instances", roles.INSTANCES) in roles.NAV


def test_the_live_part_refreshes_itself_until_what_may_be_done_changes(admin_ui, api):
    _, session = enrol(api)
    inst, assignment = running(api, session)
    page = admin_ui.text(f"/ui/instances/{inst['id']}")
    poll = re.search(r'<div id="instance-live" hx-get="([^"]+)" hx-trigger="every 5s"', page).group(
        1
    )
    poll = poll.replace("&amp;", "&")
    partial = admin_ui.get(poll)
    text = partial.get_data(as_text=True)
    assert (
        partial.status_code == 200
        and text.startswith('<div id="instance-live"')
        and "<html" not in text
    )
    assert '<dd id="instance-state">running</dd>' in text and "HX-Refresh" not in partial.headers
    api.post(f"/api/v1/instances/{inst['id']}/stop")
    # Stopping: Stop is no longer offered, so the whole page must come again (without its button).
    reload = admin_ui.get(poll)
    assert reload.status_code == 204 and reload.headers["HX-Refresh"] == "true"
    stopping = admin_ui.text(f"/ui/instances/{inst['id']}")
    poll = (
        re.search(r'<div id="instance-live" hx-get="([^"]+)"', stopping)
        .group(1)
        .replace("&amp;", "&")
    )
    assert "Stop…" not in stopping and admin_ui.get(poll).status_code == 200
    api.task_call(session, assignment, "finish", outcome="cancelled")
    reload = admin_ui.get(poll)  # stopped: Resume now
    assert reload.status_code == 204 and reload.headers["HX-Refresh"] == "true"
    stopped = admin_ui.text(f"/ui/instances/{inst['id']}")
    assert (
        '<div id="instance-live">' in stopped and "Resume…" in stopped
    )  # at rest: nothing to follow


# ---------------------------------------------------------------- the browser


def _start_over_http(server, session, ports):
    assignment = agent_call(server, session, "/acquire", {"wait_seconds": 10})["assignment"]
    assert assignment is not None and assignment["instance"] is not None
    agent_call(
        server,
        session,
        f"/tasks/{assignment['task_id']}/start",
        {
            "epoch": assignment["epoch"],
            "pid": 42,
            "ports": [{"port": p, "host_port": h, "protocol": proto} for p, h, proto in ports],
        },
    )
    return assignment


@pytest.mark.integration
@pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"{CHROMIUM} is absent: install Debian's chromium (scripts/setup.sh) for browser tests",
)
def test_follow_an_instance_from_the_list_until_it_runs_then_stop_resume_and_delete_it(
    page, http, server, admin
):  # noqa: F811
    _, session = enrol_over_http(http, server, "gpu-a", "alpha", 2)
    inst = http(
        "POST",
        "/api/v1/instances",
        expect=201,
        json={
            "name": "notebook",
            "command": ["jupyter", "lab"],
            "resources": {"gpus": 1},
            "volume_bytes": 2**30,
            "ports": [{"port": 8888, "protocol": "http"}],
        },
    ).json()
    waits = http(
        "POST",
        "/api/v1/instances",
        expect=201,
        json={"name": "big", "command": ["x"], "resources": {"gpus": 8}},
    ).json()
    sign_in(page, admin)
    page.click("nav >> text=Instances")
    page.wait_for_url(re.compile(r"/ui/instances$"))
    reason = http("GET", f"/api/v1/instances/{waits['id']}").json()["pending_reason"]
    assert reason in page.inner_text(f'tr[data-instance="{waits["id"]}"]')
    page.select_option("#f-state", "pending")
    page.click("text=Filter")
    page.wait_for_url(re.compile(r"state=pending"))
    assert page.locator(f'tr[data-instance="{waits["id"]}"]').count() == 1
    shot(page, "instances-pending")
    page.goto("/ui/instances")
    shot(page, "instances")
    page.click(f'tr[data-instance="{inst["id"]}"] >> text=notebook')
    page.wait_for_url(re.compile(f"/ui/instances/{inst['id']}$"))
    assert page.inner_text("#instance-state") in ("pending", "starting")
    assert "once it runs" in page.inner_text("#instance-ports")

    # The node starts it while the page is open: the page follows by itself.
    assignment = _start_over_http(server, session, [(8888, 40888, "http")])
    page.locator("#instance-state", has_text="running").wait_for(timeout=20_000)
    url = http("GET", f"/api/v1/instances/{inst['id']}/connection?port=8888", expect=200).json()[
        "url"
    ]
    assert url == "http://127.0.0.1:40888/"
    assert page.get_attribute("#instance-ports a", "href") == url
    shot(page, "instance-running")

    page.click("#action-stop")
    assert page.inner_text("h1") == "Stop instance notebook?"
    shot(page, "instance-stop-confirm")
    page.click("#confirm")
    page.wait_for_url(re.compile(f"/ui/instances/{inst['id']}$"))
    assert "Instance notebook is now stopping." in page.inner_text("main")
    assert agent_call(server, session, "/acquire", {"wait_seconds": 0})["cancel"] == [
        assignment["task_id"]
    ]
    agent_call(
        server,
        session,
        f"/tasks/{assignment['task_id']}/finish",
        {"epoch": assignment["epoch"], "outcome": "cancelled", "exit_code": 143},
    )
    # Stopped: Resume is possible now, so the page comes again with its button.
    page.locator("#action-resume").wait_for(timeout=20_000)
    assert (
        page.inner_text("#instance-state") == "stopped"
        and page.locator("#action-stop").count() == 0
    )
    shot(page, "instance-stopped")

    page.fill("#resume-gpus", "2")
    page.click("#action-resume")
    assert page.inner_text("h1") == "Resume instance notebook?"
    page.click("#confirm")
    page.wait_for_url(re.compile(f"/ui/instances/{inst['id']}$"))
    resumed = http("GET", f"/api/v1/instances/{inst['id']}", expect=200).json()
    assert resumed["spec"]["resources"]["gpus"] == 2 and resumed["state"] in ("pending", "starting")

    page.click("#action-delete")
    assert "This cannot be undone" in page.inner_text("main")
    page.click("#confirm")
    page.wait_for_url(re.compile(r"/ui/instances$"))
    assert "Instance notebook" in page.inner_text("main")
    assert page.locator(f'tr[data-instance="{inst["id"]}"] .status').inner_text() == "deleting"
    agent_call(
        server, session, "/heartbeat", {"volumes": []}
    )  # its node has removed the volume: gone
    assert http("GET", f"/api/v1/instances/{inst['id']}").status_code == 404
    page.reload()
    assert page.locator(f'tr[data-instance="{inst["id"]}"]').count() == 0
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"/ui/instances/{waits['id']}")
    shot(page, "instance-pending-phone")
