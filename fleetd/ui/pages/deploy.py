"""Deploy an instance and submit a job: forms that post to the same schemas and services as the
API."""

from flask import flash, g, redirect, render_template, request, url_for

from fleetd.runtime import current_runtime
from fleetd.schemas.instances import InstanceSpecSchema
from fleetd.schemas.jobs import JobSpecSchema
from fleetd.services.fleet_ops import fleets
from fleetd.services.placement import capacity, cluster, policy, reasons
from fleetd.services.placement.terms import task_request
from fleetd.services.workloads import instances, jobs
from fleetd.specs import DEFAULT_MOUNT
from fleetd.ui import roles, specforms
from fleetd.ui.blueprint import bp
from fleetd.ui.forms import FormError
from fleetd.ui.security import ui_require

# Where the schemas' messages about nested fields are shown (anything else: beside its own field).
INSTANCE_FIELDS = {
    "resources": "gpus",
    "resources.gpus": "gpus",
    "resources.gpu_types": "gpu_type",
    "volume_bytes": "volume_gib",
    "idle_stop": "idle_stop",
    "node_selector": "gpu_type",
}
JOB_FIELDS = {
    "resources": "gpus",
    "resources.gpus": "gpus",
    "resources.gpu_types": "gpu_type",
    "node_selector": "fleet",
    "node_selector.fleet": "fleet",
    "max_runtime_seconds": "max_runtime",
}
SPEC_BOX = "spec"
EXAMPLE_SPEC = """name: train
command: [python, train.py, --epochs, "40"]
resources:
  gpus: 1
num_nodes: 1
"""


def _gpu_types():
    return capacity.gpu_types(cluster.current_state(current_runtime()))


def _common(form):
    """Fields both forms share -> the parts of the body they make."""
    body = {
        "name": form.get("name", "").strip(),
        "command": specforms.command(form.get("command")),
        "env": specforms.env(form),
        "resources": {},
    }
    gpus = specforms.number(form.get("gpus"))
    if gpus is not None:
        body["resources"]["gpus"] = gpus
    if form.get("gpu_type", "").strip():
        body["resources"]["gpu_types"] = [form["gpu_type"].strip()]
    if form.get("project", "").strip():  # else the submitter's default project
        body["project"] = form["project"].strip()
    body["priority_class"] = form.get("priority_class") or "on-demand"
    bid = specforms.number(form.get("bid"))
    if bid is not None:
        body["bid"] = bid
    return body


# ---------------------------------------------------------------- instances


def instance_body(form):
    """The deploy form -> the body of POST /api/v1/instances."""
    body = _common(form)
    if form.get("image", "").strip():
        body["image"] = form["image"].strip()
    body["ports"] = specforms.ports(form.get("ports"))
    volume = specforms.gib_to_bytes(form.get("volume_gib"))
    if volume is not None:
        body["volume_bytes"] = volume
    if form.get("volume_mount_path", "").strip():
        body["volume_mount_path"] = form["volume_mount_path"].strip()
    if form.get("restart"):
        body["restart"] = form["restart"]
    below, seconds = (
        specforms.number(form.get("idle_below")),
        specforms.scaled(form.get("idle_minutes"), 60),
    )
    if below is not None or seconds is not None:
        body["idle_stop"] = {"gpu_util_below_percent": below, "for_seconds": seconds}
    return body


def _deploy_page(form, errors=None, status=200):
    return render_template(
        "instance_new.html",
        form=form,
        errors=errors or {},
        types=_gpu_types(),
        env_rows=specforms.env_rows(form),
        default_mount=DEFAULT_MOUNT,
    ), status


@bp.route("/instances/new", methods=["GET", "POST"])
@ui_require(roles.INSTANCE_CREATE)
def instance_new():
    """Deploy an instance: the form, and its post (the API's schema and create_instance)."""
    if request.method == "GET":
        return _deploy_page(request.args)
    rt, principal = current_runtime(), g.ui_principal
    try:
        spec = specforms.load(InstanceSpecSchema(), instance_body(request.form), INSTANCE_FIELDS)
        inst = specforms.run_service(
            lambda: instances.create_instance(rt, principal, spec), INSTANCE_FIELDS
        )
    except FormError as exc:
        return _deploy_page(request.form, exc.errors, 400)
    flash(f"Instance {inst.name} created: this page follows it until it runs.")
    return redirect(url_for("ui.instance_page", instance_id=inst.id))


# ---------------------------------------------------------------- jobs


def job_body(form):
    """The job form's common fields -> the body of POST /api/v1/jobs."""
    body = _common(form)
    for name, value in (
        ("num_nodes", specforms.number(form.get("num_nodes"))),
        ("max_runtime_seconds", specforms.scaled(form.get("max_runtime"), 60)),
    ):
        if value is not None:
            body[name] = value
    if form.get("fleet", "").strip():
        body["node_selector"] = {"fleet": form["fleet"].strip()}
    if form.get("team", "").strip():
        body["team"] = form["team"].strip()
    return body


def _job_spec(form):
    """The posted job as a JobSpec (from the spec box or from the fields), or FormError."""
    if form.get("mode") == SPEC_BOX:
        return specforms.load(
            JobSpecSchema(), specforms.spec_text(form.get(SPEC_BOX)), SPEC_BOX
        ), SPEC_BOX
    return specforms.load(JobSpecSchema(), job_body(form), JOB_FIELDS), JOB_FIELDS


def fit(rt, principal, spec):
    """Whether a job would be placed now (the simulate-schedule answer) and, if never, why not."""
    simulation = policy.simulate(rt, principal, spec) if principal.role in roles.SIMULATE else None
    never = reasons.capacity_reason(rt, task_request(spec, principal.owner_id))
    return {"simulation": simulation, "never": never}


def _job_page(form, errors=None, status=200, check=None):
    fleet_names = (
        [f.name for f in fleets.list_fleets(1000)[0]] if g.ui_principal.role in roles.FLEETS else []
    )
    return render_template(
        "job_new.html",
        form=form,
        errors=errors or {},
        types=_gpu_types(),
        check=check,
        env_rows=specforms.env_rows(form),
        fleets=fleet_names,
        mode=form.get("mode") or "fields",
        example=EXAMPLE_SPEC,
    ), status


@bp.route("/jobs/new", methods=["GET", "POST"])
@ui_require(roles.JOB_SUBMIT)
def job_new():
    """Submit a job from the form's fields or a YAML/JSON spec; "Check" shows where it would go (or
    why it never fits) without submitting."""
    if request.method == "GET":
        return _job_page(request.args)
    rt, principal = current_runtime(), g.ui_principal
    partial = request.headers.get("HX-Request") and request.form.get("action") == "check"
    try:
        spec, field_of = _job_spec(request.form)
        if request.form.get("action") == "check":
            check = specforms.run_service(lambda: fit(rt, principal, spec), field_of)
            if partial:
                return render_template("_job_fit.html", check=check, errors={})
            return _job_page(request.form, check=check)
        job = specforms.run_service(lambda: jobs.submit(rt, principal, spec), field_of)
    except FormError as exc:
        if partial:
            return render_template("_job_fit.html", check=None, errors=exc.errors)
        return _job_page(request.form, exc.errors, 400)
    flash(
        f"Job {job.name} submitted: {job.state}"
        + (f" ({job.pending_reason})" if job.pending_reason else ".")
    )
    return redirect(url_for("ui.job_page", job_id=job.id))
