"""A read of every node and GPU gives the event loop away between chunks of rows (fleetd serve's
`pause`), never inside a write transaction, and reads the same inventory as a read in one go."""

import pytest

from fleetd import sql
from fleetd.db import database, write_transaction


@pytest.fixture
def nodes(api):
    api.create_fleet("gpu-a")
    token = api.create_join_token("gpu-a", max_uses=10)
    return [api.ready_node(token, f"gpu-{i}", gpu_count=4)[0] for i in range(5)]


def _read(rt, in_write=False):
    rt.inventory._current = None  # as at start-up: nothing read yet
    with database.connection_context():
        if in_write:
            with write_transaction():
                return rt.inventory.get()
        with database.atomic():
            return rt.inventory.get()


def test_a_full_read_pauses_between_chunks_and_reads_what_a_read_in_one_go_reads(
    app, nodes, monkeypatch
):
    rt = app.extensions["fleetd"]
    whole = _read(rt)
    pauses = []
    monkeypatch.setattr(sql, "FETCH_CHUNK", 3)
    rt.inventory.pause = lambda: pauses.append(1)
    chunked = _read(rt)
    # 5 nodes and 20 GPUs, 3 rows a chunk: 1 pause after each full chunk (1 + 6).
    assert len(pauses) == 1 + 6, pauses
    assert [n.id for n in chunked.nodes] == [n.id for n in whole.nodes] == sorted(nodes)
    assert chunked.gpus == whole.gpus and chunked.models == whole.models


def test_a_read_inside_a_write_transaction_never_pauses(app, nodes, monkeypatch):
    rt = app.extensions["fleetd"]
    pauses = []
    monkeypatch.setattr(sql, "FETCH_CHUNK", 3)
    rt.inventory.pause = lambda: pauses.append(1)
    inventory = _read(rt, in_write=True)
    assert len(inventory.nodes) == 5 and pauses == []
