"""What active tasks hold, as placement reads it: the active tasks' keys from an index, the rows not
seen before (and those of ended tasks their nodes still report running) by narrow queries, each row
made a Hold once."""

import typing

from fleetd.models import Task
from fleetd.services.placement.terms import JobTerms
from fleetd.services.workloads.lifecycle import ACTIVE_TASK_STATES
from fleetd.sql import Statement


class Hold(typing.NamedTuple):
    """A task that holds capacity (active, or ended here but still reported running by its node).

    A tuple, not a model: a scheduling pass reads every active task, and with a deep backlog
    that is thousands of rows per pass.
    """

    id: str
    job_id: str
    rank: int
    node_id: str
    epoch: int
    state: str
    gpus: list
    job: JobTerms
    run_as: str | None = None  # as stored (JSON text): only the allocation view reads it
    link_class: str | None = None  # its GPUs' weakest link: only the allocation view reads it


def _hold_columns():
    return Task.select(
        Task.id,
        Task.job,
        Task.rank,
        Task.node,
        Task.epoch,
        Task.state,
        Task.gpus,
        Task.run_as,
        Task.link_class,
    )


_ACTIVE_HOLDS = Statement(lambda v: _hold_columns().where(Task.state.in_(ACTIVE_TASK_STATES)))
# Which tasks are active, in which epoch and state: from the index of (state, id, epoch) alone.
_ACTIVE_KEYS = Statement(
    lambda v: Task.select(Task.id, Task.epoch, Task.state).where(Task.state.in_(ACTIVE_TASK_STATES))
)

_BY_ID_CHUNK = 32  # task ids per statement that reads tasks by id: 32 shapes at most
# Past this many rows not seen before (the first read after a start), one read of every active
# row costs less than reading them by id.
_READ_ALL_PAST = 2000


def _by_ids_statement(count, active):
    def build(v):
        where = Task.id.in_([v(f"id{i}") for i in range(count)])
        state = Task.state.in_ if active else Task.state.not_in
        return _hold_columns().where(where & state(ACTIVE_TASK_STATES))

    return Statement(build)


_ENDED_HOLDS = {n: _by_ids_statement(n, active=False) for n in range(1, _BY_ID_CHUNK + 1)}
_ACTIVE_BY_ID = {n: _by_ids_statement(n, active=True) for n in range(1, _BY_ID_CHUNK + 1)}


# A task's GPUs as stored (JSON text) -> as parsed: a pass reads every active task's, and those of
# one task do not change while it holds them, so each is parsed once rather than at every pass (at
# 10,000 nodes, tens of thousands of JSON documents a pass). Shared and never changed by readers;
# emptied when full.
_GPUS_PARSED: dict[str, list] = {}
_GPUS_PARSED_MAX = 200_000


def _parsed_gpus(raw):
    if not isinstance(raw, str):
        return Task.gpus.python_value(raw) or []
    found = _GPUS_PARSED.get(raw)
    if found is None:
        if len(_GPUS_PARSED) >= _GPUS_PARSED_MAX:
            _GPUS_PARSED.clear()
        found = _GPUS_PARSED[raw] = Task.gpus.python_value(raw) or []
    return found


# The active tasks' Holds of the last read, by (id, epoch, state). A task's row is written whole
# when it is placed, which moves its epoch on, and changes while active only in its state and in
# columns a Hold does not keep (delivered_at, renewed_at, pid...): a key read again is the same
# Hold, made once. Its job's terms never change. Replaced at every read, so it holds no more.
_ACTIVE: dict[tuple, Hold] = {}


def load_holds(terms_cache, ended=None):
    """Hold rows of the active tasks, or of those of the task ids in `ended` that are no longer
    active: narrow queries compiled once, job terms from `terms_cache` (rt.terms).

    The active tasks are read as keys from an index; only the rows of keys not seen at the last
    read are read whole. Under PostgreSQL's read committed each statement sees its own moment: a
    row read whole is kept by its own key, whatever the index said of it a moment before.
    """
    global _ACTIVE
    if ended is not None:
        rows = []
        for start in range(0, len(ended), _BY_ID_CHUNK):
            chunk = ended[start : start + _BY_ID_CHUNK]
            rows += _ENDED_HOLDS[len(chunk)].raw_tuples(
                **{f"id{i}": task_id for i, task_id in enumerate(chunk)}
            )
        return _hold_rows(terms_cache, rows)
    known = _ACTIVE
    keys = [tuple(key) for key in _ACTIVE_KEYS.raw_tuples()]
    missing = [key[0] for key in keys if key not in known]
    if len(missing) > _READ_ALL_PAST:
        rows = _ACTIVE_HOLDS.raw_tuples()
    else:
        rows = []
        for start in range(0, len(missing), _BY_ID_CHUNK):
            chunk = missing[start : start + _BY_ID_CHUNK]
            rows += _ACTIVE_BY_ID[len(chunk)].raw_tuples(
                **{f"id{i}": task_id for i, task_id in enumerate(chunk)}
            )
    made = {hold.id: hold for hold in _hold_rows(terms_cache, rows)}
    fresh = {}
    for key in keys:
        hold = known.get(key) or made.get(key[0])
        if hold is not None:
            fresh[(hold.id, hold.epoch, hold.state)] = hold
    _ACTIVE = fresh
    return list(fresh.values())


def _hold_rows(terms_cache, rows):
    """The Holds of these rows; a row whose job's terms cannot be read is left out."""
    terms = terms_cache.get_many(list({row[1] for row in rows}))
    return [_hold(row, terms) for row in rows if row[1] in terms]


def _hold(row, terms):
    task_id, job_id, rank, node_id, epoch, state, gpus, run_as, link_class = row
    return Hold(
        task_id,
        job_id,
        rank,
        node_id,
        epoch,
        state,
        _parsed_gpus(gpus),
        terms[job_id],
        run_as,
        link_class,
    )
