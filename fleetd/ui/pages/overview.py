"""Overview: GPU capacity (the numbers of GET /api/v1/cluster/status), blocked reasons, nodes,
history."""

import datetime as dt

from flask import g, redirect, render_template, request, url_for

from fleetd.runtime import current_runtime
from fleetd.services.fleet_ops import metrics
from fleetd.services.placement import status as status_view
from fleetd.services.placement.cluster import current_state
from fleetd.ui import roles
from fleetd.ui.blueprint import bp
from fleetd.ui.charts import line_chart
from fleetd.ui.security import ui_require

HISTORY_MINUTES = 24 * 60
OVERVIEW_ROWS = 50  # running jobs (and instances) the page lists; it says how many more there are


def _allocated_percent(sample):
    total = sample.get("gpus_total") or 0
    return 100.0 * sample.get("gpus_used", 0) / total if total else None


def history_charts(rt):
    """The 24 h charts (GPU utilization and allocation; jobs running and waiting), or None if no
    samples."""
    samples = metrics.history(rt, HISTORY_MINUTES, gpus=False)["samples"]
    if not samples:
        return None
    end = rt.clock.now()
    start = end - dt.timedelta(minutes=HISTORY_MINUTES)
    gpus = line_chart(
        samples,
        [
            ("gpu_util_percent", "s-util", "GPU utilization %"),
            (_allocated_percent, "s-alloc", "GPUs allocated %"),
        ],
        start,
        end,
        y_max=100,
        unit="%",
        title="GPU utilization and allocation, last 24 hours",
    )
    jobs = line_chart(
        samples,
        [
            ("jobs_running", "s-running", "jobs running"),
            ("jobs_waiting", "s-waiting", "jobs waiting"),
        ],
        start,
        end,
        title="Jobs running and waiting, last 24 hours",
    )
    last = samples[-1]
    return {"gpus": gpus, "jobs": jobs, "count": len(samples), "last": last}


@bp.route("/")
@ui_require(roles.OVERVIEW)
def overview():
    """GPUs total/used/free/blocked and queued, per series; why GPUs are blocked; nodes; 24 h
    history."""
    rt = current_runtime()
    principal = g.ui_principal
    storage = metrics.storage_view(rt) if principal.role in roles.STORAGE else {}
    status = status_view.cluster_status(
        current_state(rt), principal, storage, rt.offload, limit=OVERVIEW_ROWS
    )
    labels = {s["id"]: s["label"] for s in status["gpu"]["series"]}
    context = {"status": status, "gpu": status["gpu"], "labels": labels, "storage": storage}
    if request.args.get("partial") == "capacity":
        return render_template("_capacity.html", **context)
    charts = history_charts(rt) if principal.role in roles.HISTORY else None
    return render_template("overview.html", charts=charts, **context)


@bp.route("/overview")
def overview_alias():
    """/ui/overview: the same page as /ui/."""
    return redirect(url_for("ui.overview"))
