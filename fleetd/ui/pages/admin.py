"""Maintenance tasks (last run, next run, run now) and GPU types with prices."""

from flask import flash, g, redirect, render_template, request, url_for

from fleetd.runtime import current_runtime
from fleetd.schemas.cluster import GpuTypeUpdateSchema
from fleetd.services.placement import capacity, cluster, policy
from fleetd.ui import roles
from fleetd.ui.blueprint import bp
from fleetd.ui.forms import FormError, load_form
from fleetd.ui.security import ui_require

MODEL_MAX = 128  # the API keeps this much of a model name


@bp.route("/maintenance")
@ui_require(roles.TASKS)
def maintenance():
    """Background tasks: what each does, its last run and status, its next run."""
    return render_template("maintenance.html", tasks=current_runtime().tasks.list())


@bp.route("/maintenance/<string:name>/run", methods=["POST"])
@ui_require(roles.TASK_RUN)
def maintenance_run(name):
    """Run a background task now (in this request, as the API does) and show how it went."""
    record = current_runtime().tasks.run(name)
    if record.last_status == "ok":
        flash(f"{name} ran: ok.")
    else:
        flash(f"{name} failed: {record.last_error}", "error")
    return redirect(url_for("ui.maintenance"))


def _gpu_types_page(form=None, errors=None, status=200):
    types = capacity.gpu_types(cluster.current_state(current_runtime()))
    return render_template(
        "gpu_types.html",
        types=types,
        form=form or {},
        errors=errors or {},
        editable=g.ui_principal.role in roles.GPU_TYPE_SET,
    ), status


@bp.route("/gpu-types")
@ui_require(roles.GPU_TYPES)
def gpu_types():
    """GPU models in the fleet with capacity, availability and prices."""
    return _gpu_types_page()


@bp.route("/gpu-types/set", methods=["POST"])
@ui_require(roles.GPU_TYPE_SET)
def gpu_type_set():
    """Set (or clear, with empty fields) a model's price per hour and spot minimum bid."""
    model = request.form.get("model", "").strip()[:MODEL_MAX]
    errors = {}
    if not model:
        errors["model"] = ["a GPU model name is required"]
    try:
        body = load_form(GpuTypeUpdateSchema(), request.form)
    except FormError as exc:
        errors.update(exc.errors)
    if errors:
        return _gpu_types_page(form=request.form, errors=errors, status=400)
    policy.set_gpu_type(current_runtime(), model, **body)
    flash(f"Prices of {model} saved.")
    return redirect(url_for("ui.gpu_types"))
