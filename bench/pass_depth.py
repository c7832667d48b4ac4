#!/usr/bin/env python3
"""A scheduling pass's pieces at depth, in one process, on a data dir that `bench/queue_depth.py
--keep DIR` built (10,000 nodes, 100,000 jobs, 21,335 of them running): the first pass after a
start, a full pass (every parked group asked), a kicked pass (parked groups skipped), the
periodic pass (parked groups asked again after 30 s), and what each builds (the ClusterState, its
read of the active tasks, the sums of what they hold), cluster status and its GPU summary. Best
of three, milliseconds, fleetd's own clock (no HTTP: bench/queue_depth.py measures that).

    .venv/bin/python bench/queue_depth.py --keep /tmp/qd     # once: builds it (minutes)
    .venv/bin/python bench/pass_depth.py /tmp/qd
"""

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from fleetd.app import create_app  # noqa: E402
from fleetd.clock import Clock  # noqa: E402
from fleetd.db import database, open_database, upgrade  # noqa: E402
from fleetd.models import Node  # noqa: E402
from fleetd.services.placement import capacity, cluster, scheduling, status  # noqa: E402
from fleetd.services.placement.reservations import compute  # noqa: E402
from fleetd.services.placement.task_holds import load_holds  # noqa: E402
from fleetd.settings import Settings  # noqa: E402


def best_of(fn, rounds=3):
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("built", help="a data dir bench/queue_depth.py --keep built")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        shutil.copy(os.path.join(args.built, "fleetd.db"), data_dir)
        settings = Settings.load(
            environ={"FLEETD_NODE_TTL_SECONDS": "86400"},
            data_dir=data_dir,
            sqlite_synchronous="OFF",
        )
        db = open_database(settings.database_url, settings.sqlite_synchronous)
        upgrade(db)  # a build kept by an earlier checkout
        app = create_app(settings, clock=Clock(), db=db)
        rt = app.extensions["fleetd"]
        rt.scheduler.kick = lambda *a, **k: False
        recheck = settings.scheduler_parked_recheck_seconds
        with app.app_context(), database.connection_context():
            for (node_id,) in Node.select(Node.id).tuples():
                rt.liveness.touch(node_id)
            out = {"first pass after a start": best_of(lambda: scheduling.run_pass(rt), 1)}
            out["full pass"] = best_of(lambda: scheduling.run_pass(rt))
            out["kicked pass"] = best_of(lambda: scheduling.run_pass(rt, full=False))
            out["periodic pass"] = best_of(lambda: scheduling.run_pass(rt, recheck_after=recheck))
            out["ClusterState"] = best_of(lambda: cluster.current_state(rt))
            state = cluster.current_state(rt)
            out["its read of the active tasks"] = best_of(lambda: load_holds(rt.terms))
            out["their holds summed from nothing"] = best_of(lambda: compute(state.tasks))
            out["cluster status"] = best_of(lambda: status.cluster_status(state))
            out["its GPU summary"] = best_of(
                lambda: capacity.gpu_summary(state, state.queued_demand())
            )
        for name, ms in out.items():
            print(f"{name:36s} {ms:9.1f} ms")


if __name__ == "__main__":
    main()
