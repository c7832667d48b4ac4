"""How to reach an instance: its ports' states on the node, connection URLs, and waiting for
them."""

import math
import time

from fleetd.db import released
from fleetd.errors import Conflict, InvalidRequest, NotFound, Timeout
from fleetd.models import (
    InstanceState,
    Node,
    Task,
)
from fleetd.services.workloads.instance_views import PORT_TAKEN, connection_url, port_state
from fleetd.services.workloads.instances import (
    CONNECTION_WAIT_MAX_SECONDS,
    find_instance,
    log,
    resolve_instance,
)
from fleetd.services.workloads.runs import (
    resumes_by_itself,
)


def connection(rt, principal, instance_id, port=None, wait_seconds=0):
    """{url, host, port, protocol} of one declared port; waits until the instance runs. Conflict
    while its node reports another process listening on the port's host port: the URL could
    reach that process instead of the instance."""
    inst = released(lambda: find_instance(principal, instance_id))
    protocols = {p.port: p.protocol for p in inst.instance_spec.ports}
    declared = list(protocols)
    if not declared:
        raise NotFound(f"instance {instance_id} declares no ports", {"port": port})
    if port is None:
        if len(declared) > 1:
            raise InvalidRequest(
                f"instance {instance_id} declares several ports; name one of {declared}",
                {"fields": {"port": [f"one of {declared}"]}},
            )
        port = declared[0]
    if port not in declared:
        raise NotFound(
            f"port {port} is not declared by instance {instance_id}; declared: {declared}",
            {"port": port, "declared": declared},
        )

    def answer():
        current = released(lambda: find_instance(principal, instance_id))
        state = InstanceState(current.state)
        if state in (
            InstanceState.STOPPED,
            InstanceState.STOPPING,
            InstanceState.FAILED,
            InstanceState.DELETING,
        ) or (
            state is InstanceState.INTERRUPTED
            and current.interrupted_by != "node_lost"
            and not released(lambda: resumes_by_itself(current))
        ):
            raise Conflict(
                f"instance {instance_id} is {state.value}; resume it first", {"state": state.value}
            )
        mapped = {p["port"]: p for p in current.ports or []}
        if state is not InstanceState.RUNNING or port not in mapped:
            return None
        node = released(lambda: Node.get_or_none_by_id(current.node_id))
        host = node.address if node is not None else ""
        protocol = protocols[port]
        public = mapped[port]["host_port"]
        _refuse_taken_port(rt, current, port, public)
        return {
            "url": connection_url(host, public, protocol),
            "host": host,
            "port": public,
            "protocol": protocol,
        }

    found = answer()
    if found is None and wait_seconds > 0:
        wait = min(wait_seconds, rt.settings.long_poll_max_seconds)
        found = rt.notifier.wait(("instance", instance_id), wait, answer)
    if found is None:
        state = find_instance(principal, instance_id).state
        raise Timeout(
            f"instance {instance_id} is not running yet ({state}); its connection is known once it "
            f"runs",
            {"state": state},
        )
    return found


def connection_within(rt, principal, instance_id, port=None, wait_seconds=0):
    """connection(), waiting up to `wait_seconds` (at most CONNECTION_WAIT_MAX_SECONDS) in slices:
    each slice is the REST long poll's wait (at most long_poll_max_seconds), so the instance is read
    afresh at least once a slice, whatever wake-up went missing. Timeout when it does not run in
    time."""
    wait_seconds = min(max(0.0, wait_seconds), CONNECTION_WAIT_MAX_SECONDS)
    slice_seconds = rt.settings.long_poll_max_seconds
    deadline = time.monotonic() + wait_seconds
    slices = math.ceil(wait_seconds / slice_seconds) if slice_seconds > 0 else 1
    for number in range(1, slices):  # bounded; every slice but the last
        if deadline - time.monotonic() <= slice_seconds or rt.notifier.closed:
            break
        try:
            return connection(rt, principal, instance_id, port, slice_seconds)
        except Timeout:
            log.debug(
                "instance %s has no connection after wait slice %d; waiting on", instance_id, number
            )
    return connection(
        rt, principal, instance_id, port, max(0.0, min(slice_seconds, deadline - time.monotonic()))
    )


def host_port(rt, principal, handle, port=None, wait_seconds=0):
    """The host port its node gave one declared port of the instance `handle` names (an id, or a
    name among the caller's instances): seed 000's assign-host-port, whose ports fleetd's nodes hand
    out from their own range when the instance starts. Waits, refuses and times out as
    connection()."""
    named = released(lambda: resolve_instance(principal, handle, limit=2))
    if not named:
        raise NotFound(f"instance {handle} not found", {"pod_name": handle})
    if len(named) > 1:
        raise Conflict(
            f"{handle!r} names instances of several owners; give the instance's id",
            {"instances": [i.id for i in named]},
        )
    return connection(rt, principal, named[0].id, port, wait_seconds)["port"]


def _refuse_taken_port(rt, inst, port, host_port):
    """Conflict when the node of the instance's current run reports another process on the host
    port."""
    task = released(lambda: Task.get_or_none(Task.job == inst.run_id)) if inst.run_id else None
    if task is None or port_state(rt.samples.get(task.id), port, host_port) != PORT_TAKEN:
        return
    raise Conflict(
        f"port {port} of instance {inst.id}: another process listens on its host port {host_port} "
        f"on node {inst.node_id}, so its URL could reach that process instead of the instance; the "
        "instance's own process must hold the port (restart it, or stop what took the port)",
        {"port": port, "host_port": host_port, "reason": PORT_TAKEN, "state": inst.state},
    )
