"""The agent protocol: register, heartbeat, deregister."""

from fleetd.credentials import NODE_PREFIX, hash_token, make_token
from fleetd.db import write_transaction
from fleetd.errors import Conflict, Unauthorized
from fleetd.models import JoinToken, Node, NodeStatus, new_id
from fleetd.services import hosts, instances, validation
from fleetd.services.events import acting_as, record_event
from fleetd.services.fleets import consume_join_token
from fleetd.services.health import apply_health_policy
from fleetd.services.labels import apply_agent_labels, merged_labels
from fleetd.services.nodes import (
    LIVE_STATUSES,
    find_node,
    learned_gpu_status,
    replace_gpus,
    set_gpu_status,
    settle_drain,
    settle_drain_of,
    switch_node_status,
)
from fleetd.services.parking import node_changed
from fleetd.services.work import reconcile_reported_tasks
from fleetd.sql import Statement

_NODE_OF_MACHINE = Statement(lambda v: Node.select().where(Node.machine_id == v("machine_id")).limit(1))
CAPABILITY_KEYS = ("isolation", "isolation_reason", "containers", "host_uids")
AGENT_DRAINING = "agent draining"  # the reason of a cordon the agent asked for (heartbeat draining: true)


def stored_capabilities(reported):
    """What a node keeps of the capabilities its agent reported (None: it said nothing of them)."""
    kept = {key: reported[key] for key in CAPABILITY_KEYS if key in (reported or {})}
    if "host_uids" in kept:
        kept["host_uids"] = sorted(set(kept["host_uids"]))
    return kept or None


def register_node(rt, join_token_id, info):
    """Admit a host with a join token; the same machine_id gets its old node and a new session.

    Returns (node, session_token).
    """
    now = rt.clock.now()
    session_id, session_token = make_token(NODE_PREFIX)
    capabilities = info.get("capabilities") or {}
    fields = dict(
        hostname=info["hostname"],
        address=info.get("address") or "",
        labels=info.get("labels") or {},
        agent_labels=info.get("labels") or {},
        agent_version=info.get("agent_version") or "",
        cpu_count=info["resources"]["cpu_count"],
        memory_bytes=info["resources"]["memory_bytes"],
        container_runtime=capabilities.get("container_runtime", info["resources"].get("container_runtime")),
        capabilities=stored_capabilities(capabilities),
        gpu_status="ok" if info["gpus"] else "cpu_only",
        gpu_status_reason="" if info["gpus"] else "no GPU reported at registration",
        session_id=session_id,
        session_hash=hash_token(session_token),
        join_token_id=join_token_id,
        # Written with the row: a node is heard when it registers. Another replica's leader reads
        # this until this replica's next round writes down the node's heartbeats (no time at all
        # would read as a node silent since forever, and declare it lost).
        last_heartbeat_at=now,
    )
    with write_transaction():
        token = JoinToken.get_or_none_by_id(join_token_id)  # checked when the request was authenticated
        if token is None:
            raise Unauthorized("join token expired, revoked or used up")
        node = _NODE_OF_MACHINE.first(machine_id=info["machine_id"])
        if node is not None:
            _check_takeover(rt, node, token.fleet_id)
        returning, retired = hosts.returning_node(info["machine_id"]) if node is None else (None, None)
        if node is None:
            node = Node.create(
                id=returning or new_id(),
                fleet=token.fleet_id,
                machine_id=info["machine_id"],
                status=NodeStatus.PENDING.value,
                status_reason="registered; waiting for the first heartbeat",
                registered_at=now,
                **fields,
            )
            again = "" if retired is None else \
                f" again, under the id its host had until its node was deleted ({retired.retired_at.isoformat()}Z)"
            hosts.forget(retired)
            record_event(now, "node.registered", "node", node.id, f"registered in fleet {token.fleet_id}{again}", None,
                         NodeStatus.PENDING.value, actor=f"node:{node.id}")
        else:
            moved = node.fleet_id != token.fleet_id
            reason = f"re-registered by {fields['hostname']}; previous session invalidated"
            if moved:
                reason += f"; moved from fleet {node.fleet_id} to {token.fleet_id}"
            for name, value in fields.items():
                setattr(node, name, value)
            node.labels = merged_labels(node.agent_labels, node.label_overrides)  # those set through the API stay
            node.fleet = token.fleet_id
            node.save()
            record_event(now, "node.registered", "node", node.id, reason, node.status, node.status,
                         actor=f"node:{node.id}")
            if node.status == NodeStatus.REVOKED.value:
                switch_node_status(node, NodeStatus.PENDING, "re-enrolled with a new join token", now,
                                   actor=f"node:{node.id}")
        with acting_as(f"node:{node.id}"):  # the host reports its GPUs (its principal is the join token)
            replace_gpus(node, info.get("gpus") or [], now)
        # Last: its conditional UPDATE is what admits one host per use, and it locks the token's row
        # until commit. Taken first, every other registration with this token (a storm) waited for
        # the whole of this one, each holding a pooled connection.
        if not consume_join_token(now, join_token_id):
            raise Unauthorized("join token expired, revoked or used up")
    rt.liveness.touch(node.id)
    return node, session_token


_LIVE = (NodeStatus.READY.value, NodeStatus.CORDONED.value, NodeStatus.DRAINING.value, NodeStatus.DRAINED.value,
         NodeStatus.VALIDATING.value, NodeStatus.FAILED_VALIDATION.value)


def _check_takeover(rt, node, fleet):
    """Refuse (409) a join token re-enrolling a node of another fleet, or a node that is alive.

    A machine id is only the host's claim: without this, any join token could take over any
    node (its id, name and address) and cut the real host off. A revoked node may be enrolled
    anew anywhere; a lost or deregistered one again in its own fleet.
    """
    if node.status == NodeStatus.REVOKED.value:
        return
    if node.fleet_id != fleet:
        raise Conflict(f"this machine is enrolled as node {node.id} in fleet {node.fleet_id}; a join token of "
                       f"fleet {fleet} cannot take it over (an admin must revoke or delete that node first)",
                       {"node_id": node.id, "reason": "other_fleet"})
    seen = rt.liveness.get(node.id)
    if node.status in _LIVE and seen is not None and rt.clock.monotonic() - seen.monotonic < rt.settings.node_ttl_seconds:
        raise Conflict(f"node {node.id} with this machine id is alive (it heartbeated "
                       f"{rt.clock.monotonic() - seen.monotonic:.0f} s ago); stop its agent and retry after "
                       f"{rt.settings.node_ttl_seconds:g} s, or have an admin revoke it first",
                       {"node_id": node.id, "reason": "alive"})


def heartbeat(rt, node, body):
    """Renew liveness in memory; touch the database only when something changed. The answer
    says the interval to the next heartbeat and the task lease (docs/api.md, Heartbeat).

    `node` is the Node row loaded when its session token was checked in this request.
    """
    now = rt.clock.now()
    node_id = node.id
    reported = body.get("tasks") or []
    if node.status == NodeStatus.REVOKED.value:
        rt.liveness.forget(node.id)
        return {"status": node.status, "drain": None, "revoked": True, "cancel": [t["id"] for t in reported],
                "heartbeat_interval_seconds": rt.liveness.heartbeat_interval()}
    rt.liveness.touch(node.id, reported, body.get("metrics"))
    cancel = reconcile_reported_tasks(rt, node, reported)
    if body.get("instances"):
        rt.samples.put(body["instances"])
    if body.get("volumes") is not None:
        instances.volumes_reported(rt, node_id, body["volumes"])
    gpus = body.get("gpus")
    reported = body.get("capabilities")
    runtime = (reported or {}).get("container_runtime", node.container_runtime)
    capabilities = node.capabilities if reported is None else stored_capabilities(reported)
    version = body.get("agent_version")
    bundle_sha = body.get("bundle_sha256")
    agent_labels = body.get("labels")
    new_labels = agent_labels is not None and agent_labels != node.agent_labels
    new_agent = (version is not None and version != node.agent_version) or \
        (bundle_sha is not None and bundle_sha != node.bundle_sha256)
    gpu_status = learned_gpu_status(node, gpus, body.get("metrics"))
    draining = body.get("draining")
    changed = False
    if new_agent or new_labels or gpus is not None or runtime != node.container_runtime or gpu_status is not None or \
            capabilities != node.capabilities or agent_drain_step(node, draining) is not None or \
            node.status in (NodeStatus.PENDING.value, NodeStatus.LOST.value, NodeStatus.DRAINING.value):
        with write_transaction():
            node = find_node(node_id)
            if gpu_status is not None:
                status, reason = gpu_status
                set_gpu_status(node, status, reason, now)
            if new_agent:
                # An in-place upgrade (or downgrade) keeps the node: fleetd learns the new version here.
                node.agent_version = version if version is not None else node.agent_version
                node.bundle_sha256 = bundle_sha if bundle_sha is not None else node.bundle_sha256
                node.save()
            if new_labels:  # the agent's config file changed (a rerun of provisioning with other labels)
                changed = apply_agent_labels(node, agent_labels) or changed
            joined, gpu_change = node.status == NodeStatus.PENDING.value, None
            if gpus is not None:
                gpu_change = replace_gpus(node, gpus, now)
                changed = gpu_change or changed
            if runtime != node.container_runtime or capabilities != node.capabilities:
                node.container_runtime, node.capabilities = runtime, capabilities
                node.save()
                changed = True
            if node.status == NodeStatus.PENDING.value:
                validation.gate_first_heartbeat(node, now)  # ready, or validating in a gated fleet
                changed = True
            elif node.status == NodeStatus.LOST.value:
                back_to = node.status_before_lost or NodeStatus.READY.value
                if back_to == NodeStatus.PENDING.value:
                    back_to = NodeStatus.READY.value
                switch_node_status(node, back_to, "heartbeats resumed", now)
                changed = True
            step = agent_drain_step(node, draining)
            if step is not None:
                switch_node_status(node, step, AGENT_DRAINING if step == NodeStatus.CORDONED else
                                   "agent no longer draining", now)
                changed = True
            changed = apply_health_policy(rt, node, now, gpu_change, gpus is not None, joined) or changed
            changed = settle_drain(node, now, deadline=False) is not None or changed
    if node.status == NodeStatus.DRAINING.value and node.drain_deadline is not None and node.drain_deadline <= now:
        settle_drain_of(rt, node_id)  # the leader stops what is left, fenced; another replica leaves it
    if changed and rt.scheduler is not None:
        rt.scheduler.kick(what=node_changed(node))  # new or returning capacity
    interval = rt.liveness.heartbeat_interval()
    suite = validation.heartbeat_validation(rt, node, now)  # the suite to run while validating (or it timed out)
    reply = {
        "status": node.status,
        "drain": node.drain,
        "revoked": False,
        "cancel": cancel,
        "delete_volumes": instances.volumes_to_delete(node_id, body["volumes"]) if body.get("volumes") else [],
        "heartbeat_interval_seconds": interval,
        # The node stops its job tasks before this runs out unheard (agent/lease.py): told on every
        # answer, widened with the interval just given.
        "lease_seconds": rt.leases.ttl,
    }
    if suite is not None:
        reply["validation"] = suite
    return reply


def agent_drain_step(node, draining):
    """The status a heartbeat's `draining` moves the node to, or None: a ready node whose agent says it
    is draining is cordoned (reason "agent draining"); that cordon, and only that one (an admin's stays),
    ends when the agent says it no longer is. Without the field nothing changes."""
    if draining is True and node.status == NodeStatus.READY.value:
        return NodeStatus.CORDONED
    if draining is False and node.status == NodeStatus.CORDONED.value and node.status_reason == AGENT_DRAINING:
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
            switch_node_status(node, NodeStatus.LOST, "agent deregistered (graceful leave)", now)
    rt.liveness.forget(node_id)
