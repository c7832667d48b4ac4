"""The agent protocol's sessions: register, heartbeat (one step per concern), deregister."""

import dataclasses
import datetime
import typing

from fleetd.credentials import NODE_PREFIX, hash_token, make_token
from fleetd.db import write_transaction
from fleetd.errors import Conflict, Unauthorized
from fleetd.models import JoinToken, Node, NodeStatus, new_id
from fleetd.services.agents.leases import reconcile_reported_tasks
from fleetd.services.fleet_ops.fleets import consume_join_token
from fleetd.services.nodes import hosts, validation
from fleetd.services.nodes.health_policy import apply_health_policy
from fleetd.services.nodes.inventory import learned_gpu_status, replace_gpus, set_gpu_status
from fleetd.services.nodes.labels import apply_agent_labels, merged_labels
from fleetd.services.nodes.nodes import (
    LIVE_STATUSES,
    find_node,
    settle_drain,
    settle_drain_of,
    switch_node_status,
)
from fleetd.services.notify.events import acting_as, record_event
from fleetd.services.placement import mig_plan
from fleetd.services.placement.parking import freed_on, node_changed
from fleetd.services.workloads import instances
from fleetd.sql import Statement
from fleetwire.heartbeat import Heartbeat, HeartbeatReply
from fleetwire.registration import Registered

_NODE_OF_MACHINE = Statement(
    lambda v: Node.select().where(Node.machine_id == v("machine_id")).limit(1)
)
CAPABILITY_KEYS = ("isolation", "isolation_reason", "containers", "host_uids", "accounts")
AGENT_DRAINING = (
    "agent draining"  # the reason of a cordon the agent asked for (heartbeat draining: true)
)


def stored_capabilities(reported):
    """What a node keeps of the capabilities its agent reported (None: it said nothing of them)."""
    kept = {key: reported[key] for key in CAPABILITY_KEYS if key in (reported or {})}
    if "host_uids" in kept:
        kept["host_uids"] = sorted(set(kept["host_uids"]))
    return kept or None


def register_node(rt, join_token_id, reg):
    """Admit a host with a join token (`reg`: a fleetwire Registration); the same machine_id gets
    its old node and a new session. Returns the fleetwire Registered (the session token shown
    once). Past what this process admits (admission.Registrations): RateLimited (429 with
    Retry-After), before any database work, so that a storm of hosts leaves room for the jobs'
    requests."""
    with rt.registrations.admitted(rt.clock.monotonic()):
        return _register_node(rt, join_token_id, reg)


def _register_node(rt, join_token_id, reg):
    now = rt.clock.now()
    session_id, session_token = make_token(NODE_PREFIX)
    capabilities = reg.capabilities or {}
    fields = dict(
        hostname=reg.hostname,
        address=reg.address or "",
        labels=reg.labels or {},
        agent_labels=reg.labels or {},
        agent_version=reg.agent_version or "",
        cpu_count=reg.resources.cpu_count,
        memory_bytes=reg.resources.memory_bytes,
        container_runtime=capabilities.get("container_runtime", reg.resources.container_runtime),
        capabilities=stored_capabilities(capabilities),
        topology=reg.topology.to_wire() if reg.topology is not None else None,
        gpu_status="ok" if reg.gpus else "cpu_only",
        gpu_status_reason="" if reg.gpus else "no GPU reported at registration",
        session_id=session_id,
        session_hash=hash_token(session_token),
        join_token_id=join_token_id,
        # Written with the row: a node is heard when it registers. Another replica's leader reads
        # this until this replica's next round writes down the node's heartbeats (no time at all
        # would read as a node silent since forever, and declare it lost).
        last_heartbeat_at=now,
    )
    with write_transaction():
        token = JoinToken.get_or_none_by_id(
            join_token_id
        )  # checked when the request was authenticated
        if token is None:
            raise Unauthorized("join token expired, revoked or used up")
        # The node is the actor of its registration; who let it in is whoever made the join token
        # (a provisioning tool's own token, or an operator's token or session).
        admitted = f" with join token {token.id}" + (
            f" made by {token.created_by}" if token.created_by else ""
        )
        node = _NODE_OF_MACHINE.first(machine_id=reg.machine_id)
        if node is not None:
            _check_takeover(rt, node, token.fleet_id)
        returning, retired = hosts.returning_node(reg.machine_id) if node is None else (None, None)
        if node is None:
            node = Node.create(
                id=returning or new_id(),
                fleet=token.fleet_id,
                machine_id=reg.machine_id,
                status=NodeStatus.PENDING.value,
                status_reason="registered; waiting for the first heartbeat",
                registered_at=now,
                **fields,
            )
            again = (
                ""
                if retired is None
                else (
                    f" again, under the id its host had until its node was deleted "
                    f"({retired.retired_at.isoformat()}Z)"
                )
            )
            hosts.forget(retired)
            record_event(
                now,
                "node.registered",
                "node",
                node.id,
                f"registered in fleet {token.fleet_id}{again}{admitted}",
                None,
                NodeStatus.PENDING.value,
                actor=f"node:{node.id}",
            )
        else:
            moved = node.fleet_id != token.fleet_id
            reason = (
                f"re-registered by {fields['hostname']}{admitted}; previous session invalidated"
            )
            if moved:
                reason += f"; moved from fleet {node.fleet_id} to {token.fleet_id}"
            for name, value in fields.items():
                setattr(node, name, value)
            node.labels = merged_labels(
                node.agent_labels, node.label_overrides
            )  # those set through the API stay
            node.fleet = token.fleet_id
            node.save()
            record_event(
                now,
                "node.registered",
                "node",
                node.id,
                reason,
                node.status,
                node.status,
                actor=f"node:{node.id}",
            )
            if node.status == NodeStatus.REVOKED.value:
                switch_node_status(
                    rt,
                    node,
                    NodeStatus.PENDING,
                    "re-enrolled with a new join token",
                    now,
                    actor=f"node:{node.id}",
                )
        with acting_as(
            f"node:{node.id}"
        ):  # the host reports its GPUs (its principal is the join token)
            replace_gpus(node, list(reg.gpus), now)
        # Last: its conditional UPDATE is what admits one host per use, and it locks the token's row
        # until commit. Taken first, every other registration with this token (a storm) waited for
        # the whole of this one, each holding a pooled connection.
        if not consume_join_token(now, join_token_id):
            raise Unauthorized("join token expired, revoked or used up")
    rt.liveness.touch(node.id)
    return Registered(
        node_id=node.id,
        fleet=node.fleet_id,
        session_token=session_token,
        heartbeat_interval_seconds=rt.liveness.heartbeat_interval(),
    )


_LIVE = (
    NodeStatus.READY.value,
    NodeStatus.CORDONED.value,
    NodeStatus.DRAINING.value,
    NodeStatus.DRAINED.value,
    NodeStatus.VALIDATING.value,
    NodeStatus.FAILED_VALIDATION.value,
)


def _check_takeover(rt, node, fleet):
    """Refuse (409) a join token re-enrolling a node of another fleet, or a node that is alive.

    A machine id is only the host's claim: without this, any join token could take over any
    node (its id, name and address) and cut the real host off. A revoked node may be enrolled
    anew anywhere; a lost or deregistered one again in its own fleet.
    """
    if node.status == NodeStatus.REVOKED.value:
        return
    if node.fleet_id != fleet:
        raise Conflict(
            f"this machine is enrolled as node {node.id} in fleet {node.fleet_id}; a join token of "
            f"fleet {fleet} cannot take it over (an admin must revoke or delete that node first)",
            {"node_id": node.id, "reason": "other_fleet"},
        )
    seen = rt.liveness.get(node.id)
    if (
        node.status in _LIVE
        and seen is not None
        and rt.clock.monotonic() - seen.monotonic < rt.settings.node_ttl_seconds
    ):
        raise Conflict(
            f"node {node.id} with this machine id is alive (it heartbeated "
            f"{rt.clock.monotonic() - seen.monotonic:.0f} s ago); stop its agent and retry after "
            f"{rt.settings.node_ttl_seconds:g} s, or have an admin revoke it first",
            {"node_id": node.id, "reason": "alive"},
        )


@dataclasses.dataclass
class Beat:
    """One heartbeat being applied: what the node sent, and what its steps learned on the way."""

    rt: typing.Any
    node: Node
    beat: Heartbeat
    now: datetime.datetime
    runtime: str | None = None  # the container runtime it reports (else the one known)
    capabilities: dict | None = None  # what the node keeps of its reported capabilities
    gpu_status: tuple | None = None  # (status, reason) its GPUs' readings say, when that changed
    joined: bool = False  # it was pending: this is its first heartbeat
    gpu_change: typing.Any = None  # what replace_gpus changed

    def new_agent(self):
        beat, node = self.beat, self.node
        return (beat.agent_version is not None and beat.agent_version != node.agent_version) or (
            beat.bundle_sha256 is not None and beat.bundle_sha256 != node.bundle_sha256
        )

    def new_labels(self):
        return self.beat.labels is not None and self.beat.labels != self.node.agent_labels


def heartbeat(rt, node, beat):
    """Renew liveness in memory; touch the database only when something changed, one step per
    concern (STEPS). The answer says the interval to the next heartbeat and the task lease
    (docs/api.md, Heartbeat).

    `node` is the Node row loaded when its session token was checked in this request; `beat` a
    fleetwire Heartbeat. Returns a fleetwire HeartbeatReply.
    """
    if node.status == NodeStatus.REVOKED.value:
        rt.liveness.forget(node.id)
        return HeartbeatReply(
            status=node.status,
            revoked=True,
            cancel=tuple(t.id for t in beat.tasks),
            heartbeat_interval_seconds=rt.liveness.heartbeat_interval(),
        )
    cancel = renew(rt, node, beat)
    step = Beat(rt, node, beat, rt.clock.now())
    learn(step)
    changed = False
    if needs_write(step):
        with write_transaction():
            step.node = find_node(node.id)
            for apply in STEPS:
                changed = apply(step) or changed  # every step runs; any may say capacity changed
    node, now = step.node, step.now
    if (
        node.status == NodeStatus.DRAINING.value
        and node.drain_deadline is not None
        and node.drain_deadline <= now
    ):
        settle_drain_of(
            rt, node.id
        )  # the leader stops what is left, fenced; another replica leaves it
    if changed and rt.scheduler is not None:
        rt.scheduler.kick(what=node_changed(node))  # new or returning capacity
    # First: a validation past its deadline fails here, and the answer's status says so.
    suite = validation.heartbeat_validation(rt, node, now)  # the suite to run while validating
    return HeartbeatReply(
        status=node.status,
        drain=node.drain,
        cancel=tuple(cancel),
        delete_volumes=tuple(instances.volumes_to_delete(node.id, list(beat.volumes)))
        if beat.volumes
        else (),
        heartbeat_interval_seconds=rt.liveness.heartbeat_interval(),
        # The node stops its job tasks before this runs out unheard (agent/lease.py): told on every
        # answer, widened with the interval just given.
        lease_seconds=rt.leases.ttl,
        validation=suite,
        lookup_accounts=rt.accounts.lookups_for(node),
        # A read a heartbeat makes only for a node whose GPUs are in MIG mode (a quarter of the
        # first heartbeats' cost in a storm was this read, for nodes without MIG)
        mig_layouts=mig_plan.layouts_for(node.id) if rt.inventory.may_hold_mig(node.id) else (),
    )


def renew(rt, node, beat):
    """What every heartbeat does, in memory or without a transaction of its own: liveness, the
    leases of the tasks it lists (returns those it must stop), its instances' figures, its
    volumes."""
    if rt.liveness.touch(node.id, beat.tasks, beat.metrics) and rt.scheduler is not None:
        # A process the node listed is gone: a task fleetd ended before (cancelled, preempted)
        # held its GPUs until now, and work parked for this node's capacity may fit.
        rt.scheduler.kick(what=freed_on(rt, node.id))
    cancel = reconcile_reported_tasks(rt, node, beat.tasks)
    if beat.instances:
        rt.samples.put(list(beat.instances))
    if beat.volumes is not None:
        instances.volumes_reported(rt, node.id, list(beat.volumes))
    return cancel


def learn(step):
    """What the heartbeat says that the node row does not know yet (read without a transaction)."""
    node, beat = step.node, step.beat
    reported = beat.capabilities
    step.runtime = (reported or {}).get("container_runtime", node.container_runtime)
    step.capabilities = node.capabilities if reported is None else stored_capabilities(reported)
    step.gpu_status = learned_gpu_status(
        node, None if beat.gpus is None else list(beat.gpus), beat.metrics
    )


def needs_write(step):
    """True when the node's row must change (or its status may): else the heartbeat writes
    nothing."""
    node = step.node
    return (
        step.new_agent()
        or step.new_labels()
        or step.beat.gpus is not None
        or bool(step.beat.mig_events)
        or step.runtime != node.container_runtime
        or step.gpu_status is not None
        or step.capabilities != node.capabilities
        or agent_drain_step(node, step.beat.draining) is not None
        or node.status
        in (NodeStatus.PENDING.value, NodeStatus.LOST.value, NodeStatus.DRAINING.value)
    )


# The steps of a heartbeat that writes, in order, inside one transaction. Each takes the Beat and
# returns True when the node's capacity changed (the scheduler is kicked after the commit).


def step_gpu_status(step):
    if step.gpu_status is not None:
        status, reason = step.gpu_status
        set_gpu_status(step.node, status, reason, step.now)
    return False


def step_agent_version(step):
    """An in-place upgrade (or downgrade) keeps the node: fleetd learns the new version here."""
    if step.new_agent():
        node, beat = step.node, step.beat
        node.agent_version = (
            beat.agent_version if beat.agent_version is not None else node.agent_version
        )
        node.bundle_sha256 = (
            beat.bundle_sha256 if beat.bundle_sha256 is not None else node.bundle_sha256
        )
        node.save()
    return False


def step_agent_labels(step):
    """The agent's config file changed (a rerun of provisioning with other labels)."""
    return bool(step.new_labels() and apply_agent_labels(step.node, step.beat.labels))


def step_mig_events(step):
    """Dynamic MIG results: before step_gpus, whose new rows keep what this step wrote."""
    return mig_plan.apply_mig_events(step.node, step.beat.mig_events, step.now)


def step_gpus(step):
    step.joined = step.node.status == NodeStatus.PENDING.value
    if step.beat.gpus is None:
        return False
    step.gpu_change = replace_gpus(step.node, list(step.beat.gpus), step.now)
    topology = step.beat.topology
    if topology is not None and topology.to_wire() != step.node.topology:
        step.node.topology = topology.to_wire()  # an agent enrolled before it reported one
        step.node.save()
        return True
    return bool(step.gpu_change)


def step_capabilities(step):
    node = step.node
    if step.runtime == node.container_runtime and step.capabilities == node.capabilities:
        return False
    node.container_runtime, node.capabilities = step.runtime, step.capabilities
    node.save()
    return True


def step_first_or_returning(step):
    """A pending node's first heartbeat (ready, or validating in a gated fleet); a lost node's
    return."""
    node = step.node
    if node.status == NodeStatus.PENDING.value:
        validation.gate_first_heartbeat(step.rt, node, step.now)
        return True
    if node.status == NodeStatus.LOST.value:
        back_to = node.status_before_lost or NodeStatus.READY.value
        if back_to == NodeStatus.PENDING.value:
            back_to = NodeStatus.READY.value
        switch_node_status(step.rt, node, back_to, "heartbeats resumed", step.now)
        return True
    return False


def step_agent_drain(step):
    to = agent_drain_step(step.node, step.beat.draining)
    if to is None:
        return False
    switch_node_status(
        step.rt,
        step.node,
        to,
        AGENT_DRAINING if to == NodeStatus.CORDONED else "agent no longer draining",
        step.now,
    )
    return True


def step_health(step):
    return bool(
        apply_health_policy(
            step.rt, step.node, step.now, step.gpu_change, step.beat.gpus is not None, step.joined
        )
    )


def step_drain(step):
    return settle_drain(step.rt, step.node, step.now, deadline=False) is not None


STEPS = (
    step_gpu_status,
    step_agent_version,
    step_agent_labels,
    step_mig_events,
    step_gpus,
    step_capabilities,
    step_first_or_returning,
    step_agent_drain,
    step_health,
    step_drain,
)


def agent_drain_step(node, draining):
    """The status a heartbeat's `draining` moves the node to, or None: a ready node whose agent says
    it is draining is cordoned (reason "agent draining"); that cordon, and only that one (an admin's
    stays), ends when the agent says it no longer is. Without the field nothing changes."""
    if draining is True and node.status == NodeStatus.READY.value:
        return NodeStatus.CORDONED
    if (
        draining is False
        and node.status == NodeStatus.CORDONED.value
        and node.status_reason == AGENT_DRAINING
    ):
        return NodeStatus.READY
    return None


def deregister_node(rt, node_id):
    """Graceful leave: the session ends and the node is marked lost at once, not after a TTL."""
    now = rt.clock.now()
    with write_transaction():
        node = find_node(node_id)
        if node is None:
            raise Unauthorized("node no longer exists")
        node.session_id = node.session_hash = None
        node.save()
        if NodeStatus(node.status) in LIVE_STATUSES:
            switch_node_status(
                rt, node, NodeStatus.LOST, "agent deregistered (graceful leave)", now
            )
    rt.liveness.forget(node_id)
