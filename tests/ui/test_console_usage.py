"""The Usage page through Flask's test client: GPU-hours by team per day as a stacked chart,
per-team figures equal to GET /api/v1/usage, budget bars, idle-held GPUs (admins), a submitter's own
usage only."""

import re

from tests.conftest import gpus
from tests.fleetd.services.accounting.test_usage import sample

H100 = gpus(1)[0]["model"]


def test_usage_page_shows_the_reports_figures_budgets_and_idle_gpus(
    app, api, admin_ui, signed_in, clock
):
    api.create_fleet("gpu-a")
    _, session = api.ready_node(api.create_join_token("gpu-a"), "host-1", gpu_count=2)
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    api.call("PUT", "/api/v1/budgets/ml", json={"limit_cost": 10.0, "on_exceed": "notify"})
    job = api.submit(name="train", resources={"gpus": 2}, team="ml")
    api.start_task(session)
    clock.advance(60)
    sample(api, session, (1, 2))  # both GPUs nearly idle
    clock.advance(3540)
    sample(api, session, (1, 2))
    api.run_task("usage")
    page = admin_ui.text("/ui/usage")
    report = api.get("/api/v1/usage").get_json()
    row = re.search(r'<tr data-team="ml">(.*?)</tr>', page, re.S).group(1)
    assert (
        report["rows"][0]["group"] == "ml"
        and f"{report['rows'][0]['gpu_hours_allocated']:.2f}" in row
    )
    assert f"{report['rows'][0]['cost']:.2f}" in row and "<meter" in row
    budget = api.get("/api/v1/budgets/ml").get_json()
    assert f"{budget['used_percent']:.0f}%" in row
    assert re.search(r'<rect class="s-k0" [^>]+><title>\d{4}-\d\d-\d\d ml: 2 h</title>', page)
    assert '<span class="swatch s-k0"></span>ml' in page
    idle = re.search(r'<tr data-workload="([0-9a-f]+)">', page)
    assert idle and idle.group(1) == job["id"]
    assert admin_ui.get("/ui/usage?days=5").status_code == 400

    bob = signed_in("submitter", "bob")
    mine = bob.text("/ui/usage")
    assert (
        'data-team="ml"' not in mine and 'id="usage-idle"' not in mine
    )  # not his usage; idle list: admins
    assert "Usage" in mine and 'href="/ui/usage"' in mine


def test_an_admin_sets_a_budget_on_the_usage_page(admin_ui, api):
    admin_ui.get("/ui/usage")
    none = admin_ui.post("/ui/usage/budgets", {"team": "ml", "on_exceed": "block"})
    assert none.status_code == 400 and "limit_cost or limit_gpu_hours is required" in none.get_data(
        as_text=True
    )
    bad = admin_ui.post("/ui/usage/budgets", {"team": "ml", "limit_cost": "-5"})
    assert bad.status_code == 400 and 'id="err-limit_cost"' in bad.get_data(as_text=True)
    saved = admin_ui.post(
        "/ui/usage/budgets", {"team": "ml", "limit_gpu_hours": "100", "on_exceed": "block"}
    )
    assert saved.status_code == 302
    budget = api.get("/api/v1/budgets/ml").get_json()
    assert (budget["limit_gpu_hours"], budget["limit_cost"], budget["on_exceed"]) == (
        100.0,
        None,
        "block",
    )
    assert "Budgets of teams without usage in these days: ml (0% this month)" in admin_ui.text(
        "/ui/usage"
    )


def test_a_submitter_cannot_set_a_budget(signed_in):
    bob = signed_in("submitter", "bob")
    assert 'id="budget-form"' not in bob.text("/ui/usage")
    assert bob.post("/ui/usage/budgets", {"team": "ml", "limit_cost": "1"}).status_code == 403
