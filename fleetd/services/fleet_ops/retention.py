"""Retention: what fleetd forgets, and when. One collection removes metric samples and
notifications past their retention, jobs' output past its fleet's output_retention_days (with
the bytes it freed in the output store), share links that ended (revoked or expired) before a cutoff
and, when asked, jobs (with their tasks, logs, events and share links) and deleted instances that
ended longer ago than the cutoff, then artifacts no remaining job refers to. Each kind of record is
found by its own service; this module only puts the collection together, in one transaction."""

import datetime as dt
import logging
import os

from fleetd.db import write_transaction
from fleetd.services.fleet_ops import metrics
from fleetd.services.notify import feed
from fleetd.services.workloads import artifacts, instances, jobs, output, shares
from fleetd.services.workloads.output_store import StoreError

log = logging.getLogger("fleetd.retention")


def collect_garbage(rt, older_than_seconds, delete_jobs=False, dry_run=False):
    """Remove (or, with dry_run, count) what is past retention; returns the counts."""
    now = rt.clock.now()
    cutoff = now - dt.timedelta(seconds=older_than_seconds)
    counts, orphans = {}, []
    with write_transaction():
        expired = {
            **metrics.expired_samples(rt.settings, now),
            "notifications": feed.expired(rt.settings, now),
            "shares": shares.ended_before(cutoff),
        }
        for name, (model, condition) in expired.items():
            counts[name] = model.select().where(condition).count()
        old_jobs = jobs.ended_before(cutoff) if delete_jobs else []
        counts.update(jobs.records_of(old_jobs))
        expired_outputs = output.expired_outputs(now)
        gone = expired_outputs + output.outputs_of(old_jobs)
        chunks = output.stored_chunks(gone)
        counts["outputs"] = len(expired_outputs)
        counts["output_bytes"] = sum(size for _key, size in chunks)
        old_instances = instances.deleted_before(cutoff) if delete_jobs else []
        counts["instances"] = len(old_instances)
        if delete_jobs:
            orphans = artifacts.unreferenced(cutoff, keep_jobs_except=old_jobs)
        counts["artifacts"] = len(orphans)
        if not dry_run:
            for model, condition in expired.values():
                model.delete().where(condition).execute()
            output.delete_outputs(gone)
            jobs.delete_jobs(old_jobs)
            instances.delete_records(old_instances)
            artifacts.delete_records(orphans)
    if not dry_run:
        try:
            rt.output_store.delete([key for key, _size in chunks])
        except StoreError as exc:  # their rows are gone: what is left is only unreachable bytes
            log.warning("the output store kept some expired chunks: %s", exc)
        for sha in orphans:  # files go after the rows are gone for good
            try:
                os.unlink(artifacts.artifact_path(rt.settings, sha))
            except FileNotFoundError:
                pass
    counts["dry_run"] = dry_run
    return counts
