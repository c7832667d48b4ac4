"""A job's and an instance's page show their own usage and cost from the ledger (issue 34's
"a workload's page shows its own usage and cost"), through the Flask test client."""

import re

import pytest

from tests.fleetd.services.workloads.test_instances import create, start

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def node(api):
    api.create_fleet("gpu-a")
    api.call("PUT", f"/api/v1/gpu-types/{H100}", json={"price_per_hour": 2.0})
    return api.ready_node(api.create_join_token("gpu-a"), "host-1", gpu_count=2)


def usage_section(html):
    """The text of the page's Usage section, tags dropped and spaces folded."""
    section = html[html.index('id="usage-h"') :]
    section = section[: section.index("</section>")]
    return " ".join(re.sub(r"<[^>]+>", " ", section).split())


def test_a_jobs_page_shows_what_the_ledger_accounted_of_its_run(api, admin_ui, node, clock):
    _node_id, session = node
    job = api.submit(resources={"gpus": 2}, team="ml")
    page = admin_ui.get(f"/ui/jobs/{job['id']}").get_data(as_text=True)
    assert "Nothing accounted yet" in usage_section(page)
    assignment = api.start_task(session)
    clock.advance(1800)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    api.run_task("usage")
    text = usage_section(admin_ui.get(f"/ui/jobs/{job['id']}").get_data(as_text=True))
    # 2 GPUs for half an hour at 2.00 per GPU-hour; no utilisation samples came, so "used" is
    # unknown.
    assert (
        "GPU-hours allocated 1.000" in text and "GPU-hours used –" in text and "cost 2.00" in text
    ), text
    assert H100 in text and "2 " in text


def test_an_instances_page_shows_its_runs_usage_while_it_runs(api, admin_ui, node, clock):
    _node_id, session = node
    inst = create(api, resources={"gpus": 1})
    start(api, session)
    clock.advance(3600)
    api.run_task("usage")  # accounted while it runs
    text = usage_section(admin_ui.get(f"/ui/instances/{inst['id']}").get_data(as_text=True))
    assert "GPU-hours allocated 1.000" in text and "cost 2.00" in text and "running" in text, text


def test_a_jobs_page_shows_its_ended_run_and_cost_before_the_ledgers_next_pass(
    api, admin_ui, node, clock
):
    _node_id, session = node
    job = api.submit(resources={"gpus": 2}, team="ml")
    assignment = api.start_task(session)
    clock.advance(1800)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    clock.advance(30)  # the ledger's pass has not come yet
    text = usage_section(admin_ui.get(f"/ui/jobs/{job['id']}").get_data(as_text=True))
    assert "GPU-hours allocated 1.000" in text and "cost 2.00" in text, text
    assert "2026-01-01T12:30:00.000Z" in text and "running" not in text, text  # ended, at its end
