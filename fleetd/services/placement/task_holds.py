"""What active tasks hold, as placement reads it: one narrow query of the active tasks (and of
ended ones their nodes still report running), each row made a Hold once."""

import json
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

_ENDED_CHUNK = 32  # task ids per statement that reads ended tasks by id: 32 shapes at most


def _ended_holds_statement(count):
    return Statement(
        lambda v: _hold_columns().where(
            Task.id.in_([v(f"id{i}") for i in range(count)]) & Task.state.not_in(ACTIVE_TASK_STATES)
        )
    )


_ENDED_HOLDS = {n: _ended_holds_statement(n) for n in range(1, _ENDED_CHUNK + 1)}


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


# The active tasks' Holds of the last read, by their row as read: a row that reads the same again
# (most of them: a task's row changes only when its state does) is the same Hold, made once. Its
# job's terms never change. Replaced at every read of the active tasks, so it holds no more.
_ACTIVE: dict[tuple, Hold] = {}


def load_holds(terms_cache, ended=None):
    """Hold rows of the active tasks, or of those of the task ids in `ended` that are no longer
    active: narrow queries compiled once, job terms from `terms_cache` (rt.terms)."""
    global _ACTIVE
    if ended is None:
        rows = [_row_key(row) for row in _ACTIVE_HOLDS.raw_tuples()]
        known = _ACTIVE
        missing = [row for row in rows if row not in known]
        made = dict(zip(missing, _hold_rows(terms_cache, missing, keep_order=True)))
        fresh = {}
        for row in rows:
            hold = known.get(row) or made.get(row)
            if hold is not None:
                fresh[row] = hold
        _ACTIVE = fresh
        return list(fresh.values())
    else:
        rows = []
        for start in range(0, len(ended), _ENDED_CHUNK):
            chunk = ended[start : start + _ENDED_CHUNK]
            rows += _ENDED_HOLDS[len(chunk)].raw_tuples(
                **{f"id{i}": task_id for i, task_id in enumerate(chunk)}
            )
    return _hold_rows(terms_cache, rows)


def _row_key(row):
    """A hold row as a hashable key (a driver may give the GPUs' JSON parsed)."""
    gpus = row[6]
    if gpus is None or isinstance(gpus, str):
        return tuple(row)
    return (*row[:6], json.dumps(gpus, sort_keys=True), *row[7:])


def _hold_rows(terms_cache, rows, keep_order=False):
    """The Holds of these rows; a row whose job's terms cannot be read is left out (None in its
    place, with `keep_order`)."""
    terms = terms_cache.get_many(list({row[1] for row in rows}))
    if keep_order:
        return [_hold(row, terms) if row[1] in terms else None for row in rows]
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
