"""Rollouts: a fleet's agents upgraded to one bundle, canaries first, then batch by batch.

fleetd holds the plan and the state; the CLI that runs `fleetd rollout start` drives it over SSH
(docs/architecture.md, Rollouts) and reports each node here. The policy lives here, so that every
driver obeys the same one: a failed canary, a node that failed its validation after the upgrade, or
more failures than `max_failures` pause the rollout by themselves (or end it `failed` when no node
is left to try: nothing would ever resume it); a paused or ended rollout, or one outside its
window, lets no further node begin (its driver sees 409 and waits, or stops). Pause, resume, abort
and retry (the failed nodes again) are requests an admin or an operator makes from anywhere.
"""

import math

import peewee

from fleetd import windows
from fleetd.db import write_transaction
from fleetd.errors import Conflict, InvalidRequest, NotFound
from fleetd.models import Fleet, Node, Rollout, RolloutNode, new_id
from fleetd.services.nodes.upgrades import can_upgrade  # another node is skipped
from fleetd.services.notify.events import current_actor, record_event
from fleetd.services.pagination import paginate

RUNNING, PAUSED, DONE, ABORTED = "running", "paused", "done", "aborted"
ENDED_FAILED = "failed"  # a rollout fleetd would pause with no node left to try: it ends so
ACTIVE = (RUNNING, PAUSED)
PENDING, UPGRADING, NODE_DONE, FAILED, SKIPPED = "pending", "upgrading", "done", "failed", "skipped"
NODE_STATES = (PENDING, UPGRADING, NODE_DONE, FAILED, SKIPPED)
#: What a driver may report of a node, from the state it is in.
NODE_MOVES = {PENDING: (UPGRADING, SKIPPED), UPGRADING: (NODE_DONE, FAILED)}


def batch_size(batch, count):
    """Nodes per batch: N, or a percentage ("10%") of `count`, at least one."""
    if isinstance(batch, str) and batch.endswith("%"):
        return max(1, math.ceil(count * int(batch[:-1]) / 100))
    return max(1, int(batch))


def plan(nodes, batch, canary):
    """[(node, batch index, canary)] in the order a driver takes them: `canary` nodes first (ready
    ones before those an operator took out of service: a canary should prove the bundle on a node in
    service), then the rest in batches. Pure: `nodes` are sorted by hostname by the caller."""
    canaries = sorted(nodes, key=lambda n: n.status != "ready")[:canary]
    rest = [n for n in nodes if n not in canaries]
    size = batch_size(batch, len(rest))
    out = [(n, 0, True) for n in canaries]
    out += [(n, 1 + i // size, False) for i, n in enumerate(rest)]
    return out


def _get(rollout_id):
    rollout = Rollout.get_or_none(Rollout.id == rollout_id)
    if rollout is None:
        raise NotFound(f"rollout {rollout_id} not found")
    return rollout


def get_rollout(rollout_id):
    """A rollout with its nodes (in the driver's order); NotFound if there is none."""
    rollout = _get(rollout_id)
    rollout.node_list = list(
        RolloutNode.select().where(RolloutNode.rollout == rollout_id).order_by(RolloutNode.position)
    )
    return rollout


def list_rollouts(limit, cursor=None, fleet=None):
    """One page of rollouts by id (oldest first), each with its nodes."""
    query = Rollout.select()
    if fleet:
        query = query.where(Rollout.fleet == fleet)
    rows, next_cursor = paginate(query, Rollout.id, limit, cursor)
    by_id = {r.id: r for r in rows}
    for r in rows:
        r.node_list = []
    if by_id:
        for rn in (
            RolloutNode.select()
            .where(RolloutNode.rollout.in_(list(by_id)))
            .order_by(RolloutNode.position)
        ):
            by_id[rn.rollout_id].node_list.append(rn)
    return rows, next_cursor


def _record(now, rollout, reason, to_state=None, from_state=None):
    record_event(
        now,
        "rollout.state",
        "rollout",
        rollout.id,
        reason,
        from_state,
        to_state,
        data={"fleet": rollout.fleet, "bundle_version": rollout.bundle_version},
    )


def _switch(rollout, state, reason, now):
    before = rollout.state
    rollout.state, rollout.state_reason, rollout.updated_at = state, reason, now
    rollout.save()
    _record(now, rollout, reason, state, before)


def create_rollout(
    rt,
    fleet,
    bundle_version,
    bundle_sha256,
    batch=1,
    canary=1,
    max_failures=0,
    window=None,
    drain_deadline_seconds=3600,
):
    """Plan a rollout of the fleet's nodes to a bundle: its nodes not on that bundle yet, canaries
    first. Nodes that are pending, lost or revoked are listed as skipped, but for a lost one whose
    agent went silent in an upgrade that failed (a rollout after a failed one takes it again).
    Conflict while another rollout of the fleet is running or paused. Returns the rollout."""
    now = rt.clock.now()
    actor = current_actor()
    with write_transaction():
        if not Fleet.select().where(Fleet.name == fleet).exists():
            raise NotFound(f"fleet {fleet!r} not found")
        other = (
            Rollout.select(Rollout.id, Rollout.state)
            .where((Rollout.fleet == fleet) & Rollout.state.in_(ACTIVE))
            .first()
        )
        if other is not None:
            raise Conflict(
                f"rollout {other.id} of fleet {fleet} is {other.state}: abort it or let it finish "
                f"first",
                {"rollout": other.id},
            )
        nodes = list(
            Node.select()
            .where(
                (Node.fleet == fleet)
                & ((Node.bundle_sha256 != bundle_sha256) | Node.bundle_sha256.is_null())
            )
            .order_by(Node.hostname, Node.id)
        )
        if not nodes:
            raise Conflict(
                f"every node of fleet {fleet} runs bundle {bundle_sha256[:12]} already (or it has "
                f"none)",
                {"fleet": fleet},
            )
        upgradable = [n for n in nodes if can_upgrade(n)]
        rollout = Rollout.create(
            id=new_id(),
            fleet=fleet,
            bundle_version=bundle_version,
            bundle_sha256=bundle_sha256,
            state=RUNNING,
            state_reason=f"started by {actor}",
            created_at=now,
            updated_at=now,
            created_by=actor,
            options={
                "batch": batch,
                "canary": canary,
                "max_failures": max_failures,
                "window": window,
                "drain_deadline_seconds": drain_deadline_seconds,
            },
        )
        rows = [
            dict(
                rollout=rollout.id,
                node_id=n.id,
                hostname=n.hostname,
                address=n.address,
                position=i,
                batch=b,
                canary=c,
                state=PENDING,
                updated_at=now,
            )
            for i, (n, b, c) in enumerate(plan(upgradable, batch, canary))
        ]
        last = max((r["batch"] for r in rows), default=0)
        rows += [
            dict(
                rollout=rollout.id,
                node_id=n.id,
                hostname=n.hostname,
                address=n.address,
                position=len(rows) + i,
                batch=last + 1,
                canary=False,
                state=SKIPPED,
                detail=f"not upgraded: the node is {n.status}",
                updated_at=now,
            )
            for i, n in enumerate(n for n in nodes if not can_upgrade(n))
        ]
        RolloutNode.insert_many(rows).execute()
        _record(
            now,
            rollout,
            f"rollout of fleet {fleet} to fleet-agent {bundle_version} (bundle sha256 "
            f"{bundle_sha256[:12]}): {len(upgradable)} node(s), {min(canary, len(upgradable))} "
            "canary",
            RUNNING,
        )
        _settle(rollout, now)
    return get_rollout(rollout.id)


def _settle(rollout, now):
    """Done once no node is left to upgrade (inside the caller's transaction)."""
    if rollout.state != RUNNING:
        return
    left = (
        RolloutNode.select()
        .where((RolloutNode.rollout == rollout.id) & RolloutNode.state.in_([PENDING, UPGRADING]))
        .exists()
    )
    if not left:
        counts = dict(
            RolloutNode.select(RolloutNode.state, peewee.fn.COUNT(RolloutNode.id))
            .where(RolloutNode.rollout == rollout.id)
            .group_by(RolloutNode.state)
            .tuples()
            .execute()
        )
        _switch(
            rollout, DONE, ", ".join(f"{counts[s]} {s}" for s in NODE_STATES if counts.get(s)), now
        )


def _stop(rollout, why, now):
    """fleetd stops a running rollout after a failure (inside the caller's transaction): paused
    while nodes are left to try (`resume` goes on, `retry` tries the failed ones again), ended
    `failed` when none is (a driver, CI's, waits on an end)."""
    left = (
        RolloutNode.select()
        .where((RolloutNode.rollout == rollout.id) & RolloutNode.state.in_([PENDING, UPGRADING]))
        .exists()
    )
    if left:
        _switch(rollout, PAUSED, f"paused by fleetd: {why}", now)
    else:
        _switch(rollout, ENDED_FAILED, f"failed: {why}; no node left to try", now)


def _failed_validation(node_id):
    """The node's validation failed after its upgrade: it is failed_validation now, which no node
    is when its upgrade begins (services.nodes.upgrades.UPGRADABLE), so this upgrade put it there.
    fleetd reads it from the node itself, whatever the driver says."""
    node = Node.get_or_none(Node.id == node_id)
    if node is None or node.status != "failed_validation":
        return None
    return node.status_reason or "no reason given"


def report_node(rt, rollout_id, node_id, state, detail=""):
    """The driver reports a node: upgrading (refused, 409, unless the rollout is running and inside
    its window: that is how a pause, an abort or the window's end reaches the driver between nodes),
    then done or failed; or skipped. A failed canary, a node that failed its validation, or more
    failures than max_failures pauses the rollout. Returns the rollout."""
    now = rt.clock.now()
    with write_transaction():
        rollout = _get(rollout_id)
        row = RolloutNode.get_or_none(
            (RolloutNode.rollout == rollout_id) & (RolloutNode.node_id == node_id)
        )
        if row is None:
            raise NotFound(f"node {node_id} is not part of rollout {rollout_id}")
        if state not in NODE_MOVES.get(row.state, ()):
            raise Conflict(
                f"node {node_id} is {row.state} in rollout {rollout_id}: it cannot become {state}",
                {"state": row.state},
            )
        if state in (UPGRADING, SKIPPED) and rollout.state != RUNNING:
            raise Conflict(
                f"rollout {rollout_id} is {rollout.state} ({rollout.state_reason}): no node begins",
                {"state": rollout.state},
            )
        window = rollout.options.get("window")
        if state == UPGRADING and window and not windows.is_open(window, now):
            opens = windows.next_open_at(window, now)
            raise Conflict(
                f"rollout {rollout_id} is outside its window: no node begins until "
                + (f"{opens.isoformat()}Z" if opens else "its window opens"),
                {"state": rollout.state, "opens_at": f"{opens.isoformat()}Z" if opens else None},
            )
        if (
            state == UPGRADING
            and row.canary is False
            and RolloutNode.select()
            .where(
                (RolloutNode.rollout == rollout_id)
                & (RolloutNode.canary == True)  # noqa: E712 - SQL
                & RolloutNode.state.in_([PENDING, UPGRADING])
            )
            .exists()
        ):
            raise Conflict(
                f"rollout {rollout_id}: its canaries are not through yet; node {node_id} waits",
                {"state": rollout.state},
            )
        before = row.state
        row.state, row.detail, row.updated_at = state, detail, now
        row.save()
        what = "canary " if row.canary else ""
        record_event(
            now,
            "rollout.node",
            "node",
            node_id,
            f"rollout {rollout_id} ({rollout.bundle_version}): {what}{state}"
            + (f": {detail}" if detail else ""),
            before,
            state,
            data={"rollout": rollout_id, "canary": row.canary, "detail": detail},
        )
        if state == FAILED and rollout.state == RUNNING:
            failures = (
                RolloutNode.select()
                .where((RolloutNode.rollout == rollout_id) & (RolloutNode.state == FAILED))
                .count()
            )
            allowed = int(rollout.options.get("max_failures") or 0)
            invalid = _failed_validation(node_id)
            if row.canary:
                _stop(rollout, f"canary node {node_id} failed ({detail[:500]})", now)
            elif invalid is not None:
                _stop(
                    rollout,
                    f"node {node_id} failed its validation after the upgrade ({invalid[:500]})",
                    now,
                )
            elif failures > allowed:
                _stop(
                    rollout,
                    f"{failures} node(s) failed, more than --max-failures {allowed} (last: "
                    f"node {node_id}: {detail[:300]})",
                    now,
                )
        _settle(rollout, now)
    return get_rollout(rollout_id)


def request(rt, rollout_id, action):
    """pause, resume or abort: what the driver obeys between nodes. Conflict for a finished rollout
    or a move that does not apply. Returns the rollout."""
    now = rt.clock.now()
    actor = current_actor()
    moves = {
        "pause": ((RUNNING,), PAUSED),
        "resume": ((PAUSED,), RUNNING),
        "abort": (ACTIVE, ABORTED),
        # A paused rollout's driver is still waiting: it takes the failed nodes again. An ended
        # rollout has no driver left; `fleetd rollout start` again covers the nodes it missed.
        "retry": ((PAUSED,), RUNNING),
    }
    if action not in moves:
        raise InvalidRequest(f"unknown action {action!r}")
    sources, target = moves[action]
    with write_transaction():
        rollout = _get(rollout_id)
        if rollout.state not in sources:
            raise Conflict(
                f"rollout {rollout_id} is {rollout.state}: it cannot be {target}",
                {"state": rollout.state},
            )
        if action == "retry":
            _retry(rollout, actor, now)
        else:
            _switch(rollout, target, f"{target} by {actor}", now)
        if target == ABORTED:
            # Nodes that never began stay as they are; the record says why they were not upgraded.
            RolloutNode.update(
                state=SKIPPED,
                detail=f"not upgraded: the rollout was aborted by {actor}",
                updated_at=now,
            ).where((RolloutNode.rollout == rollout_id) & (RolloutNode.state == PENDING)).execute()
        _settle(rollout, now)
    return get_rollout(rollout_id)


def _retry(rollout, actor, now):
    """The paused rollout's failed nodes are pending again and it runs (inside the caller's
    transaction); Conflict when none failed."""
    failed = RolloutNode.select(RolloutNode.id).where(
        (RolloutNode.rollout == rollout.id) & (RolloutNode.state == FAILED)
    )
    count = failed.count()
    if not count:
        raise Conflict(
            f"rollout {rollout.id} has no failed node to retry", {"state": rollout.state}
        )
    RolloutNode.update(state=PENDING, detail=f"retried by {actor}", updated_at=now).where(
        RolloutNode.id.in_(failed)
    ).execute()
    _switch(rollout, RUNNING, f"retry of {count} failed node(s) by {actor}", now)
