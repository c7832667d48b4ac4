"""Instances: long-running reserved workloads with ports, a volume, stop and resume.

Each run of an instance (its creation, every resume) is one internal one-rank Job whose
`instance_id` names it: the scheduler places it like any job (quotas, priority classes, bids,
windows, preemption), acquire delivers it with an `instance` key in the Assignment, and the
agent supervises it (restart policy, ports, volume). A run never retries: when it ends,
runs.run_ended() decides what the instance becomes. A resumed run is held to the node that keeps
the volume.
"""

import dataclasses
import logging

from peewee import IntegrityError, fn

from fleetd.db import released, write_transaction
from fleetd.errors import Conflict, Forbidden, InvalidRequest, NotFound
from fleetd.models import (
    Event,
    Instance,
    InstanceState,
    Job,
    JobState,
    Node,
    new_id,
)
from fleetd.services.identity import access, limits
from fleetd.services.identity.projects import project_for
from fleetd.services.notify.events import record_event
from fleetd.services.pagination import paginate
from fleetd.services.placement import policy, reasons
from fleetd.services.placement.terms import task_request
from fleetd.services.workloads.lifecycle import owe_stops, switch_instance_state
from fleetd.services.workloads.prices import resumed_price
from fleetd.services.workloads.runs import (
    new_run,
    resumes_by_itself,
    run_active,
    settle_deleting,
    stop_job,
    volumes_removed,
)

log = logging.getLogger(__name__)
CONNECTION_WAIT_MAX_SECONDS = (
    300  # the longest connection wait, in slices (GraphQL; the CLI's --timeout asks REST)
)

# ---------------------------------------------------------------- create, read


def create_instance(rt, principal, spec):
    """Create an instance from a validated InstanceSpec and queue its first run; Conflict when its
    owner (this token) already has an instance of that name that is not deleted, LimitExceeded past
    its limits."""
    now = rt.clock.now()
    project = project_for(principal, spec.project)
    # The team is the project's, else the token's; never the body's.
    spec = dataclasses.replace(spec, team=project.team or principal.team)
    request = task_request(
        spec.run(None), principal.owner_id
    )  # the engine's own checks, before anything is stored
    policy.check_bid(spec)
    policy.check_image(spec.image, spec.node_selector.fleet)
    never = reasons.capacity_reason(rt, request)
    try:
        with write_transaction():
            allowed = limits.hold_owner(rt.settings, principal)
            size = limits.check_spec(
                allowed,
                principal,
                spec,
                "instance",
                stored=limits.spec_bytes(spec) + limits.spec_bytes(spec.run(None)),
            )
            limits.check_new_instance(allowed, principal)
            _refuse_taken_name(principal, spec.name)
            inst = Instance.create(
                id=new_id(),
                name=spec.name,
                owner=principal.name,
                owner_token_id=principal.owner_id,
                team=spec.team,
                project=project.key,
                user=principal.login,
                state=InstanceState.PENDING.value,
                desired_state="running",
                spec=spec.to_dict(),
                created_at=now,
                status_reason=f"created by {principal.label}",
            )
            limits.count_stored(
                principal.owner_id, size
            )  # its first run counts itself (runs.new_run)
            record_event(
                now,
                "instance.created",
                "instance",
                inst.id,
                f"created by {principal.label}",
                None,
                InstanceState.PENDING.value,
                actor=principal.label,
            )
            new_run(rt, inst, now, never)
    except IntegrityError:
        # A create of the same name committed between our check and our insert (PostgreSQL; SQLite's
        # writers queue up front): the unique index refused ours, and nothing of it was stored.
        _refuse_taken_name(principal, spec.name)
        raise
    _kick(rt)
    return Instance.get_by_id(inst.id)  # as the pass (if it ran here) left it


def _refuse_taken_name(principal, name):
    """Conflict when this token owns an instance of this name that is not deleted (migration 0015's
    unique index says the same inside the database)."""
    holder = (
        Instance.select(Instance.id)
        .where(
            (Instance.owner_token_id == principal.owner_id)
            & (Instance.name == name)
            & (Instance.state != InstanceState.DELETED.value)
        )
        .first()
    )
    if holder is not None:
        raise Conflict(
            f"instance name {name!r} is taken by instance {holder.id}: names are unique among your "
            "instances until they are deleted",
            {"name": name, "instance_id": holder.id},
        )


def _kick(rt, capacity=False):
    if rt.scheduler is not None:
        rt.scheduler.kick(capacity=capacity)


def _visible(query, principal):
    return access.readable(query, principal, Instance.owner_token_id, Instance.project)


def find_instance(principal, instance_id, deleted=False):
    """The instance if this principal may see it; NotFound otherwise, and for a deleted one unless
    `deleted` (a deleted instance is gone: only lists by state, logs and events still show it)."""
    inst = Instance.get_or_none_by_id(instance_id)
    if (
        inst is None
        or not access.may_read(principal, inst.owner_token_id, inst.project)
        or (not deleted and inst.state == InstanceState.DELETED.value)
    ):
        raise NotFound(f"instance {instance_id} not found")
    return inst


def changeable_instance(principal, instance_id, deleted=False):
    """find_instance, and Forbidden unless this principal may change it (access.may_change)."""
    inst = find_instance(principal, instance_id, deleted)
    if not access.may_change(principal, inst.owner_token_id, inst.project):
        raise Forbidden(
            f"only its owner, an admin of project {inst.project} or an admin may change instance "
            f"{instance_id}",
            {"instance_id": instance_id},
        )
    return inst


def resolve_instance(principal, handle, limit=100):
    """The instances `handle` names for this principal, oldest first: the one whose id it is; else
    the live ones of that name (one per owner); else the deleted ones of that name. At most
    `limit`."""
    try:
        return [find_instance(principal, handle, deleted=True)]
    except NotFound:
        pass
    named = (
        _visible(Instance.select(), principal)
        .where(Instance.name == handle)
        .order_by(Instance.id)
        .limit(limit)
    )
    return list(named.where(Instance.state != InstanceState.DELETED.value)) or list(
        named.where(Instance.state == InstanceState.DELETED.value)
    )


def list_instances(
    principal,
    limit,
    cursor=None,
    state=None,
    owner=None,
    name=None,
    team=None,
    fleet=None,
    search=None,
):
    """One page of instances, oldest first; deleted ones only when asked for by state. `fleet`:
    those whose node (where they run, or keep their volume) is one of its nodes; `search`: names
    that hold it (any case)."""
    query = _visible(Instance.select(), principal)
    if state:
        query = query.where(Instance.state == state)
    else:
        query = query.where(Instance.state != InstanceState.DELETED.value)
    if owner:
        query = query.where(Instance.owner == owner)
    if name:
        query = query.where(Instance.name == name)
    if team:
        query = query.where(Instance.team == team)
    if fleet:
        query = query.where(Instance.node_id.in_(Node.select(Node.id).where(Node.fleet == fleet)))
    if search:
        query = query.where(Instance.name.contains(search))
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
        lambda: find_instance(principal, instance_id)
    )


# ---------------------------------------------------------------- stop, resume, delete


def stop_instance(rt, principal, instance_id):
    """Stop an instance: its processes end, its GPUs are freed, its volume is kept. Idempotent."""
    now = rt.clock.now()
    with write_transaction():
        inst = changeable_instance(principal, instance_id)
        if inst.state == InstanceState.DELETING.value:
            raise Conflict(f"instance {instance_id} is being deleted", {"state": inst.state})
        inst.desired_state = "stopped"
        held = _end_run(rt, inst, InstanceState.STOPPED, f"stopped by {principal.label}", now)
    owe_stops(rt, held)
    _kick(rt)
    return Instance.get_by_id(inst.id)  # as the pass (if it ran here) left it


def stop_by_fleetd(rt, instance_id, reason):
    """Stop an instance for fleetd's own reason (a team budget's stop_spot), as stop_instance does;
    nothing when it holds no run (an interrupted one that resumes by itself holds its queued
    run)."""
    now = rt.clock.now()
    with write_transaction():
        inst = Instance.get_or_none_by_id(instance_id)
        if (
            inst is None
            or inst.state == InstanceState.STOPPING.value
            or not (InstanceState(inst.state).holds_run() or resumes_by_itself(inst))
        ):
            return
        inst.desired_state = "stopped"
        held = _end_run(rt, inst, InstanceState.STOPPED, reason, now)
    owe_stops(rt, held)
    _kick(rt)


def delete_instance(rt, principal, instance_id):
    """Delete an instance: `deleted` at once when no process of it runs and no live node keeps its
    volume, else `deleting` until its processes ended and its node removed the volume."""
    now = rt.clock.now()
    with write_transaction():
        inst = changeable_instance(principal, instance_id, deleted=True)
        if inst.state in (InstanceState.DELETED.value, InstanceState.DELETING.value):
            return inst
        inst.desired_state = "deleted"
        held = _end_run(rt, inst, InstanceState.DELETED, f"deleted by {principal.label}", now)
    owe_stops(rt, held)
    _kick(
        rt, capacity=True
    )  # its host ports are free on its node: an instance parked at its owner's cap may fit
    return Instance.get_by_id(inst.id)  # as the pass (if it ran here) left it


def _end_run(rt, inst, final, reason, now):
    """Stop the current run (if any) towards `final` (stopped or deleted); returns the tasks whose
    nodes must be told. With processes still running the instance is `stopping` (`deleting`) until
    they end."""
    job = Job.get_or_none_by_id(inst.run_id) if inst.run_id else None
    held = []
    if job is not None and not JobState(job.state).is_terminal():
        held = stop_job(rt, job, reason, now)
    on_the_way = (
        InstanceState.DELETING if final is InstanceState.DELETED else InstanceState.STOPPING
    )
    if job is not None and job.state == JobState.CANCELLING.value:
        if inst.state != on_the_way.value:
            switch_instance_state(rt, inst, on_the_way, f"{reason}; stopping its processes", now)
        else:
            inst.save()
    elif final is InstanceState.DELETED:
        settle_deleting(rt, inst, reason, now)
    elif inst.state != final.value and not (
        final is InstanceState.STOPPED
        and inst.state in (InstanceState.STOPPED.value, InstanceState.FAILED.value)
    ):
        switch_instance_state(rt, inst, final, reason, now)
    else:
        inst.save()
    return held


def resume_instance(rt, principal, instance_id, gpus=None, bid=None):
    """Run a stopped, interrupted or failed instance again, on the node that holds its volume;
    `gpus` and `bid` (spot) change its spec from now on."""
    now = rt.clock.now()
    with write_transaction():
        inst = changeable_instance(principal, instance_id)
        state = InstanceState(inst.state)
        if not state.can_resume():
            raise Conflict(
                f"instance {instance_id} is {state.value}; only a stopped, interrupted or failed "
                "instance can be resumed",
                {"state": state.value},
            )
        if run_active(inst):
            raise Conflict(
                f"instance {instance_id} still has processes on node {inst.node_id}; wait for them "
                "to end or stop it first",
                {"state": state.value},
            )
        spec = inst.instance_spec
        if gpus is not None:
            spec = dataclasses.replace(
                spec, resources=dataclasses.replace(spec.resources, gpus=gpus)
            )
        if bid is not None:
            if spec.priority_class != "spot":
                raise InvalidRequest(
                    "a bid applies to spot instances only", {"fields": {"bid": ["spot only"]}}
                )
            spec = dataclasses.replace(spec, bid=bid)
        request = task_request(spec.run(inst.node_id), inst.owner_token_id)
        policy.check_bid(spec)
        # The new run stores its spec, and a changed spec takes its own size: both count for the
        # owner.
        grown = limits.spec_bytes(spec) - limits.stored_size(inst.spec)
        if (
            inst.owner_token_id == principal.owner_id
        ):  # an admin's resume of another's instance is not held to its limits
            limits.check_stored(
                limits.hold_owner(rt.settings, principal),
                principal,
                grown + limits.spec_bytes(spec.run(inst.node_id)),
                "resume",
            )
        inst.spec = spec.to_dict()
        inst.price_per_hour = resumed_price(
            inst, spec
        )  # the new run's (a new bid's, a new GPU count's)
        queued = Job.get_by_id(inst.run_id) if resumes_by_itself(inst) else None
        if (
            queued is not None
        ):  # the run it was to resume with by itself: replaced by this one, of the new spec
            stop_job(rt, queued, f"replaced by the run of the resume by {principal.label}", now)
        new_run(rt, inst, now, reasons.never_fits(rt.inventory.get(), request))
        limits.count_stored(inst.owner_token_id, grown)
        record_event(
            now,
            "instance.resumed",
            "instance",
            inst.id,
            f"resumed by {principal.label}",
            actor=principal.label,
        )
    _kick(rt)
    return Instance.get_by_id(inst.id)  # as the pass (if it ran here) left it


# ---------------------------------------------------------------- what the runs do


# ---------------------------------------------------------------- volumes and runtime figures


def volumes_to_delete(node_id, present):
    """Of the volumes a node reports, those it must delete: their instance is deleted, gone, or
    moved to another node; never one whose run is active there."""
    present = [p for p in present if isinstance(p, str)][:1000]
    if not present:
        return []
    keep = {
        i.id
        for i in Instance.select(Instance.id, Instance.state, Instance.run_id).where(
            Instance.id.in_(present)
            & (Instance.state != InstanceState.DELETED.value)
            & (Instance.node_id == node_id)
        )
        if i.state != InstanceState.DELETING.value or run_active(i)
    }
    return [p for p in present if p not in keep]


def volumes_reported(rt, node_id, present):
    """A node's heartbeat listed the volumes it holds: its deleting instances whose volume is gone
    (and whose processes ended) are deleted. Reads only, unless one is."""
    present = [p for p in present if isinstance(p, str)]
    deleting = [
        i.id
        for i in Instance.select(Instance.id).where(
            (Instance.node_id == node_id) & (Instance.state == InstanceState.DELETING.value)
        )
    ]
    if not any(i not in present for i in deleting):
        return
    with write_transaction():
        volumes_removed(rt, node_id, present, rt.clock.now())
    _kick(rt, capacity=True)  # their host ports are free on that node now


# ---------------------------------------------------------------- retention


def deleted_before(cutoff):
    """Ids of the instances deleted before `cutoff`."""
    return [
        i.id
        for i in Instance.select(Instance.id).where(
            (Instance.state == InstanceState.DELETED.value) & (Instance.stopped_at < cutoff)
        )
    ]


def delete_records(instance_ids):
    """Forget these deleted instances and their events (their runs go with the old jobs)."""
    for start in range(0, len(instance_ids), 500):
        chunk = instance_ids[start : start + 500]
        Event.delete().where(
            (Event.subject_type == "instance") & Event.subject_id.in_(chunk)
        ).execute()
        limits.release_stored(Instance, chunk)
        Instance.delete().where(Instance.id.in_(chunk)).execute()


# ---------------------------------------------------------------- logs and events


def counts_by_state():
    """{state: count} of instances, for metrics."""
    return dict(
        Instance.select(Instance.state, fn.COUNT(Instance.id))
        .group_by(Instance.state)
        .tuples()
        .execute()
    )
