"""Group commit: a write request is answered only after an fsync of the WAL that began after
its writes; one fsync serves every request that wrote while the previous one ran."""

import threading

import pytest

from fleetd import db as fleetd_db
from fleetd.db import GroupCommit
from tests.support import wait_until


class RecordingRun:
    """Runs each sync in the caller, recording when it began relative to the writers."""

    def __init__(self, hold=None):
        self.began = []  # the writers' sequence number seen when each sync began
        self.writes = 0
        self.hold = hold  # an Event a sync waits on: lets writers pile up behind it

    def __call__(self, fn):
        self.began.append(self.writes)
        if self.hold is not None:
            assert self.hold.wait(10)
        fn()


def test_a_write_waits_for_a_sync_that_began_after_it(tmp_path):
    wal = tmp_path / "fleetd.db-wal"
    wal.write_bytes(b"frames")
    run = RecordingRun()
    group = GroupCommit(str(wal), run)
    for i in range(3):
        run.writes += 1
        group.wait()
        assert run.began[-1] == run.writes  # the sync that answered began after this write
    assert group.done == 3


def test_writers_that_queue_behind_a_sync_share_the_next_one(tmp_path):
    wal = tmp_path / "fleetd.db-wal"
    wal.write_bytes(b"frames")
    hold = threading.Event()
    run = RecordingRun(hold)
    group = GroupCommit(str(wal), run)
    first = threading.Thread(target=group.wait)
    first.start()
    wait_until(lambda: run.began, 2, 0.01, "the first sync to begin (it is held)")
    assert run.began == [0]
    run.writes = 8
    waiters = [threading.Thread(target=group.wait) for _ in range(8)]
    for t in waiters:
        t.start()
    hold.set()
    first.join(10)
    for t in waiters:
        t.join(10)
    assert not any(t.is_alive() for t in waiters + [first])
    assert group.done == 2 and run.began == [0, 8]  # eight writers, one more sync, begun after them


def test_no_wal_file_means_nothing_to_sync(tmp_path):
    group = GroupCommit(str(tmp_path / "absent-wal"))
    group.wait()
    assert group.done == 1


@pytest.fixture
def group(tmp_path):
    wal = tmp_path / "fleetd.db-wal"
    wal.write_bytes(b"")
    group = GroupCommit(str(wal))
    fleetd_db.enable_group_commit(group)
    yield group
    fleetd_db.enable_group_commit(None)


def test_requests_that_write_wait_for_a_sync_and_reads_do_not(api, group):
    assert api.get("/api/v1/fleets").status_code == 200
    assert api.get("/api/v1/jobs").status_code == 200
    assert group.done == 0
    assert api.post("/api/v1/fleets", {"name": "gc"}).status_code == 201
    assert group.done == 1
    assert (
        api.post("/api/v1/fleets", {"name": "gc"}).status_code == 409
    )  # nothing written, nothing synced
    assert group.done == 1
    api.submit(name="durable")
    assert group.done == 2


def test_a_request_hands_its_connection_back_before_it_waits_for_the_sync(api, tmp_path):
    wal = tmp_path / "fleetd.db-wal"
    wal.write_bytes(b"")
    held = []

    def run(fn):  # the sync, as the request waits for it
        held.append(not fleetd_db.database.is_closed())
        fn()

    fleetd_db.enable_group_commit(GroupCommit(str(wal), run))
    try:
        assert api.post("/api/v1/fleets", {"name": "gc"}).status_code == 201
        assert api.post("/api/v1/fleets/gc/join-tokens", {}).status_code == 201
    finally:
        fleetd_db.enable_group_commit(None)
    assert held == [False, False]  # the next requests can take it (and its page cache) meanwhile
