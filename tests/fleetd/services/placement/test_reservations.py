"""What tasks hold, kept between reads (services.placement.reservations): after any sequence of
tasks starting and ending, the kept sums equal a sum made from nothing."""

import random
import types

from fleetd import scheduler
from fleetd.services.placement.reservations import Reservations, compute
from fleetd.services.placement.task_holds import Hold

_JOBS: dict = {}  # job id -> its terms: a job's team and request are the same in every rank


def _hold(rng, n):
    node = f"n{rng.randrange(4)}"
    kind = rng.choice(["whole", "whole", "slice", "mig", "two"])
    uuid = f"GPU-{node}-{rng.randrange(3)}"
    if kind == "whole":
        gpus = [{"uuid": uuid, "exclusive": True, "memory_limit_bytes": 80}]
    elif kind == "two":
        gpus = [{"uuid": f"GPU-{node}-{i}", "exclusive": True} for i in (3, 4)]
    elif kind == "slice":
        gpus = [{"uuid": uuid, "compute_milli": 250, "memory_limit_bytes": 20, "exclusive": False}]
    else:
        gpus = [{"uuid": uuid, "mig_device": f"MIG-{node}-{rng.randrange(7)}", "exclusive": True}]
    # Two ranks of one job sometimes: the job counts once toward its team.
    job_id = f"j{n // 2}" if rng.random() < 0.3 else f"j{n}"
    job = _JOBS.get(job_id)
    if job is None:
        request = scheduler.TaskRequest(
            gpus=rng.choice([1, 2, 0.25]), cpus=rng.choice([0.5, 1, 2]), memory_bytes=n * 10
        )
        job = _JOBS[job_id] = types.SimpleNamespace(
            request=request, team=rng.choice(["vision", "speech"]), priority_class="on-demand"
        )
    state = rng.choice(["running", "running", "assigned", "cancelled"])  # cancelled: stopping
    return Hold(f"t{n}", job_id, 0, node, rng.randrange(1, 3), state, gpus, job)


def _normal(held, node_use, usage):
    return (
        {k: (v[0], v[1], v[2], sorted(v[3])) for k, v in held.items()},
        {k: list(v) for k, v in node_use.items()},
        {k: round(v, 9) for k, v in usage.items()},
    )


def test_the_kept_sums_equal_a_fresh_sum_after_every_change():
    rng = random.Random(7)
    kept = Reservations()
    holds: list = []
    made = 0
    for _ in range(400):
        for _ in range(rng.randrange(4)):  # some tasks start
            holds.append(_hold(rng, made))
            made += 1
        for _ in range(rng.randrange(4)):  # some end
            if holds:
                holds.pop(rng.randrange(len(holds)))
        if holds and rng.random() < 0.1:  # a task comes back under a new epoch
            i = rng.randrange(len(holds))
            holds[i] = holds[i]._replace(epoch=holds[i].epoch + 1)
        if holds and rng.random() < 0.2:  # one is cancelled, its process still running
            i = rng.randrange(len(holds))
            holds[i] = holds[i]._replace(state="cancelled")
        before = _normal(*kept.of(list(holds)))
        assert before == _normal(*compute(holds))


def test_a_read_returns_new_maps_and_never_changes_those_handed_out_before():
    rng = random.Random(3)
    kept = Reservations()
    holds = [_hold(rng, n) for n in range(10)]
    first = kept.of(holds)
    frozen = _normal(*first)
    kept.of(holds[:4] + [_hold(rng, 99)])
    assert _normal(*first) == frozen
