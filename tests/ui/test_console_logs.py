"""Log boxes through Flask's test client: a page opens with the newest lines, "Load earlier lines"
brings the ones before them until the start, and an instance's box follows new lines as a job's
does."""

import re

from fleetd.ui.pages import logs
from tests.fleetd.services.workloads.test_instances import create
from tests.ui.conftest import enrol
from tests.ui.test_instances_ui import start


def _hx_get(text, element_id):
    match = re.search(rf'id="{element_id}"[^>]* hx-get="([^"]+)"', text)
    return match.group(1).replace("&amp;", "&") if match else None


def _shown(text):
    return re.findall(r'<span class="rank">\d+</span>(line \d+)', text)


def test_a_long_job_log_opens_at_its_newest_lines_and_loads_earlier_ones_to_the_start(
    admin_ui, api
):
    _, session = enrol(api)
    job = api.submit(name="train", command=["python", "train.py"], resources={"gpus": 1})
    assignment = api.start_task(session)
    total = logs.SHOWN + 50
    api.task_call(
        session, assignment, "logs", lines=[["stdout", f"line {i}"] for i in range(total)]
    )
    page = admin_ui.text(f"/ui/jobs/{job['id']}")
    assert _shown(page) == [
        f"line {i}" for i in range(50, total)
    ]  # the newest, oldest of them first
    earlier = admin_ui.text(_hx_get(page, "log-earlier"))
    assert 'hx-swap-oob="afterbegin:#log-lines"' in earlier
    assert _shown(earlier) == [f"line {i}" for i in range(50)]
    assert "From the start of the log." in earlier and _hx_get(earlier, "log-earlier") is None
    assert admin_ui.get(f"/ui/jobs/{job['id']}/log?before=x").status_code == 400
    # Its state and tasks change in place with the log's poll.
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    poll = admin_ui.text(_hx_get(page, "log-poller"))
    assert (
        '<div id="job-live" hx-swap-oob="true">' in poll
        and '<dd id="job-state">succeeded</dd>' in poll
    )
    assert 'id="tasks-live" hx-swap-oob="true"' in poll and "the log is complete" in poll


def test_an_instance_log_box_follows_new_lines_while_it_runs(admin_ui, api):
    _, session = enrol(api)
    inst = create(api, name="web")
    assignment = start(api, session)
    page = admin_ui.text(f"/ui/instances/{inst['id']}")
    assert 'data-empty="No output yet."' in page and _hx_get(page, "log-earlier") is None
    poll = _hx_get(page, "log-poller")
    api.task_call(session, assignment, "logs", lines=[["stdout", "serving on 8888"]])
    partial = admin_ui.text(poll)
    assert "serving on 8888" in partial and 'hx-swap-oob="beforeend:#log-lines"' in partial
    assert "serving on 8888" not in admin_ui.text(_hx_get(partial, "log-poller"))
    assert api.post(f"/api/v1/instances/{inst['id']}/stop").status_code == 200
    api.task_call(session, assignment, "finish", outcome="cancelled")
    quiet = admin_ui.text(poll)
    assert _hx_get(quiet, "log-poller") is None and "it runs no process now" in quiet


def test_a_job_log_box_searches_the_whole_output_pages_back_into_the_store_and_downloads_it(
    admin_ui, api
):
    from tests.fleetd.services.workloads.test_output import _batch, _chunk, _lines, _upload

    _, session = enrol(api)
    job = api.submit(name="chatty", command=["python", "train.py"], resources={"gpus": 1})
    assignment = api.start_task(session)
    # 5,000 lines; fleetd keeps the text of the first 100 and the newest: the middle is stored.
    _batch(api, session, assignment, 0, 5000, _lines(4000, 1000))
    _upload(api, session, assignment, 0, _chunk(0, 5000, "stdout"), 5000)
    page = admin_ui.text(f"/ui/jobs/{job['id']}")
    assert 'role="search"' in page and f"/ui/jobs/{job['id']}/output" in page
    earlier = admin_ui.text(_hx_get(page, "log-earlier"))
    shown = re.findall(r'<span class="rank">\d+</span>(stdout line \d+)', earlier)
    assert shown == [f"stdout line {i}" for i in range(4800 - logs.SHOWN, 4800)]  # from the store
    found = admin_ui.text(f"/ui/jobs/{job['id']}/log/search?q=line 2345")
    assert "1 line found" in found and "stdout line 2345" in found
    found = admin_ui.text(f"/ui/jobs/{job['id']}/log/search?q=line 23[0-9]{{2}}$&regex=true")
    assert "100 lines found" in found
    bad = admin_ui.text(f"/ui/jobs/{job['id']}/log/search?q=(x&regex=true")
    assert 'role="alert"' in bad and "regex" in bad
    whole = admin_ui.get(f"/ui/jobs/{job['id']}/output")
    assert whole.status_code == 200 and "attachment" in whole.headers["Content-Disposition"]
    assert whole.get_data().decode().splitlines() == _lines(0, 5000)
