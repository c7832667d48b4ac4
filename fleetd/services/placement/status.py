"""Cluster status: the GPU summary (placement.capacity), node counts and profiles, and what runs:
running jobs and instances, listed up to a bound and counted in full.

What runs is read from an index, not row by row: the ids of the running and cancelling jobs (the
job index of (state, group_key, pending_reason, id) holds them), their kind from the job terms
kept in memory, the GPUs and nodes each holds from the active tasks' holds the ClusterState read.
Only the rows listed are read whole. At 21,335 running jobs, listing every one cost about half a
second a call; the listing holds `active_limit` of each kind (1,000 unless asked), in id order,
and `active_jobs_total` / `active_instances_total` say how many there were to list.
"""

from fleetd import scheduler
from fleetd.clock import isoformat
from fleetd.credentials import READ_ALL
from fleetd.models import Instance, Job, JobState, Project, User
from fleetd.services.placement.capacity import gpu_summary, node_counts, profiles
from fleetd.services.placement.inventory import call
from fleetd.sql import Statement

ACTIVE_LIMIT = 1000  # rows of each kind listed unless the caller asks for more or fewer
ACTIVE_LIMIT_MAX = 100_000
_ACTIVE_STATES = (JobState.RUNNING.value, JobState.CANCELLING.value)
_BY_ID_CHUNK = 500

# Ids of the running and cancelling jobs, in id order: from the job index alone.
_ACTIVE_IDS = Statement(
    lambda v: Job.select(Job.id).where(Job.state.in_(_ACTIVE_STATES)).order_by(Job.id)
)
# Of one owner: read row by row, but only for a caller who sees only its own.
_OWN_ACTIVE_IDS = Statement(
    lambda v: Job.select(Job.id).where(
        Job.state.in_(_ACTIVE_STATES) & (Job.owner_token_id == v("owner"))
    )
)


def cluster_status(state, principal=None, storage=None, offload=call, limit=ACTIVE_LIMIT):
    """GET /api/v1/cluster/status: total = used + free + blocked, overall and per series.

    Running jobs (`active_jobs`) and instances whose run holds capacity (`active_instances`,
    named as instances: never by their internal runs) are listed to admins (and to fleetd
    itself: no principal), `limit` of each in id order; anyone else sees its own, and the others
    only as counts (their names, owners and teams are not theirs to read, as GET /jobs/{id}
    says). `offload` runs the per-GPU part (rt.offload: off the event loop; at 10,000 nodes that
    is 80,000 GPUs).
    """
    demand = state.queued_demand()
    gpu = offload(gpu_summary, state, demand)
    active = [row[0] for row in _ACTIVE_IDS.raw_tuples()]
    terms = state.terms.get_many(active)
    if principal is None or principal.role in READ_ALL:
        own = None
    else:
        own = {row[0] for row in _OWN_ACTIVE_IDS.raw_tuples(owner=principal.owner_id)}
    listable: dict[str, list[str]] = {"jobs": [], "instances": []}
    kinds: dict[str, str] = {}  # job id -> kind, of the others (counted, not listed)
    for job_id in active:
        found = terms.get(job_id)
        kind = "instances" if found is not None and found.workload.kind == "instance" else "jobs"
        if own is not None and job_id not in own:
            kinds[job_id] = kind
        else:
            listable[kind].append(job_id)
    limit = max(0, min(int(limit), ACTIVE_LIMIT_MAX))
    shown = listable["jobs"][:limit] + listable["instances"][:limit]
    # What the listed jobs and the others hold: a cancelling job still holds its GPUs until its
    # processes stop.
    wanted = set(shown) | kinds.keys()
    held: dict[str, float] = {}
    nodes: dict[str, set] = {}
    for task in state.tasks:
        if task.job_id in wanted:
            held[task.job_id] = held.get(task.job_id, 0) + _gpus_held(task.gpus)
            nodes.setdefault(task.job_id, set()).add(task.node_id)
    others: dict[str, dict[str, float]] = {
        "jobs": {"count": 0, "gpus": 0},
        "instances": {"count": 0, "gpus": 0},
    }
    for job_id, kind in kinds.items():
        others[kind]["count"] += 1
        others[kind]["gpus"] += held.get(job_id, 0)
    listed = _rows(shown, held, nodes, state)
    return {
        "gpu": gpu,
        "storage": storage or {},
        "active_count": len(active),
        "active_jobs": listed["jobs"],
        "active_jobs_total": len(listable["jobs"]),
        "other_active_jobs": others["jobs"],
        "active_instances": listed["instances"],
        "active_instances_total": len(listable["instances"]),
        "other_active_instances": others["instances"],
        "profiles": profiles(state),
        "nodes": node_counts(state),
    }


def _rows(job_ids, held, nodes, state):
    """{"jobs": [row], "instances": [row]} of these active jobs (and instance runs), id order."""
    active: list = []
    for start in range(0, len(job_ids), _BY_ID_CHUNK):
        chunk = job_ids[start : start + _BY_ID_CHUNK]
        active.extend(Job.select(*_ACTIVE_COLUMNS).where(Job.id.in_(chunk)).namedtuples())
    active.sort(key=lambda j: j.id)
    retry_on = _retry_on([j.id for j in active if j.instance_id is None])
    runs = [j.instance_id for j in active if j.instance_id is not None]
    instances = {i.id: i for i in Instance.select().where(Instance.id.in_(runs))} if runs else {}
    listed: dict[str, list[dict]] = {"jobs": [], "instances": []}
    for j in active:
        gpus, where = held.get(j.id, 0), sorted(nodes.get(j.id, ()))
        if j.instance_id is None:
            listed["jobs"].append(
                {
                    "id": j.id,
                    "name": j.name,
                    "owner": j.owner,
                    "team": j.team,
                    "state": j.state,
                    "started_at": isoformat(j.started_at),
                    "gpus": gpus,
                    "nodes": where,
                    **job_row_times(j, state.now),
                    **retry_view(j, retry_on.get(j.id, ())),
                    **_people(j),
                }
            )
            continue
        inst = instances.get(j.instance_id)
        listed["instances"].append(
            {
                "id": j.instance_id,
                "name": j.name,
                "owner": j.owner,
                "team": j.team,
                "state": inst.state if inst is not None else "deleted",
                "started_at": isoformat(inst.started_at if inst is not None else j.started_at),
                "gpus": gpus,
                "nodes": where,
                **_people(j),
            }
        )
    _name_people(listed["jobs"] + listed["instances"])
    return listed


_ACTIVE_COLUMNS = (
    Job.id,
    Job.name,
    Job.owner,
    Job.owner_token_id,
    Job.team,
    Job.project,
    Job.user,
    Job.state,
    Job.instance_id,
    Job.attempt,
    Job.max_attempts,
    Job.submitted_at,
    Job.started_at,
    Job.ended_at,
)


def _people(job):
    """A row's project and user as keys; _name_people adds their names."""
    return {"project_key": job.project, "username": job.user}


def _name_people(rows):
    """Add `project`, `project_display_name` and `user_display_name` to rows (two queries)."""
    keys = {r["project_key"] for r in rows if r["project_key"]}
    logins = {r["username"] for r in rows if r["username"]}
    projects = (
        {
            key: (name, shown)
            for key, name, shown in Project.select(Project.key, Project.name, Project.display_name)
            .where(Project.key.in_(keys))
            .tuples()
            .execute()
        }
        if keys
        else {}
    )
    users: dict[str, str] = {}
    if logins:
        query = User.select(User.login, User.display_name).where(User.login.in_(logins))
        users = dict(query.tuples().execute())
    for row in rows:
        name, shown = projects.get(row["project_key"], (None, None))
        row["project"], row["project_display_name"] = name, shown
        row["user_display_name"] = users.get(row["username"])


def job_row_times(job, now):
    """When a job was submitted, started and ended, and how long it has run (or ran) in seconds."""
    end = job.ended_at or now
    return {
        "submitted_at": isoformat(job.submitted_at),
        "ended_at": isoformat(job.ended_at),
        "duration_seconds": round(max(0.0, (end - job.started_at).total_seconds()), 3)
        if job.started_at
        else None,
    }


_RETRY_ON: dict[str, tuple[str, ...]] = {}  # job id -> its spec's retry.on (a spec never changes)
_RETRY_ON_SIZE = 100_000


def _retry_on(job_ids):
    """{job id: its spec's retry.on}, decoding only the specs not read before."""
    missing = [j for j in job_ids if j not in _RETRY_ON]
    for start in range(0, len(missing), 500):
        query = Job.select(Job.id, Job.spec).where(Job.id.in_(missing[start : start + 500]))
        for job_id, spec in query.tuples().execute():
            _RETRY_ON[job_id] = tuple(((spec or {}).get("retry") or {}).get("on") or ())
    if len(_RETRY_ON) > _RETRY_ON_SIZE:  # oldest first out
        for stale in list(_RETRY_ON)[: len(_RETRY_ON) - _RETRY_ON_SIZE]:
            del _RETRY_ON[stale]
    return {j: _RETRY_ON.get(j, ()) for j in job_ids}


def retry_view(job, on=None):
    """How often a job was retried and whether one more retry is possible (its retry policy and
    attempts left), with the reason when it is not. `on`: its spec's retry.on, when read."""
    if on is None:
        on = ((job.spec or {}).get("retry") or {}).get("on") or []
    if job.max_attempts <= 1 or not on:
        blocker = "its spec has no retry policy"
    elif job.attempt >= job.max_attempts:
        blocker = f"no attempts left ({job.attempt} of {job.max_attempts} used)"
    else:
        blocker = ""
    return {
        "retry_count": max(0, job.attempt - 1),
        "can_retry": not blocker,
        "retry_blocker": blocker,
        "retry_on": list(on),
    }


def _gpus_held(allocations):
    """GPUs a task holds: whole ones count 1, a shared slice its fraction (0.25 for a quarter)."""
    return sum(
        1
        if g.get("exclusive", True)
        else round(g.get("compute_milli", scheduler.MILLI) / scheduler.MILLI, 3)
        for g in allocations
    )
