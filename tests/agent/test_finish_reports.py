"""Finish reports that come together go to fleetd together (agent.task.finish.FinishReports)."""

import threading

from agent.client import Conflict, FleetClient, Unreachable, finish_body
from agent.task.finish import FinishReports
from tests.agent.conftest import wait_until


def _send_all(fleetd, reports, task_ids):
    """Report task_ids[0] while fleetd holds finish calls, then the others while it is on its way;
    returns {task_id: None or the exception its thread got}."""
    outcome = {}

    def send(task_id):
        client = FleetClient(fleetd.url, session_token="fln_s.secret", timeout=30)
        try:
            reports.send(client, task_id, finish_body(1, "succeeded", 0))
            outcome[task_id] = None
        except Exception as exc:  # what the caller (report_finish) would see
            outcome[task_id] = exc
        finally:
            client.close()

    fleetd.hold_finish.clear()
    threads = [threading.Thread(target=send, args=(task_ids[0],))]
    threads[0].start()
    fleetd.wait_for(
        lambda: any(path.endswith("/finish") for _m, path, _b in fleetd.calls), 10, "the first call"
    )
    for task_id in task_ids[1:]:
        threads.append(threading.Thread(target=send, args=(task_id,)))
        threads[-1].start()
    wait_until(lambda: len(reports._queue) == len(task_ids) - 1, 10, message="the others waiting")
    fleetd.hold_finish.set()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    return outcome


def _finish_calls(fleetd):
    return [(path, body) for method, path, body in fleetd.calls if path.endswith("/finish")]


def test_reports_that_wait_for_a_call_go_in_the_next_one(fleetd):
    reports = FinishReports()
    ids = ["t0", "t1", "t2", "t3"]
    assert _send_all(fleetd, reports, ids) == dict.fromkeys(ids)
    calls = _finish_calls(fleetd)
    assert calls[0] == (
        "/api/v1/agent/tasks/t0/finish",
        {"epoch": 1, "outcome": "succeeded", "exit_code": 0},
    )
    assert len(calls) == 2 and calls[1][0] == "/api/v1/agent/finish"
    assert sorted(f["task_id"] for f in calls[1][1]["finishes"]) == ["t1", "t2", "t3"]
    assert sorted(fleetd.finished) == ids
    assert (
        sum(len(body["finishes"]) if "finishes" in body else 1 for _path, body in calls) == 4
    )  # 4 in 2 calls
    # Nothing on its way: the next report goes at once, alone, by the single-finish route.
    client = FleetClient(fleetd.url, session_token="fln_s.secret")
    reports.send(client, "t4", finish_body(1, "failed", 2))
    client.close()
    assert _finish_calls(fleetd)[-1] == (
        "/api/v1/agent/tasks/t4/finish",
        {"epoch": 1, "outcome": "failed", "exit_code": 2},
    )


def test_a_refused_report_fails_only_its_own_thread(fleetd):
    fleetd.fenced.add("t2")
    outcome = _send_all(fleetd, FinishReports(), ["t0", "t1", "t2", "t3"])
    assert isinstance(outcome.pop("t2"), Conflict)
    assert outcome == dict.fromkeys(["t0", "t1", "t3"])
    assert sorted(fleetd.finished) == ["t0", "t1", "t3"]


def test_an_outage_fails_every_report_of_the_call_for_a_retry(fleetd):
    reports = FinishReports()
    fleetd.down.add("finish")
    outcome = _send_all(fleetd, reports, ["t0", "t1", "t2"])
    assert all(isinstance(exc, Unreachable) for exc in outcome.values()) and len(outcome) == 3
    fleetd.down.clear()
    assert _send_all(fleetd, reports, ["t0", "t1", "t2"]) == dict.fromkeys(["t0", "t1", "t2"])
    assert sorted(fleetd.finished) == ["t0", "t1", "t2"]


def test_a_fleetd_without_the_route_gets_the_reports_one_by_one(fleetd):
    fleetd.finish_batches = False
    reports = FinishReports()
    assert _send_all(fleetd, reports, ["t0", "t1", "t2"]) == dict.fromkeys(["t0", "t1", "t2"])
    paths = [path for path, _body in _finish_calls(fleetd)]
    assert paths.count("/api/v1/agent/finish") == 1  # tried once, then never again
    assert sorted(p for p in paths if p != "/api/v1/agent/finish") == [
        f"/api/v1/agent/tasks/t{i}/finish" for i in range(3)
    ]
    assert not reports.batch
    assert sorted(fleetd.finished) == ["t0", "t1", "t2"]
