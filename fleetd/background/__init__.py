"""Periodic background tasks: one module each, registered here, run by APScheduler."""

import dataclasses
import datetime as dt
import logging
import threading

from fleetd.background import (
    drains,
    gpu_holds,
    leases,
    liveness_sweep,
    metrics_sampler,
    mig_planning,
    retention,
    scheduling,
    storage,
    token_cleanup,
    usage,
    webhooks,
)
from fleetd.db import Fenced
from fleetd.errors import Conflict, NotFound
from fleetd.services.notify.events import FLEETD, acting_as

log = logging.getLogger(__name__)

# Run by every replica; the others only by the leader (a follower's run is skipped).
EVERY_REPLICA = {liveness_sweep.NAME, storage.NAME}

# The registry: (module, the setting that holds its interval in seconds).
REGISTRY = [
    (liveness_sweep, "liveness_sweep_seconds"),
    (drains, "drain_check_seconds"),
    (leases, "lease_sweep_seconds"),
    (gpu_holds, "gpu_hold_check_seconds"),
    (scheduling, "scheduler_interval_seconds"),
    (mig_planning, "mig_plan_seconds"),
    (token_cleanup, "token_cleanup_seconds"),
    (metrics_sampler, "metrics_sample_seconds"),
    (storage, "storage_measure_seconds"),
    (retention, "gc_interval_seconds"),
    (webhooks, "webhook_send_seconds"),
    (usage, "usage_flush_seconds"),
]


@dataclasses.dataclass
class TaskRecord:
    """What is known about one background task's runs."""

    name: str
    description: str
    interval_seconds: float
    func: object
    last_started_at: object = None
    last_finished_at: object = None
    last_status: str | None = None  # "ok", "error" or "running"
    last_result: object = None
    last_error: str | None = None
    next_run_at: object = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    run_at_start: bool = (
        False  # also run once as soon as the scheduler starts (not an interval later)
    )


class TaskRunner:
    """Runs registered tasks on demand or on a schedule, never two runs of one task at once."""

    def __init__(self, app, rt):
        self.app = app
        self.rt = rt
        self.records = {}
        for module, setting in REGISTRY:
            self.records[module.NAME] = TaskRecord(
                name=module.NAME,
                description=module.DESCRIPTION,
                interval_seconds=float(getattr(rt.settings, setting)),
                func=module.run,
                run_at_start=getattr(module, "RUN_AT_START", False),
            )
        self.scheduler = None

    def list(self):
        """All task records, in registry order."""
        self._refresh_next_runs()
        return list(self.records.values())

    def get(self, name):
        """One task record; NotFound for an unknown name."""
        record = self.records.get(name)
        if record is None:
            raise NotFound(f"background task {name!r} not found", {"known": sorted(self.records)})
        self._refresh_next_runs()
        return record

    def run(self, name, wait=True):
        """Run a task now in this thread; Conflict if it is already running."""
        record = self.get(name)
        if not record.lock.acquire(blocking=wait):
            raise Conflict(f"background task {name!r} is already running")
        try:
            record.last_started_at = self.rt.clock.now()
            record.last_status = "running"
            if name not in EVERY_REPLICA and not self.rt.leader.leading():
                record.last_result, record.last_status, record.last_error = (
                    {"skipped": f"replica {self.rt.leader.replica_id} does not lead"},
                    "ok",
                    None,
                )
                record.last_finished_at = self.rt.clock.now()
                return record
            try:
                with self.app.app_context():
                    from fleetd.db import database, fenced_by

                    # fleetd decides, whoever asked; a leader's work is fenced: once another replica
                    # leads, none of its writes commits (the run ends Fenced, recorded as an error).
                    fence = None if name in EVERY_REPLICA else self.rt.leader.fence
                    with database.connection_context(), acting_as(FLEETD), fenced_by(fence):
                        record.last_result = record.func(self.rt)
                record.last_status, record.last_error = "ok", None
            except (
                Fenced
            ) as exc:  # another replica took the lead meanwhile: nothing of this run committed
                log.warning("background task %s: %s", name, exc)
                record.last_status, record.last_error = "error", f"Fenced: {exc}"
            except Exception as exc:  # a failed run is recorded and retried next interval
                log.exception("background task %s failed", name)
                record.last_status, record.last_error = "error", f"{type(exc).__name__}: {exc}"
            record.last_finished_at = self.rt.clock.now()
        finally:
            record.lock.release()
        self._refresh_next_runs()
        return record

    def _scheduled(self, name):
        try:
            self.run(name, wait=False)
        except Conflict:
            log.info("background task %s still running; skipped this interval", name)

    def start(self, scheduler):
        """Register every task with an APScheduler scheduler and start it."""
        self.scheduler = scheduler
        for record in self.records.values():
            # APScheduler takes next_run_time=None as "paused": only a task that runs at start names
            # one.
            first = (
                {"next_run_time": dt.datetime.now(dt.timezone.utc)} if record.run_at_start else {}
            )
            scheduler.add_job(
                self._scheduled,
                "interval",
                args=[record.name],
                id=record.name,
                name=record.name,
                seconds=record.interval_seconds,
                max_instances=1,
                coalesce=True,
                **first,
            )
        scheduler.start()

    def shutdown(self):
        """Stop scheduling; waits for running tasks to finish."""
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=True)
            self.scheduler = None

    def _refresh_next_runs(self):
        if self.scheduler is None:
            return
        for record in self.records.values():
            job = self.scheduler.get_job(record.name)
            if job is not None and job.next_run_time is not None:
                record.next_run_at = job.next_run_time.astimezone(dt.timezone.utc).replace(
                    tzinfo=None
                )
