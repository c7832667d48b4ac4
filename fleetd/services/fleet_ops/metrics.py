"""Observability: Prometheus metrics, the 24 h history, storage measurement and garbage
collection."""

import datetime as dt
import os
import shutil
import time

from peewee import fn
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from fleetd.clock import isoformat
from fleetd.db import write_transaction
from fleetd.models import ClusterSample, GpuSample, InstanceState, Job, JobState
from fleetd.services.accounting.ledger import SAMPLES_LOCK
from fleetd.services.accounting.usage_metrics import UsageCollector
from fleetd.services.placement.capacity import gpu_summary, node_counts
from fleetd.services.placement.cluster import current_state
from fleetd.services.workloads import instances
from fleetd.services.workloads.artifacts import store_dir
from fleetd.sql import insert_rows

MAX_HISTORY_MINUTES = 24 * 60
GPU_FIELDS = ("utilization_percent", "memory_used_bytes", "temperature_c", "power_w")
# The DCGM exporter's names, so that existing Grafana dashboards work unchanged.
DCGM = {
    "utilization_percent": ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    "temperature_c": ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
}


class Instruments:
    """Counters and histograms fleetd updates as things happen, in the app's own registry."""

    def __init__(self, rt):
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_latency = Histogram(
            "fleetd_http_request_duration_seconds",
            "API request latency by route.",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.heartbeats = Counter(
            "fleetd_heartbeats", "Agent heartbeats received.", registry=self.registry
        )
        self.queue_wait = Histogram(
            "fleetd_job_queue_wait_seconds",
            "Time from submission (or requeue) to placement.",
            registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400),
        )
        self.scheduling_pass = Histogram(
            "fleetd_scheduling_pass_seconds",
            "Duration of a scheduling pass.",
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.scheduling_bounded = Counter(
            "fleetd_scheduling_pass_bounded",
            "Passes that stopped at their bound (placements or time per pass) "
            "and left the rest of the queue to the next pass.",
            registry=self.registry,
        )
        self.leadership_changes = Counter(
            "fleetd_leadership_changes",
            "Times this replica started or stopped leading.",
            registry=self.registry,
        )
        self.webhook_deliveries = Counter(
            "fleetd_webhook_deliveries",
            "Webhook delivery attempts by outcome (delivered, retrying, given_up).",
            ["outcome"],
            registry=self.registry,
        )
        self.health_remediations = Counter(
            "fleetd_health_remediations",
            "Steps the node health policy took (cordon, drain, uncordon).",
            ["step"],
            registry=self.registry,
        )
        self.leaked_gpus_freed = Counter(
            "fleetd_leaked_gpus_freed",
            "GPU holds the periodic check found kept by a task that is no longer "
            "active (or a node listing no replica refreshes) and freed; each is logged. Should "
            "stay 0.",
            registry=self.registry,
        )
        self.registry.register(_StateCollector(rt))
        self.registry.register(UsageCollector(rt))  # the usage ledger by team and fleet


class _StateCollector:
    """Gauges computed at scrape time from the same ClusterState as GET /api/v1/cluster/status."""

    def __init__(self, rt):
        self.rt = rt

    def describe(self):
        return []

    def collect(self):
        rt = self.rt
        state = current_state(rt)
        # The counts only: cluster status's listing of every active job is not read for a scrape.
        gpu = rt.offload(gpu_summary, state, state.queued_demand())
        nodes = GaugeMetricFamily("fleetd_nodes", "Nodes by status.", labels=["status"])
        for name, count in sorted(node_counts(state).items()):
            nodes.add_metric([name], count)
        yield nodes
        gpus = GaugeMetricFamily(
            "fleetd_gpus",
            "GPUs by series and state (total = used + free + blocked).",
            labels=["series", "state"],
        )
        for series in gpu["series"]:
            for key in ("total", "used", "free", "blocked"):
                gpus.add_metric([series["id"], key], series[key])
        yield gpus
        queued = GaugeMetricFamily("fleetd_gpus_queued", "GPUs asked for by queued jobs.")
        queued.add_metric([], gpu["queued"])
        yield queued
        jobs = GaugeMetricFamily(
            "fleetd_jobs", "Jobs by state (runs of instances not included).", labels=["state"]
        )
        counts = {s.value: 0 for s in JobState}
        for state_name, count in (
            Job.select(Job.state, fn.COUNT(Job.id))
            .where(Job.instance_id.is_null())
            .group_by(Job.state)
            .tuples()
            .execute()
        ):
            counts[state_name] = count
        for name, count in sorted(counts.items()):
            jobs.add_metric([name], count)
        yield jobs
        by_state = GaugeMetricFamily("fleetd_instances", "Instances by state.", labels=["state"])
        counts = {s.value: 0 for s in InstanceState} | instances.counts_by_state()
        for name, count in sorted(counts.items()):
            by_state.add_metric([name], count)
        yield by_state
        leader = GaugeMetricFamily(
            "fleetd_leader",
            "1 while this replica leads, else 0; the lease's epoch as seen.",
            labels=["replica_id", "epoch"],
        )
        status = rt.leader.status()
        leader.add_metric(
            [status["replica_id"], str(status["leader_epoch"])], 1 if status["leader"] else 0
        )
        yield leader
        yield from _dcgm_families(rt, state)


def _dcgm_families(rt, state):
    labels = ["gpu", "UUID", "Hostname", "modelName"]
    families = {k: GaugeMetricFamily(name, text, labels=labels) for k, (name, text) in DCGM.items()}
    fb_used = GaugeMetricFamily(
        "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=labels
    )
    fb_free = GaugeMetricFamily(
        "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=labels
    )
    for node in state.nodes:
        seen = rt.liveness.get(node.id)
        readings = ((seen.metrics or {}).get("gpus") or {}) if seen is not None else {}
        if not readings or not isinstance(readings, dict):  # none: its GPUs are not looked at
            continue
        for gpu in state.gpus.get(node.id, ()):
            values = readings.get(gpu.uuid)
            if not isinstance(values, dict):
                continue
            key = [str(gpu.index), gpu.uuid, node.hostname, gpu.model]
            for field, family in families.items():
                value = values.get(field)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    family.add_metric(key, value)
            used = values.get("memory_used_bytes")
            if isinstance(used, int) and not isinstance(used, bool):
                fb_used.add_metric(key, used / 2**20)
                fb_free.add_metric(key, max(0, gpu.memory_total_bytes - used) / 2**20)
    yield from families.values()
    yield fb_used
    yield fb_free


# ---------------------------------------------------------------- history


def _gpu_readings(rt, nodes):
    """(node id, uuid, {reading: value}) from the agents' last heartbeats."""
    for node in nodes:
        seen = rt.liveness.get(node.id)
        readings = ((seen.metrics or {}).get("gpus") or {}) if seen is not None else {}
        if isinstance(readings, dict):
            for uuid, values in readings.items():
                if isinstance(values, dict):
                    yield node.id, uuid, values


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# Per-GPU rows written in one transaction; the event loop is given away between two.
SAMPLE_ROWS_PER_TRANSACTION = 2000


def _sample_figures(rt, state, demand):
    """(GPU summary, [(node id, uuid, readings)] to store, mean utilisation or None): off the event
    loop, as at 100,000 nodes that is 800,000 GPUs. Pure: no database (`demand` was read
    before). The mean is over every GPU; the readings stored are those of every GPU a task holds
    and of at most `metrics_idle_gpu_samples_max` others, taken in turn from sample to sample."""
    gpu = gpu_summary(state, demand)
    readings = list(_gpu_readings(rt, state.nodes))
    utils = [
        v["utilization_percent"]
        for _, _, v in readings
        if _number(v.get("utilization_percent")) is not None
    ]
    # The GPUs tasks hold, whole or in part (a MIG slice's is its GPU's uuid).
    held = {(t.node_id, g.get("uuid")) for t in state.tasks + state.stopping for g in t.gpus}
    stored = [r for r in readings if (r[0], r[1]) in held]
    idle = [r for r in readings if (r[0], r[1]) not in held]
    bound = rt.settings.metrics_idle_gpu_samples_max
    if len(idle) > bound:
        start = _IDLE_TURN[0] % len(idle)
        turn = (idle + idle)[start : start + bound]
        _IDLE_TURN[0] = start + bound
        stored += turn
    else:
        stored += idle
    return gpu, stored, (sum(utils) / len(utils) if utils else None)


# Where the next sample's turn of idle GPUs starts, among them in node and GPU order (the sampler
# runs on the leader alone, one sample at a time).
_IDLE_TURN = [0]


def _gpu_rows(readings, now):
    return [
        dict(
            at=now,
            node_id=node_id,
            uuid=uuid[:128],
            **{f: _number(values.get(f)) for f in GPU_FIELDS},
        )
        for node_id, uuid, values in readings
    ]


def record_sample(rt, with_gpus=True):
    """Store one cluster sample (and per-GPU samples); returns the counts written. The samples are
    stamped and written holding the ledger's SAMPLES_LOCK (see there), after the figures are
    gathered.

    The figures and rows are made off the event loop (rt.offload), and the per-GPU rows are
    written SAMPLE_ROWS_PER_TRANSACTION at a time with the loop given away between (rt.pause):
    heartbeats are answered meanwhile. A sample cut short by a crash keeps the rows written.
    """
    state = current_state(rt)
    gpu, readings, util = rt.offload(_sample_figures, rt, state, state.queued_demand())
    running = (
        Job.select()
        .where(Job.state.in_([JobState.RUNNING.value, JobState.CANCELLING.value]))
        .count()
    )
    waiting = Job.select().where(Job.state == JobState.QUEUED.value).count()
    written = 0
    with SAMPLES_LOCK:
        now = rt.clock.now()
        with write_transaction():
            ClusterSample.create(
                at=now,
                jobs_running=running,
                jobs_waiting=waiting,
                gpus_total=gpu["total"],
                gpus_used=gpu["used"],
                gpus_blocked=gpu["blocked"],
                gpu_util_percent=util,
            )
        rows = rt.offload(_gpu_rows, readings, now) if with_gpus and readings else []
        for start in range(0, len(rows), SAMPLE_ROWS_PER_TRANSACTION):
            if start and rt.pause is not None:
                rt.pause()
            chunk = rows[start : start + SAMPLE_ROWS_PER_TRANSACTION]
            with write_transaction():
                insert_rows(GpuSample, chunk)  # compiled: one row's SQL, not every row's
            written += len(chunk)
    return {"cluster": 1, "gpus": written}


def history(rt, minutes, gpus=True):
    """Samples of the last `minutes` (at most 24 h): the cluster's and (unless gpus=False) each
    GPU's."""
    minutes = max(1, min(int(minutes), MAX_HISTORY_MINUTES))
    since = rt.clock.now() - dt.timedelta(minutes=minutes)
    samples = [
        {
            "at": isoformat(s.at),
            "jobs_running": s.jobs_running,
            "jobs_waiting": s.jobs_waiting,
            "gpus_total": s.gpus_total,
            "gpus_used": s.gpus_used,
            "gpus_blocked": s.gpus_blocked,
            "gpu_util_percent": s.gpu_util_percent,
        }
        for s in ClusterSample.select().where(ClusterSample.at >= since).order_by(ClusterSample.at)
    ]
    per_gpu: dict[str, dict] = {}
    query = GpuSample.select().where(GpuSample.at >= since).order_by(GpuSample.at) if gpus else ()
    for s in query:
        entry = per_gpu.setdefault(s.uuid, {"uuid": s.uuid, "node_id": s.node_id, "samples": []})
        entry["samples"].append({"at": isoformat(s.at), **{f: getattr(s, f) for f in GPU_FIELDS}})
    return {"minutes": minutes, "samples": samples, "gpus": list(per_gpu.values())}


# ---------------------------------------------------------------- storage and garbage collection


def _tree_size(path):
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # removed while we walked
    return total


def measure_storage(rt):
    """Sizes of the database, artifacts and the data dir's disk; stored on the runtime."""
    settings = rt.settings
    started = time.monotonic()
    data_dir = os.path.abspath(settings.data_dir)
    db_bytes = None
    if settings.database_url.startswith("sqlite:"):
        path = settings.database_url.split("sqlite:///", 1)[1]
        db_bytes = sum(
            os.path.getsize(p) for p in (path, path + "-wal", path + "-shm") if os.path.exists(p)
        )
    artifacts = _tree_size(store_dir(settings)) if os.path.isdir(store_dir(settings)) else 0
    usage = shutil.disk_usage(data_dir) if os.path.isdir(data_dir) else None
    used_percent = round(100 * (usage.total - usage.free) / usage.total, 1) if usage else None
    watermark = settings.storage_watermark_percent
    rt.storage = {
        "measured_at": isoformat(rt.clock.now()),
        "measured_at_monotonic": rt.clock.monotonic(),
        "data_dir": data_dir,
        "database_bytes": db_bytes,
        "artifacts_bytes": artifacts,
        "disk_total_bytes": usage.total if usage else None,
        "disk_free_bytes": usage.free if usage else None,
        "disk_used_percent": used_percent,
        "watermark_percent": watermark,
        "alert": (
            f"disk {used_percent}% full, above the {watermark}% watermark"
            if used_percent is not None and used_percent >= watermark
            else None
        ),
        "took_seconds": round(time.monotonic() - started, 3),
    }
    return {
        k: v
        for k, v in rt.storage.items()
        if k in ("database_bytes", "artifacts_bytes", "disk_used_percent")
    }


def storage_view(rt):
    """The last storage measurement, with `stale` when it is older than two intervals, and seed
    003's names for it (seed_storage_fields)."""
    if not rt.storage:
        return {"measured_at": None, "stale": True, **seed_storage_fields(rt.settings, None)}
    age = rt.clock.monotonic() - rt.storage["measured_at_monotonic"]
    view = {k: v for k, v in rt.storage.items() if k != "measured_at_monotonic"}
    view["stale"] = age > 2 * rt.settings.storage_measure_seconds
    return {**view, **seed_storage_fields(rt.settings, rt.storage)}


def seed_storage_fields(settings, measured):
    """Seed 003's storage summary from a measurement (None: none yet): `measured`; the data dir's
    disk as `total_bytes`, `free_bytes`, `used_bytes`; `runs_bytes`, what runs leave on the control
    plane (the database: jobs, logs, events; null on PostgreSQL, which fleetd does not measure);
    `cache_bytes`, the artifact store (uploads kept to be fetched again); `watermark_pct`; `root`,
    the data dir."""
    if measured is None:
        return {
            "measured": False,
            "total_bytes": 0,
            "free_bytes": 0,
            "used_bytes": 0,
            "runs_bytes": 0,
            "cache_bytes": 0,
            "watermark_pct": round(settings.storage_watermark_percent),
            "root": os.path.abspath(settings.data_dir),
        }
    total, free = measured["disk_total_bytes"], measured["disk_free_bytes"]
    return {
        "measured": True,
        "total_bytes": total or 0,
        "free_bytes": free or 0,
        "used_bytes": (total - free) if total is not None and free is not None else 0,
        "runs_bytes": measured["database_bytes"],
        "cache_bytes": measured["artifacts_bytes"],
        "watermark_pct": round(measured["watermark_percent"]),
        "root": measured["data_dir"],
    }


def expired_samples(settings, now):
    """{name: (model, condition)} of the metric samples past retention."""
    cutoff = now - dt.timedelta(seconds=settings.metrics_retention_seconds)
    return {
        "cluster_samples": (ClusterSample, ClusterSample.at < cutoff),
        "gpu_samples": (GpuSample, GpuSample.at < cutoff),
    }
