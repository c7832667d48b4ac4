"""Instances: long-running reserved workloads with ports, a volume, stop and resume.

Each run of an instance (its creation, every resume) is one internal one-rank Job whose
`instance_id` names it: the scheduler places it like any job (quotas, priority classes, bids,
windows, preemption), acquire delivers it with an `instance` key in the Assignment, and the
agent supervises it (restart policy, ports, volume). A run never retries: when it ends,
run_ended() decides what the instance becomes. A resumed run is held to the node that keeps
the volume.
"""

import ipaddress
import threading
import time
import weakref

from peewee import fn

from fleetd.db import after_commit, released, write_transaction
from fleetd.errors import Conflict, InvalidRequest, NotFound, Timeout
from fleetd.models import (
    Event,
    Gpu,
    GpuType,
    Instance,
    InstanceState,
    Job,
    JobState,
    LogLine,
    Node,
    NodeStatus,
    Task,
    TaskState,
    new_id,
    transition_table,
)
from fleetd.services.cluster import group_key_of
from fleetd.services.events import list_events, record_event
from fleetd.services.jobs import ACTIVE_TASK_STATES, owe_stops, stop_job, switch_job_state, task_request
from fleetd.services.pagination import last_rows, paginate

# state -> the states it may go to
TRANSITIONS = transition_table(InstanceState, {
    "pending": "starting stopped interrupted failed deleted",
    "starting": "running stopping stopped interrupted failed deleted",
    "running": "stopping stopped interrupted failed deleted",
    "stopping": "stopped deleted",
    "stopped": "pending deleted",
    "interrupted": "pending starting running stopping stopped deleted",
    "failed": "pending deleted",
    "deleted": "",
})
ENDED = (InstanceState.STOPPED, InstanceState.INTERRUPTED, InstanceState.FAILED, InstanceState.DELETED)
DEFAULT_MOUNT = "/workspace"

# Every runtime's notifier: an instance's change wakes its waiters, whichever app serves them.
NOTIFIERS = weakref.WeakSet()


def switch_instance_state(inst, to_state, reason, now):
    """The one way an instance changes state: checks the transition, keeps the cost's running
    interval, saves, records an Event; its waiters are woken after the commit."""
    from_state = InstanceState(inst.state)
    to_state = InstanceState(to_state)
    if to_state not in TRANSITIONS[from_state]:
        raise Conflict(f"instance {inst.id} is {from_state.value}; it cannot become {to_state.value}",
                       {"state": from_state.value})
    if from_state is InstanceState.RUNNING and inst.running_since is not None:
        hours = max(0.0, (now - inst.running_since).total_seconds()) / 3600
        inst.cost_accrued = (inst.cost_accrued or 0.0) + (inst.price_per_hour or 0.0) * hours
        inst.running_since = None
    if to_state is InstanceState.RUNNING:
        inst.running_since = now
        inst.started_at = now
    if to_state in ENDED:
        inst.stopped_at = now
    if to_state is not InstanceState.INTERRUPTED:
        inst.interrupted_by = None
    inst.state = to_state.value
    inst.status_reason = reason
    inst.save()
    record_event(now, "instance.state", "instance", inst.id, reason, from_state.value, to_state.value)
    instance_id = inst.id
    after_commit(lambda: _wake(instance_id))
    return inst


def _wake(instance_id):
    for notifier in list(NOTIFIERS):
        notifier.notify(("instance", instance_id))


# ---------------------------------------------------------------- create, read


def create_instance(rt, principal, spec):
    """Create an instance from a validated InstanceSpec and queue its first run."""
    from fleetd.services import policy, scheduling

    now = rt.clock.now()
    spec = dict(spec, team=principal.team)  # the team comes from the token, never from the body
    request = task_request(run_spec(spec, None))  # the engine's own checks, before anything is stored
    policy.check_bid(spec)
    never = scheduling.capacity_reason(rt, request)
    with write_transaction():
        inst = Instance.create(id=new_id(), name=spec["name"], owner=principal.name, owner_token_id=principal.id,
                               team=principal.team, state=InstanceState.PENDING.value, desired_state="running",
                               spec=spec,
                               created_at=now, status_reason=f"created by {principal.label}")
        record_event(now, "instance.created", "instance", inst.id, f"created by {principal.label}", None,
                     InstanceState.PENDING.value, actor=principal.label)
        _new_run(inst, now, never)
    _kick(rt)
    return Instance.get_by_id(inst.id)  # as the pass (if it ran here) left it


def run_spec(spec, node_id):
    """The internal JobSpec of one run of an instance (held to `node_id` when set)."""
    res = spec.get("resources") or {}
    selector = dict(spec.get("node_selector") or {})
    if node_id is not None:
        selector["node_id"] = node_id
    if spec.get("image"):
        selector["container"] = True
    return {
        "name": spec["name"], "command": list(spec.get("command") or []), "env": spec.get("env") or {},
        "num_nodes": 1, "team": spec.get("team"),
        "resources": {k: res[k] for k in ("gpus", "gpu_types", "cpus", "memory_bytes") if k in res},
        "priority_class": spec.get("priority_class", "on-demand"), "bid": spec.get("bid"),
        "node_selector": selector, "retry": {"max_attempts": 1, "on": []}, "max_runtime_seconds": None,
        "instance": {
            "restart": spec.get("restart") or "on-failure", "ports": spec.get("ports") or [],
            "volume_bytes": spec.get("volume_bytes") or 0,
            "volume_mount_path": spec.get("volume_mount_path") or DEFAULT_MOUNT,
            "image": spec.get("image"), "idle_stop": spec.get("idle_stop"),
        },
    }


def _new_run(inst, now, waiting_reason=None):
    """Queue a new run of the instance (inside the caller's transaction): pending."""
    spec = run_spec(inst.spec, inst.node_id)
    job = Job.create(id=new_id(), name=inst.name, owner=inst.owner, owner_token_id=inst.owner_token_id, team=inst.team,
                     state=JobState.QUEUED.value, max_attempts=1, num_nodes=1, priority_class=spec["priority_class"],
                     spec=spec, submitted_at=now, instance_id=inst.id,
                     pending_reason=waiting_reason or "waiting for the scheduler",
                     group_key=group_key_of(spec, inst.team, spec["priority_class"]))
    Task(id=new_id(), job=job.id, rank=0, state=TaskState.PENDING.value, gpus=[]).save(force_insert=True)
    inst.run_id = job.id
    inst.runs = (inst.runs or 0) + 1
    inst.desired_state = "running"
    if inst.state != InstanceState.PENDING.value:
        where = f" on node {inst.node_id}, which holds its volume" if inst.node_id else ""
        switch_instance_state(inst, InstanceState.PENDING, f"run {inst.runs} queued{where}", now)
    else:
        inst.save()
    return job


def _kick(rt):
    if rt.scheduler is not None:
        rt.scheduler.kick(capacity=False)


def _visible(query, principal):
    return query if principal.role == "admin" else query.where(Instance.owner_token_id == principal.id)


def find_instance(principal, instance_id):
    """The instance if this principal may see it; NotFound otherwise."""
    inst = Instance.get_or_none_by_id(instance_id)
    if inst is None or (principal.role != "admin" and inst.owner_token_id != principal.id):
        raise NotFound(f"instance {instance_id} not found")
    return inst


def list_instances(principal, limit, cursor=None, state=None, owner=None):
    """One page of instances, oldest first; deleted ones only when asked for by state."""
    query = _visible(Instance.select(), principal)
    if state:
        query = query.where(Instance.state == state)
    else:
        query = query.where(Instance.state != InstanceState.DELETED.value)
    if owner:
        query = query.where(Instance.owner == owner)
    return paginate(query, Instance.id, limit, cursor)


def get_instance(principal, instance_id):
    return find_instance(principal, instance_id)


def wait_instance(rt, principal, instance_id, wait_seconds):
    """The instance; with `wait_seconds`, as soon as its state changes (or when the wait ends)."""
    inst = released(lambda: find_instance(principal, instance_id))
    if wait_seconds <= 0:
        return inst
    seen = (inst.state, inst.status_reason)

    def changed():
        current = released(lambda: find_instance(principal, instance_id))
        return current if (current.state, current.status_reason) != seen else None

    wait = min(wait_seconds, rt.settings.long_poll_max_seconds)
    return rt.notifier.wait(("instance", instance_id), wait, changed) or released(
        lambda: find_instance(principal, instance_id))


# ---------------------------------------------------------------- stop, resume, delete


def stop_instance(rt, principal, instance_id):
    """Stop an instance: its processes end, its GPUs are freed, its volume is kept. Idempotent."""
    now = rt.clock.now()
    with write_transaction():
        inst = find_instance(principal, instance_id)
        if inst.state == InstanceState.DELETED.value:
            raise Conflict(f"instance {instance_id} is deleted", {"state": inst.state})
        inst.desired_state = "stopped"
        held = _end_run(inst, InstanceState.STOPPED, f"stopped by {principal.label}", now)
    owe_stops(held)
    _kick(rt)
    return Instance.get_by_id(inst.id)  # as the pass (if it ran here) left it


def delete_instance(rt, principal, instance_id):
    """Delete an instance: stopped if it runs, then `deleted`; its node removes the volume."""
    now = rt.clock.now()
    with write_transaction():
        inst = find_instance(principal, instance_id)
        if inst.state == InstanceState.DELETED.value:
            return inst
        inst.desired_state = "deleted"
        held = _end_run(inst, InstanceState.DELETED, f"deleted by {principal.label}", now)
    owe_stops(held)
    _kick(rt)
    return Instance.get_by_id(inst.id)  # as the pass (if it ran here) left it


def _end_run(inst, final, reason, now):
    """Stop the current run (if any) towards `final` (stopped or deleted); returns the tasks whose
    nodes must be told. With processes still running the instance is `stopping` until they end."""
    job = Job.get_or_none_by_id(inst.run_id) if inst.run_id else None
    held = []
    if job is not None and not JobState(job.state).is_terminal():
        held = stop_job(job, reason, now)
    if job is not None and job.state == JobState.CANCELLING.value:
        if inst.state != InstanceState.STOPPING.value:
            switch_instance_state(inst, InstanceState.STOPPING, f"{reason}; stopping its processes", now)
        else:
            inst.save()
    elif inst.state != final.value and not (
            final is InstanceState.STOPPED and inst.state in (InstanceState.STOPPED.value, InstanceState.FAILED.value)):
        switch_instance_state(inst, final, reason, now)
    else:
        inst.save()
    return held


def resume_instance(rt, principal, instance_id, gpus=None, bid=None):
    """Run a stopped, interrupted or failed instance again, on the node that holds its volume;
    `gpus` and `bid` (spot) change its spec from now on."""
    from fleetd.services import policy, scheduling

    now = rt.clock.now()
    with write_transaction():
        inst = find_instance(principal, instance_id)
        state = InstanceState(inst.state)
        if not state.can_resume():
            raise Conflict(f"instance {instance_id} is {state.value}; only a stopped, interrupted or failed "
                           "instance can be resumed", {"state": state.value})
        if _run_active(inst):
            raise Conflict(f"instance {instance_id} still has processes on node {inst.node_id}; wait for them to "
                           "end or stop it first", {"state": state.value})
        spec = dict(inst.spec)
        if gpus is not None:
            spec["resources"] = dict(spec.get("resources") or {}, gpus=gpus)
        if bid is not None:
            if spec.get("priority_class") != "spot":
                raise InvalidRequest("a bid applies to spot instances only", {"fields": {"bid": ["spot only"]}})
            spec["bid"] = bid
        request = task_request(run_spec(spec, inst.node_id))
        policy.check_bid(spec)
        inst.spec = spec
        _new_run(inst, now, scheduling.never_fits(rt.inventory.get(), request))
        record_event(now, "instance.resumed", "instance", inst.id, f"resumed by {principal.label}",
                     actor=principal.label)
    _kick(rt)
    return Instance.get_by_id(inst.id)  # as the pass (if it ran here) left it


def _run_active(inst):
    """True while a task of its current run is placed or running."""
    if not inst.run_id:
        return False
    return Task.select().where((Task.job == inst.run_id) & Task.state.in_(ACTIVE_TASK_STATES)).exists()


# ---------------------------------------------------------------- what the runs do


def _of_run(job):
    inst = Instance.get_or_none_by_id(job.instance_id)
    return inst if inst is not None and inst.run_id == job.id else None


def run_placed(job, task, now):
    """The scheduler placed a run (inside its write transaction): starting on that node."""
    inst = _of_run(job)
    if inst is None:
        return
    inst.node_id = task.node_id
    inst.price_per_hour = _price(inst.spec, task.gpus)
    switch_instance_state(inst, InstanceState.STARTING, f"placed on node {task.node_id}", now)


def _price(spec, gpus):
    """Per hour: the bid (per GPU-hour) for spot, else the GPU type's price; None when unpriced."""
    count = (spec.get("resources") or {}).get("gpus") or 0
    if not count or not gpus:
        return None
    if spec.get("priority_class") == "spot" and spec.get("bid") is not None:
        return spec["bid"] * count
    row = Gpu.select(Gpu.model).where(Gpu.uuid == gpus[0]["uuid"]).first()
    price = GpuType.get_or_none(GpuType.model == row.model) if row is not None else None
    return None if price is None or price.price_per_hour is None else price.price_per_hour * count


def run_started(task, ports, now):
    """The agent started a run's process (inside the caller's transaction): running."""
    job = Job.get_by_id(task.job_id)
    if job.instance_id is None:
        return
    inst = _of_run(job)
    if inst is None:
        return
    if ports is not None:
        inst.ports = ports
    if inst.state in (InstanceState.STARTING.value, InstanceState.INTERRUPTED.value):
        switch_instance_state(inst, InstanceState.RUNNING, f"started on node {task.node_id}", now)
    else:
        inst.save()


def run_ended(job, task, outcome, reason, now):
    """The task of a run ended (inside end_task's transaction): the run's job ends (runs never
    retry) and the instance becomes stopped, deleted, failed or interrupted. Returns the job."""
    outcome = TaskState(outcome)
    ended = {TaskState.SUCCEEDED: JobState.SUCCEEDED, TaskState.CANCELLED: JobState.CANCELLED}.get(outcome,
                                                                                                 JobState.FAILED)
    if job.state == JobState.CANCELLING.value:
        ended = JobState.CANCELLED
    else:
        job.outcome, job.outcome_reason = ended.value, f"{outcome.value}: {reason}"
    switch_job_state(job, ended, f"run ended: {outcome.value} ({reason})", now)
    inst = _of_run(job)
    if inst is not None and inst.state != InstanceState.DELETED.value:
        _settle(inst, outcome, reason, now)
    return job


def _settle(inst, outcome, reason, now):
    if inst.desired_state == "deleted":
        switch_instance_state(inst, InstanceState.DELETED, "deleted; its processes ended", now)
    elif inst.desired_state == "stopped" or inst.state == InstanceState.STOPPING.value:
        switch_instance_state(inst, InstanceState.STOPPED, f"stopped; its processes ended ({reason})", now)
    elif outcome in (TaskState.LOST, TaskState.PREEMPTED):
        _interrupt(inst, "node_lost" if outcome is TaskState.LOST else "preempted", reason, now)
    else:
        inst.desired_state = "stopped"
        if outcome is TaskState.FAILED:
            switch_instance_state(inst, InstanceState.FAILED, reason, now)
        elif reason.startswith("idle"):
            switch_instance_state(inst, InstanceState.STOPPED, reason, now)
        else:
            policy = (inst.spec.get("restart") or "on-failure")
            switch_instance_state(inst, InstanceState.STOPPED, f"{reason} (restart policy {policy})", now)


def _interrupt(inst, why, reason, now):
    """Interrupted: resumable; after a lost node it resumes by itself when the node is back."""
    if inst.state == InstanceState.INTERRUPTED.value:
        inst.interrupted_by = inst.interrupted_by or why
        inst.status_reason = f"{inst.status_reason}; {reason}"[:2000]
        inst.save()
    else:
        switch_instance_state(inst, InstanceState.INTERRUPTED, reason, now)
        inst.interrupted_by = why
        inst.save()
    if why == "node_lost" and _node_live(inst.node_id):
        _new_run(inst, now)  # the node is fine (its lease lapsed, or its agent restarted): run again


def _node_live(node_id):
    node = Node.get_or_none_by_id(node_id) if node_id else None
    return node is not None and node.status in (NodeStatus.READY.value, NodeStatus.CORDONED.value,
                                                NodeStatus.DRAINING.value, NodeStatus.DRAINED.value)


def node_lost(node_id, reason, now):
    """A node was declared lost (inside switch_node_status): its running instances are interrupted.
    Their runs stay until their leases expire: if the node comes back first, they run on."""
    for inst in Instance.select().where((Instance.node_id == node_id)
                                        & Instance.state.in_([InstanceState.STARTING.value,
                                                              InstanceState.RUNNING.value])):
        switch_instance_state(inst, InstanceState.INTERRUPTED, f"node {node_id} lost: {reason}", now)
        inst.interrupted_by = "node_lost"
        inst.save()


def node_returned(node_id, now):
    """A lost node is back (inside switch_node_status): its instances interrupted by the loss run
    again, the process they still have there, or a new run on it."""
    for inst in Instance.select().where((Instance.node_id == node_id)
                                        & (Instance.state == InstanceState.INTERRUPTED.value)
                                        & (Instance.interrupted_by == "node_lost")):
        if inst.desired_state != "running":
            continue
        task = Task.select().where((Task.job == inst.run_id) & Task.state.in_(ACTIVE_TASK_STATES)).first()
        if task is None:
            _new_run(inst, now)
        elif task.state == TaskState.RUNNING.value:
            switch_instance_state(inst, InstanceState.RUNNING, f"node {node_id} is back; its process ran on", now)
        else:
            switch_instance_state(inst, InstanceState.STARTING, f"node {node_id} is back", now)


def assignment_extra(job):
    """The Assignment's `instance` key of a run (None for batch work)."""
    if job.instance_id is None:
        return None
    return dict(job.spec.get("instance") or {}, id=job.instance_id, name=job.name)


# ---------------------------------------------------------------- volumes and runtime figures


def volumes_to_delete(node_id, present):
    """Of the volumes a node reports, those it must delete: their instance is deleted, gone, or
    moved to another node; never one whose run is active there."""
    present = [p for p in present if isinstance(p, str)][:1000]
    if not present:
        return []
    keep = {i.id for i in Instance.select(Instance.id).where(
        Instance.id.in_(present) & (Instance.state != InstanceState.DELETED.value) & (Instance.node_id == node_id))}
    return [p for p in present if p not in keep]


class RuntimeSamples:
    """The last runtime figures each node reported for its instance runs (in memory; by task id)."""

    def __init__(self, ttl_seconds=120):
        self.ttl_seconds = ttl_seconds
        self._samples = {}
        self._lock = threading.Lock()

    def put(self, samples):
        now = time.monotonic()
        with self._lock:
            for sample in samples:
                self._samples[sample["task_id"]] = (now, sample)
            if len(self._samples) > 100_000:
                self._samples = {k: v for k, v in self._samples.items() if now - v[0] < self.ttl_seconds}

    def get(self, task_id):
        with self._lock:
            found = self._samples.get(task_id)
        if found is None or time.monotonic() - found[0] > self.ttl_seconds:
            return None
        return found[1]


SAMPLES = RuntimeSamples()


# ---------------------------------------------------------------- views


def instance_views(instances, now):
    """Instance dicts of docs/api.md, with the runs' pending reasons and the nodes' addresses
    read in two queries."""
    runs = [i.run_id for i in instances if i.run_id]
    jobs = {j.id: j for j in Job.select(Job.id, Job.pending_reason, Job.state).where(Job.id.in_(runs))} if runs else {}
    tasks = {t.job_id: t for t in Task.select(Task.id, Task.job).where(Task.job.in_(runs))} if runs else {}
    node_ids = list({i.node_id for i in instances if i.node_id})
    nodes = ({n.id: n for n in Node.select(Node.id, Node.address, Node.hostname).where(Node.id.in_(node_ids))}
             if node_ids else {})
    return [_view(i, jobs.get(i.run_id), tasks.get(i.run_id), nodes.get(i.node_id), now) for i in instances]


def instance_view(inst, now):
    return instance_views([inst], now)[0]


def _view(inst, job, task, node, now):
    state = InstanceState(inst.state)
    cost = inst.cost_accrued or 0.0
    if state is InstanceState.RUNNING and inst.running_since is not None:
        cost += (inst.price_per_hour or 0.0) * max(0.0, (now - inst.running_since).total_seconds()) / 3600
    pending = ""
    if state is InstanceState.PENDING:
        pending = (job.pending_reason if job is not None else "") or "waiting for the scheduler"
    return {
        "id": inst.id, "name": inst.name, "owner": inst.owner, "team": inst.team, "state": inst.state,
        "status_reason": inst.status_reason,
        "desired_state": "running" if inst.desired_state == "running" else "stopped",
        "pending_reason": pending, "node_id": inst.node_id, "node_hostname": node.hostname if node else None,
        "interrupted_by": inst.interrupted_by if state is InstanceState.INTERRUPTED else None,
        "spec": _public_spec(inst.spec),
        "created_at": inst.created_at, "started_at": inst.started_at, "stopped_at": inst.stopped_at,
        "price_per_hour": inst.price_per_hour, "cost_so_far": round(cost, 6), "runs": inst.runs,
        "runtime": _runtime(inst, task, node, now) if state is InstanceState.RUNNING else None,
    }


def _public_spec(spec):
    return {k: v for k, v in spec.items() if k != "team"} | {"team": spec.get("team")}


def _runtime(inst, task, node, now):
    sample = SAMPLES.get(task.id) if task is not None else None
    protocols = {p["port"]: p.get("protocol", "http") for p in inst.spec.get("ports") or []}
    address = node.address if node is not None else ""
    return {
        "uptime_seconds": round(max(0.0, (now - inst.started_at).total_seconds()), 3) if inst.started_at else 0,
        "ports": [{"private_port": p["port"], "public_port": p["host_port"], "ip": address,
                   "is_ip_public": _is_public(address), "type": protocols.get(p["port"], "tcp"),
                   "url": connection_url(address, p["host_port"], protocols.get(p["port"], "tcp")) if address else None}
                  for p in inst.ports or []],
        "gpus": (sample or {}).get("gpus") or [],
        "container": (sample or {}).get("container"),
        "restarts": (sample or {}).get("restarts", 0),
        "volume_used_bytes": (sample or {}).get("volume_used_bytes"),
    }


def _is_public(address):
    try:
        return ipaddress.ip_address(address).is_global
    except ValueError:
        return bool(address)  # a host name: assume it resolves where clients are


def connection_url(host, port, protocol):
    """http://HOST:PORT/ for an http port, tcp://HOST:PORT otherwise ([HOST] for IPv6)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" if protocol == "http" else f"tcp://{shown}:{port}"


def connection(rt, principal, instance_id, port=None, wait_seconds=0):
    """{url, host, port, protocol} of one declared port; waits until the instance runs."""
    inst = released(lambda: find_instance(principal, instance_id))
    protocols = {p["port"]: p.get("protocol", "http") for p in inst.spec.get("ports") or []}
    declared = list(protocols)
    if not declared:
        raise NotFound(f"instance {instance_id} declares no ports", {"port": port})
    if port is None:
        if len(declared) > 1:
            raise InvalidRequest(f"instance {instance_id} declares several ports; name one of {declared}",
                                 {"fields": {"port": [f"one of {declared}"]}})
        port = declared[0]
    if port not in declared:
        raise NotFound(f"port {port} is not declared by instance {instance_id}; declared: {declared}",
                       {"port": port, "declared": declared})

    def answer():
        current = released(lambda: find_instance(principal, instance_id))
        state = InstanceState(current.state)
        if state in (InstanceState.STOPPED, InstanceState.STOPPING, InstanceState.FAILED, InstanceState.DELETED) or (
                state is InstanceState.INTERRUPTED and current.interrupted_by != "node_lost"):
            raise Conflict(f"instance {instance_id} is {state.value}; resume it first", {"state": state.value})
        mapped = {p["port"]: p for p in current.ports or []}
        if state is not InstanceState.RUNNING or port not in mapped:
            return None
        node = released(lambda: Node.get_or_none_by_id(current.node_id))
        host = node.address if node is not None else ""
        protocol = protocols[port]
        public = mapped[port]["host_port"]
        return {"url": connection_url(host, public, protocol), "host": host, "port": public, "protocol": protocol}

    found = answer()
    if found is None and wait_seconds > 0:
        wait = min(wait_seconds, rt.settings.long_poll_max_seconds)
        found = rt.notifier.wait(("instance", instance_id), wait, answer)
    if found is None:
        state = find_instance(principal, instance_id).state
        raise Timeout(f"instance {instance_id} is not running yet ({state}); its connection is known once it runs",
                      {"state": state})
    return found


# ---------------------------------------------------------------- retention


def deleted_before(cutoff):
    """Ids of the instances deleted before `cutoff`."""
    return [i.id for i in Instance.select(Instance.id).where((Instance.state == InstanceState.DELETED.value)
                                                             & (Instance.stopped_at < cutoff))]


def delete_records(instance_ids):
    """Forget these deleted instances and their events (their runs go with the old jobs)."""
    for start in range(0, len(instance_ids), 500):
        chunk = instance_ids[start:start + 500]
        Event.delete().where((Event.subject_type == "instance") & Event.subject_id.in_(chunk)).execute()
        Instance.delete().where(Instance.id.in_(chunk)).execute()


# ---------------------------------------------------------------- logs and events


def instance_logs(principal, instance_id, limit, after=None):
    """Log lines of every run of an instance, in order; `after` is the last seq seen."""
    find_instance(principal, instance_id)
    runs = Job.select(Job.id).where(Job.instance_id == instance_id)
    query = LogLine.select().where(LogLine.job.in_(runs))
    if after is not None:
        query = query.where(LogLine.id > after)
    return paginate(query, LogLine.id, limit)


def instance_logs_tail(principal, instance_id, count):
    find_instance(principal, instance_id)
    runs = Job.select(Job.id).where(Job.instance_id == instance_id)
    return last_rows(LogLine.select().where(LogLine.job.in_(runs)), LogLine.id, count)


def instance_events(principal, instance_id, limit, cursor=None, after=None):
    find_instance(principal, instance_id)
    return list_events("instance", instance_id, limit, cursor, after)


def instance_events_tail(principal, instance_id, count):
    find_instance(principal, instance_id)
    return last_rows(Event.select().where((Event.subject_type == "instance") & (Event.subject_id == instance_id)),
                     Event.id, count)


def counts_by_state():
    """{state: count} of instances, for metrics."""
    return dict(Instance.select(Instance.state, fn.COUNT(Instance.id)).group_by(Instance.state).tuples())
