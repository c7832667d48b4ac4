"""The console in Debian's headless Chromium (Playwright) against one real `fleetd serve` for the
module: deploy an instance from its form and open its URL, submit a job from the form and from a
YAML spec (an error beside the field), see a log line appear without reloading, a submitter who
sees neither another's instance nor the admin pages, and a project made and given a member. Each
test enrols its own node and cordons it at the end, so that tests sharing the server never get each
other's work."""

import re
import threading
from http.server import ThreadingHTTPServer

import pytest
import requests

from tests.support.browser import BROWSER_MARKS, HelloPage, artifacts_dir, checked_page, shot
from tests.support.http import Http
from tests.support.server import FleetdProcess, fleetd_init
from tests.ui.test_browser import agent_call, enrol, sign_in

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """One fleetd for the module: (process, first admin token). Long node TTL: a slow browser step
    must not turn the tests' nodes lost."""
    data_dir = tmp_path_factory.mktemp("console") / "fleetd-data"
    admin = fleetd_init(data_dir)
    proc = FleetdProcess(data_dir, {"FLEETD_NODE_TTL_SECONDS": "3600"}).start()
    yield proc, admin
    proc.kill()


@pytest.fixture
def server(console):
    return console[0]


@pytest.fixture
def admin(console):
    return console[1]


@pytest.fixture
def http(server, admin):
    return Http(server.url, admin)


@pytest.fixture
def node(request, http, server):
    """A node of its own for this test, 2 GPUs, cordoned at the end so that later tests' work goes
    elsewhere: (node id, session token)."""
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40]
    node_id, session = enrol(http, server, "console", name, 2)
    yield node_id, session
    http("POST", f"/api/v1/nodes/{node_id}/cordon")


@pytest.fixture
def artifacts(request, tmp_path):
    return artifacts_dir(request.node.name, tmp_path)


@pytest.fixture
def page(browser, server, artifacts):
    """A fresh browser context (no cookies) and page; fails the test on any console error."""
    with checked_page(browser, server.url, artifacts) as tab:
        yield tab


@pytest.fixture
def workload():
    """What the instance serves: a real HTTP server on a loopback port (its node's published host
    port)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), HelloPage)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def _acquire(server, session):
    assignment = agent_call(server, session, "/acquire", {"wait_seconds": 10})["assignment"]
    assert assignment is not None
    return assignment


# ---------------------------------------------------------------- tests


def test_deploy_an_instance_from_the_form_and_open_its_url(
    page, http, server, admin, node, workload
):
    _, session = node
    sign_in(page, admin)
    page.click("nav >> text=Instances")
    page.click("#deploy-link")
    page.wait_for_url(re.compile(r"/ui/instances/new$"))
    page.get_by_label("Name", exact=True).fill("notebook")
    page.get_by_label("GPUs", exact=True).fill("1")
    page.get_by_label("Command").fill("jupyter lab --port 8888")
    page.get_by_label("Ports").fill("8888/http")
    page.get_by_label("Volume size (GiB)").fill("1")
    page.get_by_label("Variable 1 name").fill("HF_TOKEN")
    page.get_by_label("Variable 1 value").fill("hf_not_shown")
    assert page.get_attribute("#env-value-1", "type") == "password"
    page.click("#env-add")  # a third row, beyond the two the form has
    page.get_by_label("Variable 3 name").fill("MODEL")
    page.get_by_label("Variable 3 value").fill("llama")
    shot(page, "instance-new")
    page.click("#deploy")
    page.wait_for_url(re.compile(r"/ui/instances/[0-9a-f]{20}$"))
    inst_id = page.url.rsplit("/", 1)[1]
    assert "this page follows it until it runs" in page.inner_text("main")
    assert "hf_not_shown" not in page.content()
    assert page.inner_text("#instance-state") in ("pending", "starting")

    # Its node starts it while the page is open; the page follows by itself and names the URL to
    # open.
    assignment = _acquire(server, session)
    assert assignment["instance"] is not None
    assert assignment["env"]["HF_TOKEN"] == "hf_not_shown" and assignment["env"]["MODEL"] == "llama"
    agent_call(
        server,
        session,
        f"/tasks/{assignment['task_id']}/start",
        {
            "epoch": assignment["epoch"],
            "pid": 42,
            "ports": [{"port": 8888, "host_port": workload, "protocol": "http"}],
        },
    )
    page.locator("#instance-url a").wait_for(timeout=20_000)
    url = http("GET", f"/api/v1/instances/{inst_id}/connection?port=8888", expect=200).json()["url"]
    assert page.get_attribute("#instance-url a", "href") == url == f"http://127.0.0.1:{workload}/"
    shot(page, "instance-deployed")
    with page.context.expect_page() as opened:
        page.click("#instance-url a")
    opened.value.wait_for_load_state()
    assert opened.value.inner_text("h1") == "hello from the instance"
    opened.value.close()

    page.goto("/ui/instances")
    assert url in page.inner_text(f'tr[data-instance="{inst_id}"]')  # the list shows the URL
    shot(page, "instances")
    http("DELETE", f"/api/v1/instances/{inst_id}")
    agent_call(
        server,
        session,
        f"/tasks/{assignment['task_id']}/finish",
        {"epoch": assignment["epoch"], "outcome": "cancelled", "exit_code": 143},
    )


def test_submit_a_job_from_the_form_and_watch_its_log_without_reloading(
    page, http, server, admin, node
):
    _, session = node
    sign_in(page, admin)
    page.goto("/ui/jobs/new")
    page.get_by_label("Name", exact=True).fill("train")
    page.get_by_label("Command").fill("python train.py --epochs 40")
    page.get_by_label("GPUs per node").fill("16")
    page.click("#job-check")
    assert "It never fits on the nodes enrolled now" in page.inner_text("#never-fits")
    assert (
        http("GET", "/api/v1/jobs?name=train", expect=200).json()["items"] == []
    )  # nothing submitted
    shot(page, "job-new-never-fits")
    page.get_by_label("GPUs per node").fill("1")
    page.get_by_label("Gang size (nodes)").fill("1")
    page.get_by_label("Gang size (nodes)").blur()  # a change asks the scheduler again, in place
    page.locator("#fits-now").wait_for(timeout=20_000)
    page.click("#job-submit")
    page.wait_for_url(re.compile(r"/ui/jobs/[0-9a-f]{20}$"))
    job_id = page.url.rsplit("/", 1)[1]
    assert "Job train submitted" in page.inner_text("main")

    assignment = _acquire(server, session)
    assert assignment["job_id"] == job_id
    agent_call(
        server,
        session,
        f"/tasks/{assignment['task_id']}/start",
        {"epoch": assignment["epoch"], "pid": 7},
    )
    agent_call(
        server,
        session,
        f"/tasks/{assignment['task_id']}/logs",
        {"epoch": assignment["epoch"], "lines": [["stdout", "epoch 1 loss 0.91"]]},
    )
    page.locator("#log-lines >> text=epoch 1 loss 0.91").wait_for(timeout=20_000)  # no reload
    page.locator("#job-state", has_text="running").wait_for(
        timeout=20_000
    )  # the state too, in place
    shot(page, "job-log-live")
    agent_call(
        server,
        session,
        f"/tasks/{assignment['task_id']}/finish",
        {"epoch": assignment["epoch"], "outcome": "succeeded", "exit_code": 0},
    )
    page.locator("#job-state", has_text="succeeded").wait_for(timeout=20_000)


def test_a_yaml_spec_with_an_error_shows_it_beside_the_box_then_submits(page, http, admin):
    sign_in(page, admin)
    page.goto("/ui/jobs/new")
    box = page.get_by_label("Spec", exact=True)
    box.fill("name: sweep\ncommand: [python, sweep.py]\nnum_nodes: 0\nresources:\n  gpus: 1\n")
    page.click("#spec-submit")
    error = page.locator("#err-spec")
    assert "num_nodes:" in error.inner_text()
    assert page.get_attribute("#j-spec", "aria-describedby") == "err-spec"
    shot(page, "job-new-spec-error")
    page.get_by_label("Spec", exact=True).fill(
        '{"name": "sweep", "command": ["python", "sweep.py"], "num_nodes": 2}'
    )
    page.click("#spec-submit")
    page.wait_for_url(re.compile(r"/ui/jobs/[0-9a-f]{20}$"))
    job = http("GET", "/api/v1/jobs/" + page.url.rsplit("/", 1)[1], expect=200).json()
    assert job["name"] == "sweep" and len(job["tasks"]) == 2
    http("POST", f"/api/v1/jobs/{job['id']}/cancel", expect=200)


def test_a_submitter_sees_neither_anothers_instance_nor_the_admin_pages(page, http, server):
    alice = http(
        "POST", "/api/v1/tokens", json={"name": "alice", "role": "submitter"}, expect=201
    ).json()["token"]
    bob = http(
        "POST", "/api/v1/tokens", json={"name": "bob", "role": "submitter"}, expect=201
    ).json()["token"]
    hers = http(
        "POST",
        "/api/v1/instances",
        token=alice,
        expect=201,
        json={"name": "alices-notebook", "command": ["jupyter", "lab"], "resources": {"gpus": 64}},
    ).json()
    sign_in(page, bob)
    nav = page.inner_text("nav")
    assert (
        "Instances" in nav
        and "API tokens" not in nav
        and "Join tokens" not in nav
        and "Maintenance" not in nav
    )
    page.goto("/ui/instances")
    assert page.locator(f'tr[data-instance="{hers["id"]}"]').count() == 0
    page.goto(f"/ui/instances/{hers['id']}")
    assert page.inner_text("h1") == "Not found"
    for path in ("/ui/api-tokens", "/ui/join-tokens", "/ui/maintenance"):
        page.goto(path)
        assert page.inner_text("h1") == "Not allowed", path
    shot(page, "submitter-not-allowed")
    # Bob deploys his own from the form; Alice's name is no obstacle (names are per owner).
    page.goto("/ui/instances/new")
    page.get_by_label("Name", exact=True).fill("alices-notebook")
    page.get_by_label("GPUs", exact=True).fill("64")
    page.get_by_label("Command").fill("sleep infinity")
    page.click("#deploy")
    page.wait_for_url(re.compile(r"/ui/instances/[0-9a-f]{20}$"))
    assert (
        requests.get(
            server.url + "/api/v1/instances", timeout=30, headers={"Authorization": f"Bearer {bob}"}
        ).json()["items"][0]["owner"]
        == "bob"
    )
    http("DELETE", f"/api/v1/instances/{hers['id']}")


def test_create_a_fleet_a_quota_and_a_webhook(page, http, server, admin):
    sign_in(page, admin)
    page.click("nav >> text=Fleets")
    page.get_by_label("Name", exact=True).fill("night")
    page.get_by_label("Labels").fill("zone=b")
    page.get_by_label("Windows").fill("22:00-06:00 mon,tue,wed,thu,fri")
    page.get_by_label("Time zone").fill("Europe/Berlin")
    page.click("#fleet-create")
    page.wait_for_url(re.compile(r"/ui/fleets/night$"))
    assert "22:00–06:00 mon,tue,wed,thu,fri" in page.inner_text("#fleet-windows")
    fleet = http("GET", "/api/v1/fleets/night", expect=200).json()
    assert fleet["labels"] == {"zone": "b"} and fleet["availability"]["timezone"] == "Europe/Berlin"
    shot(page, "fleet")
    page.click("#fleet-join-tokens")
    page.click("text=Create join token")
    assert page.input_value("#join-command").endswith(f"fleet-agent join --server {server.url}")

    page.click("nav >> text=Quotas")
    page.get_by_label("Team").fill("vision")
    page.get_by_label("Max GPUs").fill("-2")
    page.click("#quota-save")
    assert page.locator("#err-max_gpus").count() == 1  # the API's refusal, beside the field
    page.get_by_label("Max GPUs").fill("8")
    page.click("#quota-save")
    page.wait_for_url(re.compile(r"/ui/quotas$"))
    assert page.locator('tr[data-quota="vision/any"]').count() == 1
    shot(page, "quotas")

    page.click("nav >> text=Webhooks")
    page.get_by_label("URL").fill("http://127.0.0.1:9/hook")
    page.click("#webhook-create")
    secret = page.input_value("#new-secret")
    assert len(secret) >= 32
    shot(page, "webhook-created")
    page.goto("/ui/webhooks")
    assert secret not in page.content() and page.locator("#webhooks tbody tr").count() == 1
    hook = http("GET", "/api/v1/webhooks", expect=200).json()["items"][0]
    page.click(f'tr[data-webhook="{hook["id"]}"] a')
    assert page.inner_text("h1") == f"Webhook {hook['id']}"
    shot(page, "webhook")
    page.goto("/ui/fleets")
    shot(page, "fleets")


def test_create_a_project_and_add_a_member_through_the_pages(page, http, admin):
    http(
        "POST",
        "/api/v1/tokens",
        expect=201,
        json={"name": "carol-laptop", "role": "member", "user": "carol"},
    )
    sign_in(page, admin)
    page.click("nav >> text=Projects")
    page.wait_for_url(re.compile(r"/ui/projects$"))
    page.get_by_label("Key", exact=True).fill("robotics")
    page.get_by_label("Display name (optional)").fill("Robotics")
    page.fill("#p-team", "robots")
    page.click("#project-create")
    page.wait_for_url(re.compile(r"/ui/projects/robotics$"))
    assert "Project robotics created" in page.inner_text("main")
    page.get_by_label("Login", exact=True).fill("carol")
    page.select_option("#m-role", "admin")
    page.click("#member-add")
    page.wait_for_url(re.compile(r"/ui/projects/robotics$"))
    assert "carol is admin of project robotics" in page.inner_text("main")
    assert "admin" in page.inner_text('tr[data-member="carol"]')
    shot(page, "project")
    members = http("GET", "/api/v1/projects/robotics/members", expect=200).json()["items"]
    assert [(m["login"], m["role"]) for m in members] == [("carol", "admin")]
    # The header's switcher now offers it, and choosing it fills the job form's project.
    with page.expect_navigation():
        page.select_option("#switch-project", "robotics")  # no button press: it submits itself
    page.goto("/ui/jobs/new")
    assert page.input_value("#j-project") == "robotics"
