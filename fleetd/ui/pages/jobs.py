"""Jobs: the queue with filters; a job's page with spec, tasks, events, log tail, cancel and
simulation."""

from flask import flash, g, redirect, render_template, request, url_for
from markupsafe import Markup

from fleetd.errors import InvalidRequest
from fleetd.models import JobState
from fleetd.runtime import current_runtime
from fleetd.services.accounting import usage
from fleetd.services.nodes import nodes
from fleetd.services.placement import policy
from fleetd.services.workloads import jobs
from fleetd.ui import roles
from fleetd.ui.blueprint import bp
from fleetd.ui.pages import logs
from fleetd.ui.pages.common import allow, answer_by_name, confirmed, masked_spec_text
from fleetd.ui.security import ui_require

LIST_LIMIT = 200
EVENTS_SHOWN = 100
ACTIVE = "active"


def _page(principal, state, owner, team, filters, cursor):
    """One page of jobs with the list's filters."""
    return jobs.list_jobs(
        principal,
        LIST_LIMIT,
        cursor,
        state,
        owner,
        team,
        fleet=filters["fleet"],
        search=filters["name"],
    )


@bp.route("/jobs")
@ui_require(roles.JOBS)
def job_list():
    """Running and queued jobs (or one state, or all) with pending reasons; filters by owner and
    team."""
    principal = g.ui_principal
    state = request.args.get("state", ACTIVE) or ACTIVE
    owner = request.args.get("owner", "").strip() or None
    team = request.args.get("team", "").strip() or None
    filters = {
        "fleet": request.args.get("fleet", "").strip() or None,
        "name": request.args.get("name", "").strip() or None,
    }
    cursor = request.args.get("cursor") or None
    states = [s.value for s in JobState]
    if state not in states + [ACTIVE, "any"]:
        raise InvalidRequest(f"unknown job state {state!r}")
    if state == ACTIVE:
        sections = []
        for wanted in (JobState.RUNNING.value, JobState.QUEUED.value):
            rows, more = _page(principal, wanted, owner, team, filters, None)
            sections.append((wanted, rows, more))
        next_cursor = None
    else:
        rows, next_cursor = _page(
            principal, None if state == "any" else state, owner, team, filters, cursor
        )
        sections = [(state, rows, None)]
    return render_template(
        "jobs.html",
        sections=sections,
        state=state,
        owner=owner or "",
        team=team or "",
        name=filters["name"] or "",
        fleet=filters["fleet"] or "",
        states=states,
        next_cursor=next_cursor,
        now=current_runtime().clock.now(),
    )


def _hostnames(job):
    ids = {t.node_id for t in job.task_list if t.node_id}
    found = {node_id: nodes.find_node(node_id) for node_id in sorted(ids)}
    return {node_id: node.hostname for node_id, node in found.items() if node is not None}


JOB_DONE = "the job has ended; the log is complete."


def _log_url(job_id):
    return lambda **args: url_for("ui.job_log", job_id=job_id, **args)


@bp.route("/jobs/<string:job_id>")
@ui_require(roles.JOB)
def job_page(job_id):
    """One job: spec, tasks with their nodes and GPUs, events, the end of its log, and why it waits.
    By name too: a name goes to its job's id, or lists the jobs of that name."""
    rt = current_runtime()
    principal = g.ui_principal
    other = answer_by_name(
        job_id,
        jobs.resolve_job(principal, job_id),
        "job",
        "ui.job_page",
        [("name", "name"), ("owner", "owner"), ("state", "state"), ("submitted", "submitted_at")],
    )
    if other is not None:
        return other
    job = jobs.get_job(principal, job_id)
    events = []
    if principal.role in roles.JOB_EVENTS:
        events = jobs.job_events_tail(principal, job_id, EVENTS_SHOWN)
    lines = []
    if principal.role in roles.JOB_LOGS:
        lines = jobs.job_logs_tail(rt, principal, job_id, logs.SHOWN)
    simulation = None
    if job.state == JobState.QUEUED.value and principal.role in roles.SIMULATE:
        simulation = policy.simulate(rt, principal, job.job_spec)
    terminal = JobState(job.state).is_terminal()
    return render_template(
        "job.html",
        job=job,
        spec=masked_spec_text(job.spec),
        hostnames=_hostnames(job),
        events=list(reversed(events)),
        log=logs.box(
            lines,
            _log_url(job_id),
            not terminal,
            JOB_DONE,
            url_for("ui.job_log_search", job_id=job_id),
            url_for("ui.job_output", job_id=job_id),
        ),
        terminal=terminal,
        simulation=simulation,
        now=rt.clock.now(),
        usage=usage.workload_usage(rt, principal, job.id),
    )


@bp.route("/jobs/<string:job_id>/log")
@ui_require(roles.JOB_LOGS)
def job_log(job_id):
    """Log lines after `after` (the page polls this), or with `before` the lines before that one
    ("Load earlier lines")."""
    principal, rt = g.ui_principal, current_runtime()
    job = jobs.get_job(principal, job_id)
    if request.args.get("before"):
        return logs.earlier(
            lambda before, n: jobs.job_logs_tail(rt, principal, job_id, n, before=before),
            _log_url(job_id),
        )
    # The job's state and tasks come along, so that they change in place too.
    live = render_template("_job_live.html", job=job, oob=True) + render_template(
        "_job_tasks.html", job=job, hostnames=_hostnames(job), oob=True
    )
    return logs.newer(
        lambda after, n: jobs.job_logs(rt, principal, job_id, n, after=after)[0],
        _log_url(job_id),
        not JobState(job.state).is_terminal(),
        JOB_DONE,
        Markup(live),  # nosec B704  # rendered by Jinja
    )


@bp.route("/jobs/<string:job_id>/log/search")
@ui_require(roles.JOB_LOGS)
def job_log_search(job_id):
    """Lines of the job's whole output that hold `q`."""
    principal, rt = g.ui_principal, current_runtime()
    return logs.found(
        lambda n, q, regex: jobs.job_logs(rt, principal, job_id, n, q=q, q_regex=regex)
    )


@bp.route("/jobs/<string:job_id>/output")
@ui_require(roles.JOB_LOGS)
def job_output(job_id):
    """The job's whole output as a text file."""
    pieces = jobs.job_output(current_runtime(), g.ui_principal, job_id)
    return logs.whole(pieces, f"{job_id}.log")


@bp.route("/jobs/<string:job_id>/cancel", methods=["POST"])
@ui_require(roles.JOB)
def job_cancel(job_id):
    """Cancel a job after a confirmation step (owner or admin, as the API allows)."""
    principal = allow(roles.JOB_CANCEL)
    rt = current_runtime()
    job = jobs.get_job(principal, job_id)
    if not confirmed(request.form):
        return render_template("confirm_job.html", job=job)
    job = jobs.cancel_job(rt, principal, job_id)
    flash(f"Job {job.name} is now {job.state}.")
    return redirect(url_for("ui.job_page", job_id=job_id))
