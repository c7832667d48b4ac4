"""The admin UI in Debian's headless Chromium (Playwright) against a real `fleetd serve`.

Nodes enrol through the agent protocol with requests, as agents would. A screenshot of each
page goes to $FLEETD_TEST_ARTIFACTS (or the test's tmp dir).
"""

import re

import pytest
import requests

from tests.conftest import gpus
from tests.support.browser import BROWSER_MARKS, artifacts_dir, checked_page, shot  # noqa: F401 - tests import shot from here
from tests.support.http import Http
from tests.ui.conftest import CSRF_RE

pytestmark = BROWSER_MARKS


@pytest.fixture
def artifacts(request, tmp_path):
    return artifacts_dir(request.node.name, tmp_path)


@pytest.fixture
def server(server_factory, admin):  # noqa: F811 - overrides the fixture of tests/support/server.py
    # Long node TTL: a slow browser step must not turn the test's nodes lost.
    return server_factory(FLEETD_NODE_TTL_SECONDS="3600")


@pytest.fixture
def http(server, admin):  # noqa: F811
    return Http(server.url, admin)


@pytest.fixture
def page(browser, server, artifacts):
    """A fresh browser context and page in Tokyo's time zone; fails the test on any console
    error."""
    with checked_page(browser, server.url, artifacts, timezone_id="Asia/Tokyo") as tab:
        yield tab


def enrol(http, server, fleet, hostname, gpu_count):
    """Register a host with a join token and send its first heartbeat: (node id, session token)."""
    if http("GET", f"/api/v1/fleets/{fleet}").status_code == 404:
        http("POST", "/api/v1/fleets", json={"name": fleet}, expect=201)
    join = http("POST", f"/api/v1/fleets/{fleet}/join-tokens", json={}, expect=201).json()["token"]
    agent = {"X-Fleet-Protocol": "1"}
    reg = requests.post(
        server.url + "/api/v1/agent/register",
        timeout=30,
        headers=dict(agent, Authorization=f"Bearer {join}"),
        json={
            "hostname": hostname,
            "machine_id": hostname,
            "agent_version": "0.1",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 32, "memory_bytes": 2**37},
            "gpus": gpus(gpu_count),
        },
    )
    assert reg.status_code == 201, reg.text
    session = reg.json()["session_token"]
    beat = requests.post(
        server.url + "/api/v1/agent/heartbeat",
        timeout=30,
        json={"tasks": []},
        headers=dict(agent, Authorization=f"Bearer {session}"),
    )
    assert beat.status_code == 200, beat.text
    return reg.json()["node_id"], session


def agent_call(server, session, path, body):
    resp = requests.post(
        server.url + "/api/v1/agent" + path,
        json=body,
        timeout=60,
        headers={"Authorization": f"Bearer {session}", "X-Fleet-Protocol": "1"},
    )
    assert resp.status_code in (200, 204), resp.text
    return resp.json() if resp.status_code == 200 else None


def start_job(http, server, session, **spec):
    """Submit a job that fits, let the node acquire and start it: (job, assignment)."""
    spec.setdefault("command", ["python", "train.py"])
    job = http("POST", "/api/v1/jobs", json=spec, expect=201).json()
    assignment = agent_call(server, session, "/acquire", {"wait_seconds": 10})["assignment"]
    assert assignment is not None and assignment["job_id"] == job["id"]
    agent_call(
        server,
        session,
        f"/tasks/{assignment['task_id']}/start",
        {"epoch": assignment["epoch"], "pid": 42},
    )
    return job, assignment


def sign_in(page, token):
    """Sign in by typing the token and pressing Enter."""
    page.goto("/ui/login")
    page.focus("#token")  # autofocus only applies while the headless window has focus
    page.keyboard.type(token)
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/ui/$"))


# ---------------------------------------------------------------- tests


def test_sign_in_and_the_overview_numbers_equal_cluster_status(page, http, server, admin):  # noqa: F811
    a, session_a = enrol(http, server, "gpu-a", "alpha", 8)
    b, _ = enrol(http, server, "gpu-a", "beta", 2)
    enrol(http, server, "night", "gamma", 4)
    http(
        "PATCH",
        "/api/v1/fleets/night",
        json={"availability": {"timezone": "UTC", "windows": [{"start": "00:00", "end": "00:01"}]}},
        expect=200,
    )
    http("POST", f"/api/v1/nodes/{b}/cordon", expect=200)
    start_job(http, server, session_a, name="runs", resources={"gpus": 2})
    http(
        "POST",
        "/api/v1/jobs",
        json={"name": "waits", "command": ["x"], "resources": {"gpus": 16}},
        expect=201,
    )

    sign_in(page, admin)
    status = http("GET", "/api/v1/cluster/status", expect=200).json()["gpu"]
    for key in ("total", "used", "free", "blocked"):
        assert page.inner_text(f"#gpu-{key}") == str(status[key]), key
    assert page.inner_text("#gpu-queued") == "16"
    assert (status["total"], status["used"], status["blocked"], status["queued"]) == (14, 2, 6, 16)
    for series in status["series"]:
        row = page.locator(f'tr[data-series="{series["id"]}"]')
        for key in ("total", "used", "free", "blocked"):
            assert row.locator(f'td[data-k="{key}"]').inner_text() == str(series[key])
    notes = page.inner_text("#blocked-notes")
    assert "node cordoned by an admin" in notes and "fleet outside its availability window" in notes
    # next_open_at is rewritten into the reader's zone (Asia/Tokyo here) by the page's script.
    local = page.locator("#blocked-notes time")
    assert local.get_attribute("data-local") is None
    assert "UTC" not in local.inner_text() and "GMT+9" in local.inner_text()
    assert page.inner_text('#node-counts [data-status="cordoned"]') == "1"
    shot(page, "overview")
    page.set_viewport_size({"width": 390, "height": 844})
    shot(page, "overview-phone")


def test_sign_in_is_refused_with_a_bad_token(page):
    page.goto("/ui/login")
    page.fill("#token", "fla_00000000000000000000.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
    page.click("button[type=submit]")
    assert "Sign-in refused: malformed or unknown token" in page.inner_text("#login-error")
    assert page.url.endswith("/ui/login")
    page.goto("/ui/nodes")
    assert "/ui/login" in page.url  # still signed out
    shot(page, "login-refused")


def test_drain_a_node_from_its_page(page, http, server, admin):  # noqa: F811
    node_id, session = enrol(http, server, "gpu-a", "alpha", 8)
    start_job(http, server, session, name="busy", resources={"gpus": 1})
    sign_in(page, admin)
    page.click("nav >> text=Nodes")
    shot(page, "nodes")
    page.click("text=alpha")
    page.wait_for_url(re.compile(f"/ui/nodes/{node_id}$"))
    shot(page, "node")
    page.fill("#drain-reason", "BIOS update")
    page.fill("#drain-deadline", "30")
    page.click("text=Drain…")
    assert "Drain alpha?" in page.inner_text("h1")
    shot(page, "node-drain-confirm")
    assert http("GET", f"/api/v1/nodes/{node_id}").json()["status"] == "ready"
    page.click("#confirm")
    page.wait_for_url(re.compile(f"/ui/nodes/{node_id}$"))
    node = http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()
    assert node["status"] == "draining" and node["drain"]["reason"] == "BIOS update"
    assert "alpha is now draining." in page.inner_text("main")
    assert page.inner_text("#node-status").startswith("draining")


def test_cancel_a_job_from_its_page_while_its_log_follows(page, http, server, admin):  # noqa: F811
    _, session = enrol(http, server, "gpu-a", "alpha", 2)
    job, assignment = start_job(http, server, session, name="train", resources={"gpus": 1})
    agent_call(
        server,
        session,
        f"/tasks/{assignment['task_id']}/logs",
        {"epoch": assignment["epoch"], "lines": [["stdout", "epoch 1 loss 0.9"]]},
    )
    sign_in(page, admin)
    page.click("nav >> text=Jobs")
    shot(page, "jobs")
    page.click(f'tr[data-job="{job["id"]}"] >> text=train')
    assert "epoch 1 loss 0.9" in page.inner_text("#log-lines")
    agent_call(
        server,
        session,
        f"/tasks/{assignment['task_id']}/logs",
        {"epoch": assignment["epoch"], "lines": [["stdout", "epoch 2 loss 0.5"]]},
    )
    page.locator("#log-lines >> text=epoch 2 loss 0.5").wait_for(
        timeout=20_000
    )  # htmx polls every 2 s
    shot(page, "job")
    page.click("#cancel")
    shot(page, "job-cancel-confirm")
    page.click("#confirm")
    page.wait_for_url(re.compile(f"/ui/jobs/{job['id']}$"))
    # Its process runs on until the node stops it: cancelling, then cancelled.
    assert http("GET", f"/api/v1/jobs/{job['id']}", expect=200).json()["state"] == "cancelling"
    assert page.inner_text("#job-state") == "cancelling"
    beat = agent_call(
        server,
        session,
        "/heartbeat",
        {
            "tasks": [
                {"id": assignment["task_id"], "epoch": assignment["epoch"], "state": "running"}
            ]
        },
    )
    assert beat["cancel"] == [assignment["task_id"]]


def test_create_a_join_token_and_read_it_once(page, http, server, admin):  # noqa: F811
    http("POST", "/api/v1/fleets", json={"name": "gpu-a"}, expect=201)
    sign_in(page, admin)
    page.click("nav >> text=Join tokens")
    page.select_option("#jt-fleet", "gpu-a")
    page.fill("#jt-ttl", "2")
    page.fill("#jt-uses", "1")
    page.fill("#jt-desc", "rack 7")
    page.click("text=Create join token")
    token = page.input_value("#new-token")
    command = page.input_value("#join-command")
    assert (
        token.startswith("flj_")
        and command == f"FLEET_AGENT_JOIN_TOKEN={token} fleet-agent join --server {server.url}"
    )
    page.click('button[data-copy="join-command"]')
    page.locator(".copy-status").filter(has_text="op").wait_for()
    shot(page, "join-token-created")
    page.goto("/ui/join-tokens")
    content = page.content()
    assert token not in content and token.split(".")[1] not in content and "rack 7" in content
    assert page.locator("#new-token").count() == 0
    shot(page, "join-tokens")
    reg = requests.post(
        server.url + "/api/v1/agent/register",
        timeout=30,
        headers={"Authorization": f"Bearer {token}", "X-Fleet-Protocol": "1"},
        json={
            "hostname": "h",
            "machine_id": "m",
            "agent_version": "0.1",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**34},
            "gpus": gpus(1),
        },
    )
    assert reg.status_code == 201, reg.text


def test_form_post_without_the_csrf_token_is_refused(http, server, admin):  # noqa: F811
    node_id, _ = enrol(http, server, "gpu-a", "alpha", 2)
    browser_like = requests.Session()
    assert (
        browser_like.post(server.url + "/ui/login", data={"token": admin}, timeout=30).status_code
        == 400
    )
    csrf = CSRF_RE.search(browser_like.get(server.url + "/ui/login", timeout=30).text).group(1)
    signed = browser_like.post(
        server.url + "/ui/login", data={"token": admin, "csrf_token": csrf}, timeout=30
    )
    assert signed.status_code == 200 and "gpu-total" in signed.text
    assert CSRF_RE.search(signed.text).group(1) != csrf  # signing in starts a new CSRF token
    csrf = CSRF_RE.search(signed.text).group(1)
    form = {"reason": "forged", "deadline_minutes": "1", "confirm": "yes"}
    refused = browser_like.post(f"{server.url}/ui/nodes/{node_id}/drain", data=form, timeout=30)
    assert refused.status_code == 400 and "did not come from this site" in refused.text
    assert "Traceback" not in refused.text
    assert http("GET", f"/api/v1/nodes/{node_id}").json()["status"] == "ready"
    accepted = browser_like.post(
        f"{server.url}/ui/nodes/{node_id}/drain", data=dict(form, csrf_token=csrf), timeout=30
    )
    assert accepted.status_code == 200
    assert http("GET", f"/api/v1/nodes/{node_id}").json()["status"] == "drained"


def test_every_page_renders_for_an_admin_without_console_errors(page, http, server, admin):  # noqa: F811
    node_id, session = enrol(http, server, "gpu-a", "alpha", 2)
    job, _ = start_job(http, server, session, name="train", resources={"gpus": 1})
    queued = http(
        "POST",
        "/api/v1/jobs",
        json={"name": "waits", "command": ["x"], "resources": {"gpus": 8}},
        expect=201,
    ).json()
    sign_in(page, admin)
    pages = {
        "api-tokens": "/ui/api-tokens",
        "maintenance": "/ui/maintenance",
        "gpu-types": "/ui/gpu-types",
        "job-queued": f"/ui/jobs/{queued['id']}",
        "job-running": f"/ui/jobs/{job['id']}",
        "node-page": f"/ui/nodes/{node_id}",
        "usage": "/ui/usage",
    }
    for name, path in pages.items():
        page.goto(path)
        assert page.locator("h1").count() == 1 and page.locator(".error-page").count() == 0, name
        shot(page, name)
    page.goto(f"/ui/jobs/{queued['id']}")
    assert "It does not fit now" in page.inner_text("#simulation")
    page.goto("/ui/maintenance")
    page.click('tr[data-task="liveness_sweep"] >> text=Run now')
    assert "liveness_sweep ran: ok." in page.inner_text("main")
    page.goto("/ui/nope")
    assert "there is no such page" in page.inner_text("#error-message")
    shot(page, "not-found")


def _tab_to(page, selector, limit=60):
    """Press Tab until `selector` has the focus; fails if it is not reachable by keyboard."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate(
            "(sel) => document.activeElement === document.querySelector(sel)", selector
        ):
            return
    raise AssertionError(f"{selector} is not reachable with Tab")


def test_a_node_can_be_cordoned_with_the_keyboard_alone(page, http, server, admin):  # noqa: F811
    node_id, _ = enrol(http, server, "gpu-a", "alpha", 2)
    sign_in(page, admin)
    page.goto(f"/ui/nodes/{node_id}")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    _tab_to(page, 'form[action$="/cordon"] button')
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(f"/ui/nodes/{node_id}/cordon$"))
    _tab_to(page, "#confirm")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(f"/ui/nodes/{node_id}$"))
    assert http("GET", f"/api/v1/nodes/{node_id}", expect=200).json()["status"] == "cordoned"
