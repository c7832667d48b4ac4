"""Screenshots of the admin UI's pages for docs/ui.md, for anyone with the dev extras and chromium:

    .venv/bin/python scripts/ui_screenshots.py [--out docs/ui]

It starts its own `fleetd serve` on a loopback port over a temporary data directory, enrols two
simulated 8-GPU hosts through the agent protocol (the script speaks the agent's side), deploys an
instance whose port a small HTTP server answers, runs, fails and queues jobs with log lines, sets
prices, a quota, a budget, an API token and a webhook whose deliveries a small receiver on loopback
answers, then signs in with Chromium and saves one PNG per page (the join-token page after creating
one, to show its join command; the job form after a check of a job that never fits). Everything it
started is stopped at the end.
"""

import argparse
import os
import sys
import tempfile
import threading
from http.server import ThreadingHTTPServer

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, HelloPage  # noqa: E402 - after the path is set
from tests.support.gpus import gpus  # noqa: E402
from tests.support.server import FleetdProcess, fleetd_init  # noqa: E402
from tests.support.webhooks import Receiver  # noqa: E402

H100 = gpus(1)[0]["model"]
AGENT = {"X-Fleet-Protocol": "1"}


class Api:
    """The REST API with the admin token; agent calls with a node's session token."""

    def __init__(self, url, token):
        self.url, self.session = url, requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def __call__(self, method, path, **body):
        resp = self.session.request(method, self.url + path, json=body or None, timeout=30)
        if resp.status_code >= 400:
            raise SystemExit(f"{method} {path}: {resp.status_code} {resp.text}")
        return resp.json() if resp.content else None

    def agent(self, token, path, **body):
        resp = requests.post(
            self.url + "/api/v1/agent" + path,
            json=body,
            timeout=30,
            headers=dict(AGENT, Authorization=f"Bearer {token}"),
        )
        if resp.status_code >= 400:
            raise SystemExit(f"agent {path}: {resp.status_code} {resp.text}")
        return resp.json() if resp.content else None


def enrol(api, fleet, hostname, count):
    join = api("POST", f"/api/v1/fleets/{fleet}/join-tokens")["token"]
    reg = api.agent(
        join,
        "/register",
        hostname=hostname,
        machine_id=hostname,
        agent_version="0.1",
        address="127.0.0.1",
        resources={"cpu_count": 64, "memory_bytes": 2**39},
        gpus=gpus(count),
    )
    api.agent(reg["session_token"], "/heartbeat", tasks=[])
    return reg["session_token"]


def start_next(api, session, ports=()):
    """The node acquires its next assignment and reports it started."""
    assignment = api.agent(session, "/acquire", wait_seconds=5)["assignment"]
    api.agent(
        session,
        f"/tasks/{assignment['task_id']}/start",
        epoch=assignment["epoch"],
        pid=4242,
        ports=[{"port": p, "host_port": h, "protocol": proto} for p, h, proto in ports],
    )
    return assignment


def seed(api, web_port, hook_url):
    """A small fleet at work: what each page shows. Returns the webhook's id."""
    api("POST", "/api/v1/fleets", name="gpu-a", description="rack 7", labels={"zone": "a"})
    api(
        "POST",
        "/api/v1/fleets",
        name="night",
        labels={"zone": "b"},
        availability={"timezone": "Europe/Berlin", "windows": [{"start": "22:00", "end": "06:00"}]},
    )
    api("PUT", f"/api/v1/gpu-types/{H100}", price_per_hour=2.5, spot_min_bid=0.8)
    hook = api(
        "POST",
        "/api/v1/webhooks",
        url=hook_url,
        secret="example-secret-0123456789",
        events=["node.enrolled", "node.lost", "job.failed"],
    )
    a = enrol(api, "gpu-a", "gpu-host-1", 8)
    enrol(api, "night", "gpu-host-2", 8)
    # Pinned to gpu-a: inside the night fleet's window its node would do as well, and gpu-host-1 is
    # the one whose side of the agent protocol this script speaks.
    here = {"fleet": "gpu-a"}
    api(
        "POST",
        "/api/v1/jobs",
        name="train-llm",
        command=["python", "train.py", "--epochs", "40"],
        resources={"gpus": 4},
        team="ml",
        node_selector=here,
    )
    run = start_next(api, a)
    api.agent(
        a,
        f"/tasks/{run['task_id']}/logs",
        epoch=run["epoch"],
        lines=[["stdout", f"epoch {i} loss {1.0 / (i + 1):.3f}"] for i in range(1, 41)],
    )
    api(
        "POST",
        "/api/v1/instances",
        name="notebook",
        command=["jupyter", "lab", "--port", "8888"],
        resources={"gpus": 1},
        ports=[{"port": 8888, "protocol": "http"}],
        volume_bytes=50 * 2**30,
        node_selector=here,
    )
    served = start_next(api, a, [(8888, web_port, "http")])
    api.agent(
        a,
        f"/tasks/{served['task_id']}/logs",
        epoch=served["epoch"],
        lines=[["stdout", "Jupyter Server is running at http://0.0.0.0:8888/lab"]],
    )
    api(
        "POST",
        "/api/v1/jobs",
        name="sweep",
        command=["python", "sweep.py"],
        resources={"gpus": 16},
        num_nodes=2,
        team="vision",
    )
    failed = api(
        "POST",
        "/api/v1/jobs",
        name="eval",
        command=["python", "eval.py"],
        resources={"gpus": 1},
        team="ml",
        node_selector=here,
    )
    run = start_next(api, a)
    if run["job_id"] != failed["id"]:
        raise SystemExit(f"gpu-host-1 was given {run['job_id']}, not the job eval")
    api.agent(
        a, f"/tasks/{run['task_id']}/finish", epoch=run["epoch"], outcome="failed", exit_code=1
    )
    api("PUT", "/api/v1/quotas/vision", priority_class="any", max_gpus=8)
    api("PUT", "/api/v1/budgets/ml", limit_cost=500.0, on_exceed="notify")
    api("POST", "/api/v1/tokens", name="ci", role="submitter", team="ml")
    api("POST", "/api/v1/admin/tasks/usage/run")
    api(
        "POST", "/api/v1/admin/tasks/webhooks/run"
    )  # the receiver refuses the first, so one row is retrying
    return hook["id"]


def create_join_token(page):
    """The join-token form, submitted: the page then shows the token's join command (this once)."""
    page.select_option("#jt-fleet", "gpu-a")
    page.fill("#jt-desc", "rack 7, row 2")
    page.click("text=Create join token")
    page.locator("#join-command").wait_for()


def check_a_job_that_never_fits(page):
    """The job form's Check, for more GPUs per node than any node has: the never-fits reason."""
    page.get_by_label("Name", exact=True).fill("wide")
    page.get_by_label("Command").fill("python train.py")
    page.get_by_label("GPUs per node").fill("16")
    page.click("#job-check")
    page.locator("#never-fits").wait_for()


# (PNG name, path, what is done on the page before it is taken); {webhook} is the seeded webhook's
# id.
PAGES = [
    ("overview", "/ui/", None),
    ("instance-new", "/ui/instances/new", None),
    ("instances", "/ui/instances", None),
    ("instance", "/ui/instances/notebook", None),
    ("job-new", "/ui/jobs/new", None),
    ("job-new-never-fits", "/ui/jobs/new", check_a_job_that_never_fits),
    ("jobs", "/ui/jobs", None),
    ("job", "/ui/jobs/train-llm", None),
    ("nodes", "/ui/nodes", None),
    ("node", "/ui/nodes/gpu-host-1", None),
    ("fleets", "/ui/fleets", None),
    ("fleet", "/ui/fleets/night", None),
    ("join-tokens", "/ui/join-tokens", create_join_token),
    ("quotas", "/ui/quotas", None),
    ("webhooks", "/ui/webhooks", None),
    ("webhook", "/ui/webhooks/{webhook}", None),
    ("usage", "/ui/usage", None),
    ("gpu-types", "/ui/gpu-types", None),
    ("api-tokens", "/ui/api-tokens", None),
    ("maintenance", "/ui/maintenance", None),
]


def save(page, out, name, path):
    page.wait_for_load_state("networkidle")
    target = os.path.join(out, f"{name}.png")
    page.screenshot(path=target, full_page=True)
    print(f"{target}  {path}")


def shoot(url, admin, out, webhook_id):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(
            base_url=url, viewport={"width": 1280, "height": 900}, locale="en-US", timezone_id="UTC"
        )
        page = context.new_page()
        page.goto("/ui/login")
        save(page, out, "login", "/ui/login")
        page.fill("#token", admin)
        page.click("button[type=submit]")
        page.wait_for_url("**/ui/")
        for name, path, action in PAGES:
            path = path.format(webhook=webhook_id)
            page.goto(path)
            if action is not None:
                action(page)
            save(page, out, name, path)
        browser.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "ui"), help="where the PNGs go")
    args = parser.parse_args()
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} is absent: install Debian's chromium (scripts/setup.sh)")
    os.makedirs(args.out, exist_ok=True)
    web = ThreadingHTTPServer(("127.0.0.1", 0), HelloPage)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    receiver = (
        Receiver()
    )  # the webhook's receiver, on loopback (the fleetd below allows 127.0.0.0/8)
    receiver.statuses = [503]
    with tempfile.TemporaryDirectory(prefix="fleetd-shots-") as tmp:
        data_dir = os.path.join(tmp, "data")
        admin = fleetd_init(data_dir)
        # The webhooks task is run by the seed: a slow periodic run keeps the retrying row as it
        # was.
        server = FleetdProcess(
            data_dir, {"FLEETD_NODE_TTL_SECONDS": "3600", "FLEETD_WEBHOOK_SEND_SECONDS": "3600"}
        ).start()
        try:
            webhook_id = seed(Api(server.url, admin), web.server_address[1], receiver.url)
            shoot(server.url, admin, args.out, webhook_id)
        finally:
            server.kill()
            receiver.close()
            web.shutdown()
            web.server_close()


if __name__ == "__main__":
    main()
