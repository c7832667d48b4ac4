"""Instances as users read them: the Instance of docs/api.md with its run's state, its node's
address, what the node last reported of the run (ports, uptime, volume use) and its costs; the
logs and events of an instance."""

import ipaddress

from fleetd.models import Event, InstanceState, Job, JobState, Node, Task
from fleetd.services.accounting.usage import storage_costs
from fleetd.services.notify.events import list_events
from fleetd.services.pagination import last_rows
from fleetd.services.workloads import output_read, output_whole
from fleetd.services.workloads.instances import find_instance


def instance_views(rt, instances):
    """Instance dicts of docs/api.md, with the runs' pending reasons and the nodes' addresses
    read in two queries, and what their nodes last reported of the runs (rt.samples)."""
    now = rt.clock.now()
    runs = [i.run_id for i in instances if i.run_id]
    jobs = (
        {j.id: j for j in Job.select(Job.id, Job.pending_reason, Job.state).where(Job.id.in_(runs))}
        if runs
        else {}
    )
    tasks = (
        {t.job_id: t for t in Task.select(Task.id, Task.job).where(Task.job.in_(runs))}
        if runs
        else {}
    )
    node_ids = list({i.node_id for i in instances if i.node_id})
    nodes = (
        {
            n.id: n
            for n in Node.select(Node.id, Node.address, Node.hostname).where(Node.id.in_(node_ids))
        }
        if node_ids
        else {}
    )
    storage = storage_costs(rt, [i.id for i in instances])  # its volume's, from the usage ledger
    return [
        dict(
            _view(
                i, jobs.get(i.run_id), tasks.get(i.run_id), nodes.get(i.node_id), now, rt.samples
            ),
            storage_cost_so_far=storage.get(i.id, 0.0),
        )
        for i in instances
    ]


def instance_view(rt, inst):
    return instance_views(rt, [inst])[0]


def _view(inst, job, task, node, now, samples):
    state = InstanceState(inst.state)
    cost = inst.cost_accrued or 0.0
    if state is InstanceState.RUNNING and inst.running_since is not None:
        cost += (
            (inst.price_per_hour or 0.0)
            * max(0.0, (now - inst.running_since).total_seconds())
            / 3600
        )
    pending = ""
    if state is InstanceState.PENDING or (
        state is InstanceState.INTERRUPTED
        and job is not None
        and job.state == JobState.QUEUED.value
    ):  # it resumes by itself
        pending = (job.pending_reason if job is not None else "") or "waiting for the scheduler"
    return {
        "id": inst.id,
        "name": inst.name,
        "owner": inst.owner,
        "team": inst.team,
        "state": inst.state,
        "status_reason": inst.status_reason,
        "desired_state": "running" if inst.desired_state == "running" else "stopped",
        "pending_reason": pending,
        "node_id": inst.node_id,
        "node_hostname": node.hostname if node else None,
        "interrupted_by": inst.preempted_by if state is InstanceState.INTERRUPTED else None,
        "interruption": inst.interrupted_by if state is InstanceState.INTERRUPTED else None,
        "last_exit": inst.last_exit,
        "next_start_at": inst.next_start_at,
        "spec": _public_spec(inst.spec),
        "created_at": inst.created_at,
        "started_at": inst.started_at,
        "stopped_at": inst.stopped_at,
        "price_per_hour": inst.price_per_hour,
        "cost_so_far": round(cost, 6),
        "runs": inst.runs,
        "runtime": (
            _runtime(inst, task, node, now, samples)
            if state in (InstanceState.RUNNING, InstanceState.RESTARTING)
            else None
        ),
    }


def _public_spec(spec):
    return {k: v for k, v in spec.items() if k != "team"} | {"team": spec.get("team")}


def _runtime(inst, task, node, now, samples):
    sample = samples.get(task.id) if task is not None else None
    protocols = {p.port: p.protocol for p in inst.instance_spec.ports}
    address = node.address if node is not None else ""
    return {
        # the current process's: 0 while it waits to be started again
        "uptime_seconds": (
            round(max(0.0, (now - inst.process_started_at).total_seconds()), 3)
            if inst.process_started_at and inst.state == InstanceState.RUNNING.value
            else 0
        ),
        "ports": [
            {
                "private_port": p["port"],
                "public_port": p["host_port"],
                "ip": address,
                "is_ip_public": is_public(address),
                "type": protocols.get(p["port"], "tcp"),
                "url": connection_url(address, p["host_port"], protocols.get(p["port"], "tcp"))
                if address
                else None,
                "state": port_state(sample, p["port"], p["host_port"]),
            }
            for p in inst.ports or []
        ],
        "gpus": (sample or {}).get("gpus") or [],
        "container": (sample or {}).get("container"),
        "restarts": (sample or {}).get("restarts", 0),
        "volume_used_bytes": (sample or {}).get("volume_used_bytes"),
    }


PORT_TAKEN = "taken_by_other_process"


def port_state(sample, port, host_port):
    """What the node last reported of the listener on a run's host port (see docs/api.md, Instance):
    `unknown` without a report of that port at that host port."""
    for reported in (sample or {}).get("ports") or ():
        if reported["port"] == port and reported["host_port"] == host_port:
            return reported["state"]
    return "unknown"


def is_public(address):
    try:
        return ipaddress.ip_address(address).is_global
    except ValueError:
        return bool(address)  # a host name: assume it resolves where clients are


def connection_url(host, port, protocol):
    """http://HOST:PORT/ for an http port, tcp://HOST:PORT otherwise ([HOST] for IPv6)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" if protocol == "http" else f"tcp://{shown}:{port}"


def _runs(instance_id):
    return [run.id for run in Job.select(Job.id).where(Job.instance_id == instance_id)]


def instance_logs(rt, principal, instance_id, limit, after=None, **filters):
    """Lines of every run of an instance in order of arrival, and the cursor to go on from
    (`filters`: as for a job's)."""
    find_instance(principal, instance_id, deleted=True)
    flt = output_read.Filter(**filters)
    return output_read.page(rt, _runs(instance_id), after, limit, flt)


def instance_output(rt, principal, instance_id, rank=None, attempt=None, stream=None, gzip=False):
    """The whole output of an instance's runs as pieces of text (gzip when asked)."""
    find_instance(principal, instance_id, deleted=True)
    pieces = output_whole.whole(rt, _runs(instance_id), rank, attempt, stream)
    return output_whole.gzipped(rt, pieces) if gzip else pieces


def instance_output_info(principal, instance_id):
    """How much output an instance's runs have, how much is stored, what nodes still hold."""
    find_instance(principal, instance_id, deleted=True)
    return output_whole.info(_runs(instance_id), None)


def instance_logs_tail(rt, principal, instance_id, count, before=None):
    """The last `count` lines of an instance's runs' output (before the seq `before`, if given),
    oldest first."""
    find_instance(principal, instance_id, deleted=True)
    return output_read.page_before(rt, _runs(instance_id), before, count)


def instance_events(principal, instance_id, limit, cursor=None, after=None):
    find_instance(principal, instance_id, deleted=True)
    return list_events("instance", instance_id, limit, cursor, after)


def instance_events_tail(principal, instance_id, count):
    find_instance(principal, instance_id, deleted=True)
    return last_rows(
        Event.select().where(
            (Event.subject_type == "instance") & (Event.subject_id == instance_id)
        ),
        Event.id,
        count,
    )
