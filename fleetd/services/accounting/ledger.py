"""The usage ledger: what each run of a workload held, used and cost, priced piecewise.

Runs are accounted off the request path by the `usage` background task (leader only, fenced): each
pass moves every open run's row from its `accounted_until` to now (or to the run's end) in write
transactions of at most BATCH runs, adding allocated GPU-seconds, utilisation-weighted GPU-seconds
(from the GPU samples stored in that interval), and cost at the prices in force (PriceChange,
integrated piecewise) to the run's row and to the sums reports read
(fleetd.services.accounting.rollups: per day; per workload and day; per workload and month, all
fleets together and per fleet). A pass that fails or is fenced commits nothing of its batch; the
next one starts again from `accounted_until`, so a restart or a failover loses and doubles nothing,
and a price set later never rewrites what was accounted. The only write on the request path is a
UsageMark as a task ends (a requeue clears the task's own times). Instance volumes accrue storage
cost per GB-month (the storage price, months in UTC) from their instance's first start (its node
made the volume, and it fitted) to their deletion. Between passes, runs_to_date shows a workload's
rows as the next pass will leave them.
"""

import threading

from fleetd.db import write_transaction
from fleetd.models import (
    Gpu,
    GpuSample,
    Instance,
    Job,
    Node,
    PriceChange,
    Task,
    TaskState,
    UsageMark,
    UsageRecord,
)
from fleetd.services.accounting import rollups
from fleetd.services.accounting.periods import GPU, STORAGE, split_days
from fleetd.services.accounting.volumes import flush_volumes
from fleetd.sql import Statement, insert_row
from fleetwire.mig import gpu_fraction

BATCH = 500  # runs accounted per write transaction

# The GPU sampler (services.fleet_ops.metrics.record_sample) stamps and commits its samples holding
# this lock, and a pass reads its clock holding it: a sample stamped before a pass's `now` has
# committed before that pass reads samples, and one stamped after it is the next pass's. Without it,
# a sample stamped just before a pass began but committed after the pass read (`fleetd serve`: the
# sampler waits on the thread pool while the pass runs, both every 60 s, at the same moments) fell
# before the next pass's start and never counted.
SAMPLES_LOCK = threading.Lock()


_PRICE_CHANGES = Statement(lambda v: PriceChange.select().order_by(PriceChange.at, PriceChange.id))


class PriceBook:
    """Every price as it was set (PriceChange), to look up the one in force over any interval."""

    def __init__(self, rows):
        self._changes: dict[
            tuple[str, str], list[tuple]
        ] = {}  # (kind, model) -> [(at, price)] oldest first
        for row in rows:
            self._changes.setdefault((row.kind, row.model), []).append((row.at, row.price))

    @classmethod
    def load(cls):
        """The whole history (a few rows per GPU model and price change)."""
        return cls(_PRICE_CHANGES.rows())

    def at(self, kind, model, when):
        """The price in force at `when` (None: unpriced)."""
        price = None
        for at, value in self._changes.get((kind, model), ()):
            if at > when:
                break
            price = value
        return price

    def pieces(self, kind, model, start, end):
        """[(a, b, price)] covering [start, end), cut where the price changed."""
        cuts = [at for at, _ in self._changes.get((kind, model), ()) if start < at < end]
        bounds = [start] + cuts + [end]
        return [(a, b, self.at(kind, model, a)) for a, b in zip(bounds, bounds[1:]) if a < b]


def record_price(now, kind, model, price):
    """Remember that a price changed at `now` (inside the caller's transaction): GPU types per
    GPU-hour (kind "gpu"), storage per GB-month (kind "storage", model "")."""
    PriceChange.create(at=now, kind=kind, model=model or "", price=price)


def storage_price(when=None):
    """The storage price per GB-month in force (now, or at `when`), or None."""
    query = PriceChange.select(PriceChange.price).where(
        (PriceChange.kind == STORAGE) & (PriceChange.model == "")
    )
    if when is not None:
        query = query.where(PriceChange.at <= when)
    row = query.order_by(PriceChange.at.desc(), PriceChange.id.desc()).first()
    return row.price if row is not None else None


def record_run_end(task, now, attempt=None):
    """A task that ran ends (inside the transaction that ends it): the ledger accounts the run to
    `now` at its next pass. The task's node and GPUs are kept here, as a requeue clears them.
    `attempt`: its job's attempt, when the caller read the job already."""
    if task.started_at is None:
        return
    if attempt is None:
        attempt = (_JOB_ATTEMPT.raw_tuples(id=task.job_id) or [(1,)])[0][0]
    mark = dict(task_id=task.id, epoch=task.epoch, node_id=task.node_id or "", gpus=task.gpus or [])
    insert_row(UsageMark, dict(mark, attempt=attempt, started_at=task.started_at, ended_at=now))


_JOB_ATTEMPT = Statement(lambda v: Job.select(Job.attempt).where(Job.id == v("id")).limit(1))


def run_price(record, book, when):
    """Per GPU-hour at `when`: a spot run's bid, else its GPU model's price (None: unpriced)."""
    if record.priority_class == "spot" and record.bid is not None:
        return record.bid
    return book.at(GPU, record.gpu_model, when) if record.gpu_model else None


def _price_pieces(record, book, start, end):
    if record.priority_class == "spot" and record.bid is not None:
        return [(start, end, record.bid)]
    if not record.gpu_model:
        return [(start, end, None)]
    return book.pieces(GPU, record.gpu_model, start, end)


class _Pass:
    """One pass's state: the price book, the GPU samples read, and the sums to add to the rollups
    (per day; per workload and day; per workload and month)."""

    def __init__(self, now, book=None):
        self.now = now
        self.book = book or PriceBook.load()
        self.sums = rollups.empty()
        self.samples = {}  # uuid -> [(at, utilisation)]

    def load_samples(self, uuids, since):
        """The stored utilisation samples of these GPUs since `since` (before now)."""
        self.samples = {}
        uuids = sorted(uuids)
        for i in range(0, len(uuids), 500):
            query = (
                GpuSample.select(GpuSample.uuid, GpuSample.at, GpuSample.utilization_percent)
                .where(
                    GpuSample.uuid.in_(uuids[i : i + 500])
                    & (GpuSample.at >= since)
                    & (GpuSample.at < self.now)
                    & GpuSample.utilization_percent.is_null(False)
                )
                .tuples()
                .execute()
            )
            for uuid, at, util in query:
                self.samples.setdefault(uuid, []).append((at, util))

    def add(self, at, kind, record, allocated=0.0, used=0.0, sampled=0.0, cost=0.0, runs=0):
        """Add to the rollups' sums of `at`'s day and month (rollups.add)."""
        rollups.add(self.sums, at, kind, record, (allocated, used, sampled, cost, runs))

    def accrue(self, record, start, end):
        """Add [start, end) of a run to its row and to the day sums."""
        uuids = list(record.gpu_uuids or [])
        share = record.gpus / len(uuids) if uuids else 0.0
        for a, b in split_days(start, end):
            seconds = (b - a).total_seconds()
            allocated = record.gpus * seconds
            used = sampled = 0.0
            for uuid in uuids:
                values = [util for at, util in self.samples.get(uuid, ()) if a <= at < b]
                if values:
                    sampled += share * seconds
                    used += share * seconds * min(100.0, max(0.0, sum(values) / len(values))) / 100
            cost = sum(
                record.gpus * (pb - pa).total_seconds() / 3600 * (price or 0.0)
                for pa, pb, price in _price_pieces(record, self.book, a, b)
            )
            record.gpu_seconds += allocated
            record.used_gpu_seconds += used
            record.sampled_gpu_seconds += sampled
            record.cost += cost
            self.add(a, record.kind, record, allocated, used, sampled, cost)
        record.price_per_hour = run_price(record, self.book, end)

    def write_days(self):
        """Add this batch's sums to the rollups (inside the batch's transaction), the same
        transaction that moves the ledger's rows."""
        rollups.write(self.sums)


def record_for_run(task_id, epoch, started_at, node_id, gpus, attempt=None):
    """A ledger row for this run (not saved, nothing accounted yet), or None when its job is
    gone."""
    task = Task.select(Task.id, Task.job, Task.rank).where(Task.id == task_id).first()
    job = Job.get_or_none_by_id(task.job_id) if task is not None else None
    if job is None:
        return None
    spec = job.spec or {}
    uuids = [g["uuid"] for g in gpus or [] if isinstance(g, dict) and g.get("uuid")]
    requested = (spec.get("resources") or {}).get("gpus") or 0
    mig = (spec.get("resources") or {}).get("mig")
    if mig and uuids:  # each MIG device is its profile's share of a GPU, never a whole one
        requested = len(uuids) * gpu_fraction(mig)
    model = Gpu.select(Gpu.model).where(Gpu.uuid == uuids[0]).first() if uuids else None
    node = Node.select(Node.fleet).where(Node.id == node_id).first() if node_id else None
    instance = job.instance_id
    return UsageRecord(
        id=f"{task_id}.{epoch}",
        kind="instance" if instance else "job",
        workload_id=instance or job.id,
        workload_name=job.name,
        task_id=task_id,
        job_id=job.id,
        rank=task.rank,
        attempt=_run_number(instance) if instance else (attempt or job.attempt),
        owner=job.owner,
        owner_token_id=job.owner_token_id,
        team=job.team or "",
        project=job.project or "",
        fleet=node.fleet_id if node is not None else "",
        node_id=node_id or "",
        gpu_model=model.model if model is not None else "",
        priority_class=job.priority_class,
        gpus=float(requested if requested and uuids else len(uuids)),
        gpu_uuids=uuids,
        bid=spec.get("bid"),
        started_at=started_at,
        accounted_until=started_at,
    )


def _run_number(instance_id):
    inst = Instance.select(Instance.runs).where(Instance.id == instance_id).first()
    return inst.runs if inst is not None else 1


def _account(run, record, until, ended_at=None):
    """Move a run's row to `until` (and close it at `ended_at`); returns whether it was written."""
    if record.ended_at is not None:
        return False  # closed already (a mark seen twice, or a run a pass already ended)
    if until > record.accounted_until:
        run.accrue(record, record.accounted_until, until)
        record.accounted_until = until
    if ended_at is not None:
        record.ended_at = max(ended_at, record.started_at)
    return True


def _records(ids):
    return {r.id: r for r in UsageRecord.select().where(UsageRecord.id.in_(ids))} if ids else {}


def _save(records, created):
    for record in records:
        if record.id in created:
            record.save(force_insert=True)
        else:
            record.save()


def _flush_ended(run, batch):
    """Account runs that ended (their marks), BATCH per transaction; returns how many."""
    done = 0
    for _ in range(UsageMark.select().count() // batch + 1):  # each round deletes the marks it read
        with write_transaction():
            marks = list(UsageMark.select().order_by(UsageMark.id).limit(batch))
            if not marks:
                return done
            known = _records([f"{m.task_id}.{m.epoch}" for m in marks])
            run.load_samples(
                {g.get("uuid") for m in marks for g in m.gpus or [] if isinstance(g, dict)},
                min(
                    known[f"{m.task_id}.{m.epoch}"].accounted_until
                    if f"{m.task_id}.{m.epoch}" in known
                    else m.started_at
                    for m in marks
                ),
            )
            created: set[str] = set()
            touched: dict[str, UsageRecord] = {}
            for mark in marks:
                key = f"{mark.task_id}.{mark.epoch}"
                record = touched.get(key) or known.get(key)
                if record is None:
                    record = record_for_run(
                        mark.task_id,
                        mark.epoch,
                        mark.started_at,
                        mark.node_id,
                        mark.gpus,
                        mark.attempt,
                    )
                    if record is None:
                        continue
                    created.add(key)
                    run.add(record.started_at, record.kind, record, runs=1)
                if _account(run, record, max(mark.ended_at, record.started_at), mark.ended_at):
                    touched[key] = record
            _save(touched.values(), created)
            run.write_days()
            UsageMark.delete().where(UsageMark.id.in_([m.id for m in marks])).execute()
            done += len(marks)
        if len(marks) < batch:
            return done
    return done  # marks written meanwhile wait for the next pass


def _flush_running(run, batch):
    """Account running tasks up to now, BATCH per transaction; returns how many."""
    ids = [
        t.id
        for t in Task.select(Task.id).where(
            (Task.state == TaskState.RUNNING.value) & Task.started_at.is_null(False)
        )
    ]
    for i in range(0, len(ids), batch):
        with write_transaction():
            tasks = list(
                Task.select(Task.id, Task.epoch, Task.node, Task.gpus, Task.started_at).where(
                    Task.id.in_(ids[i : i + batch])
                    & (Task.state == TaskState.RUNNING.value)
                    & Task.started_at.is_null(False)
                )
            )
            known = _records([f"{t.id}.{t.epoch}" for t in tasks])
            # samples from where each run's row stands (a long run's older samples were counted
            # before)
            since = min(
                (
                    known[f"{t.id}.{t.epoch}"].accounted_until
                    if f"{t.id}.{t.epoch}" in known
                    else t.started_at
                    for t in tasks
                    if t.started_at is not None
                ),
                default=run.now,
            )  # all: the query says so
            run.load_samples(
                {g.get("uuid") for t in tasks for g in t.gpus or [] if isinstance(g, dict)}, since
            )
            created, touched = set(), []
            for task in tasks:
                key = f"{task.id}.{task.epoch}"
                record = known.get(key)
                if record is None:
                    record = record_for_run(
                        task.id, task.epoch, task.started_at, task.node_id, task.gpus
                    )
                    if record is None:
                        continue
                    created.add(key)
                    run.add(record.started_at, record.kind, record, runs=1)
                if _account(run, record, max(run.now, record.started_at)):
                    touched.append(record)
            _save(touched, created)
            run.write_days()
    return len(ids)


# What runs_to_date reads, compiled once: a job's cost is read at every view of the job.
def _tasks_of(v):
    """The tasks of a job, or of every run of an instance."""
    return Task.select(Task.id).where(
        Task.job.in_(
            Job.select(Job.id).where((Job.id == v("workload")) | (Job.instance_id == v("workload")))
        )
    )


_RECORDS_OF = Statement(
    lambda v: UsageRecord.select().where(UsageRecord.workload_id == v("workload"))
)
_MARKS_OF = Statement(
    lambda v: UsageMark.select().where(UsageMark.task_id.in_(_tasks_of(v))).order_by(UsageMark.id)
)
_RUNNING_OF = Statement(
    lambda v: Task.select(Task.id, Task.epoch, Task.node, Task.gpus, Task.started_at).where(
        Task.id.in_(_tasks_of(v))
        & (Task.state == TaskState.RUNNING.value)
        & Task.started_at.is_null(False)
    )
)


def runs_to_date(workload_id, now, book=None, samples=False):
    """A job's or instance's ledger rows as a pass at `now` would leave them, none saved: the runs
    that ended since the last pass closed at their ends (their marks), the runs started since added,
    the others carried on to `now`. `samples`: their GPUs' samples weigh the stretches added (else
    used and sampled GPU-seconds stand where the last pass left them). Oldest first."""
    run = _Pass(now, book)
    records = {r.id: r for r in _RECORDS_OF.rows(workload=workload_id)}
    marks = _MARKS_OF.rows(workload=workload_id)
    running = _RUNNING_OF.rows(workload=workload_id)
    ends = {}  # row id -> (until, ended at or None)
    for mark in marks:
        key = f"{mark.task_id}.{mark.epoch}"
        if key not in records:
            record = record_for_run(
                mark.task_id, mark.epoch, mark.started_at, mark.node_id, mark.gpus, mark.attempt
            )
            if record is None:
                continue
            records[key] = record
        ends[key] = (max(mark.ended_at, records[key].started_at), mark.ended_at)
    for task in running:
        key = f"{task.id}.{task.epoch}"
        if key not in records:
            record = record_for_run(task.id, task.epoch, task.started_at, task.node_id, task.gpus)
            if record is not None:
                records[key] = record
    open_rows = [r for r in records.values() if r.ended_at is None]
    if samples and open_rows:
        run.load_samples(
            {uuid for r in open_rows for uuid in r.gpu_uuids or []},
            min(r.accounted_until for r in open_rows),
        )
    for record in open_rows:
        until, ended_at = ends.get(record.id, (max(now, record.started_at), None))
        _account(run, record, until, ended_at)
        record.price_per_hour = run_price(
            record, run.book, until
        )  # a run not a second old has one too
    return sorted(records.values(), key=lambda r: (r.started_at, r.id))


def flush(rt, batch=BATCH):
    """One pass of the ledger (the `usage` background task): ended runs, running ones, volumes.
    Returns how many of each it accounted."""
    with SAMPLES_LOCK:  # every sample stamped before `now` is in the database
        now = rt.clock.now()
    run = _Pass(now)
    ended = _flush_ended(run, batch)
    running = _flush_running(run, batch)
    volumes = flush_volumes(run, batch)
    return {"ended": ended, "running": running, "volumes": volumes}
