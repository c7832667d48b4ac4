"""What active tasks hold, as placement reads it (services.placement.task_holds): the active tasks
are read as (id, epoch, state) keys from an index, and only rows not seen before are read whole;
whatever the path, the holds are those a read of every row gives."""

import pytest

from fleetd.db import database
from fleetd.models import Task
from fleetd.services.placement import task_holds
from fleetd.services.placement.task_holds import load_holds


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    return api.create_join_token("gpu-a")


def _holds(api):
    rt = api.app.extensions["fleetd"]
    with api.app.app_context(), database.connection_context():
        return {h.id: (h.node_id, h.epoch, h.state, h.gpus) for h in load_holds(rt.terms)}


def _every_row(api):
    """The holds as one read of every active row gives them, nothing kept from before."""
    kept = task_holds._ACTIVE
    task_holds._ACTIVE = {}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(task_holds, "_READ_ALL_PAST", -1)
            return _holds(api)
    finally:
        task_holds._ACTIVE = kept


def test_holds_follow_tasks_that_start_end_and_come_back_in_a_new_epoch(api, fleet):
    _, session = api.ready_node(fleet, "n1", gpu_count=2)
    jobs = [api.submit(name=f"j{i}", resources={"gpus": 1}) for i in range(2)]
    assert _holds(api) == _every_row(api)
    first = _holds(api)
    assert {state for _, _, state, _ in first.values()} == {"assigned"}
    assert len(first) == 2 and all(gpus for *_, gpus in first.values())

    started = api.start_task(session)  # assigned -> running: the same epoch, a new key
    after = _holds(api)
    assert after[started["task_id"]][2] == "running"
    assert after == _every_row(api)

    # The task ends, the other job is cancelled: neither is held any more.
    api.task_call(session, started, "finish", outcome="succeeded", exit_code=0)
    ended = _holds(api)
    assert started["task_id"] not in ended and len(ended) == 1
    assert ended == _every_row(api)
    assert api.post(f"/api/v1/jobs/{jobs[1]['id']}/cancel").status_code == 200
    assert _holds(api) == _every_row(api)


def test_a_row_read_whole_is_kept_by_its_own_key_when_it_changed_after_the_index_read(
    api, fleet, monkeypatch
):
    api.ready_node(fleet, "n1", gpu_count=1)
    api.submit(name="j", resources={"gpus": 1})
    task_holds._ACTIVE = {}  # as after a start: every row is new
    rt = api.app.extensions["fleetd"]

    # The index says "assigned"; by the time the row is read whole (read committed: a statement
    # of its own) the node has started it.
    keys = task_holds._ACTIVE_KEYS.raw_tuples

    def keys_then_start(**params):
        found = keys(**params)
        Task.update(state="running").where(Task.id == found[0][0]).execute()  # another writer
        return found

    monkeypatch.setattr(task_holds._ACTIVE_KEYS, "raw_tuples", keys_then_start)
    with api.app.app_context(), database.connection_context():
        holds = load_holds(rt.terms)
    assert [h.state for h in holds] == ["running"]  # held still, as the row now says
    monkeypatch.undo()
    assert [h.state for h in load_holds_in(api)] == ["running"]


def load_holds_in(api):
    rt = api.app.extensions["fleetd"]
    with api.app.app_context(), database.connection_context():
        return load_holds(rt.terms)


def test_many_new_rows_are_read_in_one_statement_and_a_few_by_id(api, fleet, monkeypatch):
    _, session = api.ready_node(fleet, "n1", gpu_count=8)
    for i in range(8):
        api.submit(name=f"j{i}", resources={"gpus": 1})
    reads = []
    every = task_holds._ACTIVE_HOLDS.raw_tuples
    by_id = {n: s.raw_tuples for n, s in task_holds._ACTIVE_BY_ID.items()}
    monkeypatch.setattr(
        task_holds._ACTIVE_HOLDS, "raw_tuples", lambda **p: reads.append("all") or every(**p)
    )
    for n, statement in task_holds._ACTIVE_BY_ID.items():
        monkeypatch.setattr(
            statement,
            "raw_tuples",
            lambda _n=n, **p: reads.append(_n) or by_id[_n](**p),
        )
    monkeypatch.setattr(task_holds, "_READ_ALL_PAST", 4)
    task_holds._ACTIVE = {}
    assert len(load_holds_in(api)) == 8 and reads == ["all"]
    reads.clear()
    assert len(load_holds_in(api)) == 8 and reads == []  # nothing new: the index alone
    api.start_task(session)
    api.start_task(session)
    assert len(load_holds_in(api)) == 8 and reads == [2]  # two rows changed state
