#!/usr/bin/env python3
"""The liveness sweep at scale, in one process: N ready nodes x 8 H100 written into the tables (as
bench/scale_inprocess.py does), every one heard from (none overdue, as in a healthy fleet), then
the `liveness_sweep` background task (every 5 s under `fleetd serve`, on its event loop) timed
after a first one that writes every heartbeat time down, best and worst of --rounds; then with a
tenth of the nodes silent past TTL + grace (the one sweep that declares them lost). fleetd's
clock. Under `fleetd serve` a sweep gives the event loop away between its pieces (rt.pause): the
longest piece is how long it holds heartbeats up, printed for the first sweep and the one that
declares nodes lost.

    .venv/bin/python bench/liveness_sweep.py --nodes 100000
"""

import argparse
import datetime as dt
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.scale_inprocess import insert_nodes  # noqa: E402
from fleetd.app import create_app  # noqa: E402
from fleetd.background import liveness_sweep  # noqa: E402
from fleetd.clock import Clock  # noqa: E402
from fleetd.db import database, open_database, upgrade  # noqa: E402
from fleetd.services.identity.tokens import issue_first_admin_token  # noqa: E402
from fleetd.settings import Settings  # noqa: E402


class _Clock(Clock):
    """fleetd's clock, moved on by the bench."""

    def __init__(self):
        super().__init__()
        self.offset = 0.0

    def now(self):
        return super().now() + dt.timedelta(seconds=self.offset)

    def monotonic(self):
        return super().monotonic() + self.offset


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings.load(environ={}, data_dir=data_dir, sqlite_synchronous="OFF")
        db = open_database(settings.database_url, settings.sqlite_synchronous)
        upgrade(db)
        clock = _Clock()
        app = create_app(settings, clock=clock, db=db)
        rt = app.extensions["fleetd"]
        with database.connection_context():
            admin = issue_first_admin_token(clock.now())
        headers = {"Authorization": f"Bearer {admin}"}
        resp = app.test_client().post("/api/v1/fleets", json={"name": "sim"}, headers=headers)
        assert resp.status_code == 201, resp.get_json()
        with app.app_context(), database.connection_context():
            node_ids = insert_nodes(database, args.nodes, "sim")
            clock.offset = 3600.0  # past the start-up grace: a sweep may declare nodes lost
            for node_id in node_ids:
                rt.liveness.touch(node_id)
            rt.inventory.get()
            holds = _Holds()
            rt.pause = holds.pause
            times = []
            holds.start()
            liveness_sweep.run(rt)  # the first writes every node's heartbeat time down
            print(
                f"{args.nodes:,} nodes, the first sweep (every heartbeat time written down): "
                f"{holds.total() * 1000:.0f} ms, the event loop held at most "
                f"{holds.longest() * 1000:.0f} ms at a time"
            )
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                result = liveness_sweep.run(rt)
                times.append(time.perf_counter() - t0)
            assert result["lost"] == 0, result
            print(
                f"{args.nodes:,} nodes, none silent: sweep best {min(times) * 1000:.1f} ms, "
                f"worst {max(times) * 1000:.1f} ms ({args.rounds} sweeps)"
            )
            clock.offset += 600.0  # every node silent for 10 minutes ...
            for node_id in node_ids[args.nodes // 10 :]:  # ... but nine in ten heard again
                rt.liveness.touch(node_id)
            holds.start()
            result = liveness_sweep.run(rt)
            print(
                f"a tenth silent: the sweep that declares them lost {holds.total() * 1000:.0f} ms, "
                f"{result['lost']:,} lost; the event loop held at most "
                f"{holds.longest() * 1000:.1f} ms at a time"
            )


class _Holds:
    """The stretches of one sweep between its pauses (rt.pause, gevent.sleep under fleetd serve)."""

    def start(self):
        self.begun = self.last = time.perf_counter()
        self.stretches = []

    def pause(self):
        now = time.perf_counter()
        self.stretches.append(now - self.last)
        self.last = now

    def total(self):
        return time.perf_counter() - self.begun

    def longest(self):
        return max(self.stretches + [time.perf_counter() - self.last])


if __name__ == "__main__":
    main()
