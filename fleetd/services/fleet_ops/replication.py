"""What the replicas of one PostgreSQL database share (fleetd.replicas has the mechanisms): each
writes down what it heard for the leader to read, and passes wake-ups, stops and kicks to the
others over the bus."""

import logging
import threading

from fleetd.db import hand_back
from fleetd.replicas import Bus, Leadership
from fleetd.services.agents.leases import record_lease_renewals
from fleetd.services.nodes.nodes import record_heartbeat_times
from fleetd.services.placement.parking import Capacity

log = logging.getLogger(__name__)


def replicate(rt, db, settings, spawn, wait_readable):
    """`fleetd serve` on PostgreSQL: elect a leader with the other replicas, write down what this
    one hears, and pass wake-ups between them. `spawn` starts a greenlet; returns a stop
    function."""
    import psycopg2  # the PostgreSQL driver: only replicas need it

    leader = rt.leader = Leadership(settings.leader_lease_seconds, shared=True)
    bus = Bus(
        lambda: psycopg2.connect(database=db.database, **db.connect_params),
        leader.replica_id,
        {
            "wake": lambda key: rt.notifier.notify(tuple(key), local=True),
            "stop": lambda node_id, task_id, epoch: rt.stops.owe(
                node_id, task_id, epoch, local=True
            ),
            "kick": lambda capacity, what: (
                rt.scheduler.kick(capacity, Capacity.from_wire(what)) if leader.leading() else None
            ),
        },
    )
    rt.notifier.publish = lambda key: bus.publish("wake", list(key))
    rt.stops.publish = lambda node_id, task_id, epoch: bus.publish("stop", node_id, task_id, epoch)
    rt.scheduler.publish = lambda capacity, what: bus.publish("kick", capacity, what)

    def changed(leading, epoch):
        if rt.instruments is not None:
            rt.instruments.leadership_changes.inc()
        if leading:  # nodes that heartbeated to the old leader get the failover grace to reach us
            rt.liveness.restart_grace()
            rt.leases.restart_grace()
            rt.parked.bump()
            rt.scheduler.kick()

    leader.on_change(changed)
    stopped = threading.Event()

    def loop():
        for _ in range(10**9):  # bounded: one round per lease quarter until stopped
            sync(rt)
            if stopped.wait(leader.lease_seconds / 4):
                return

    leader.tick()  # lead (or follow) before serving
    greenlets = [spawn(loop), spawn(bus.run, wait_readable)]

    def stop():
        stopped.set()
        bus.stop()
        for greenlet in greenlets:
            greenlet.join(5)
        leader.resign()
        rt.notifier.publish = rt.stops.publish = rt.scheduler.publish = None

    return stop


# Heartbeat times written down in one transaction (a few milliseconds of the event loop's time).
HEARD_CHUNK = 2000


def sync(rt):
    """Write down what this replica heard (last heartbeats, lease renewals) for the leader to read,
    then renew or take the leader lease. One round; `fleetd serve` runs it every few seconds.

    A write that fails (the database away, every pooled connection busy in a storm) is kept for
    the next round, and the lease is still renewed or taken: this round's failure must neither
    lose what the nodes said nor stop this replica from leading (or taking over)."""
    try:
        write_down_heard(rt)
    finally:
        hand_back()
    rt.leader.tick()


def write_down_heard(rt):
    """Write down the heartbeat times (and, with replicas, the lease renewals) this replica heard
    since the last time; when the write fails they are kept for the next one, never dropped (the
    leader reads them to tell live nodes from lost ones). Returns how many heartbeat times were
    written (0 when the first write failed). At 100,000 nodes that is tens of thousands of rows:
    they are written HEARD_CHUNK to a transaction, with the event loop given away between
    (rt.pause), so heartbeats are answered meanwhile."""
    heard = list(rt.liveness.take_unflushed().items())
    renewals = rt.leases.take_unflushed() if rt.leader.shared else {}
    saved = 0
    try:
        for start in range(0, len(heard), HEARD_CHUNK):
            if start and rt.pause is not None:
                rt.pause()
            record_heartbeat_times(dict(heard[start : start + HEARD_CHUNK]))
            saved = min(len(heard), start + HEARD_CHUNK)
        record_lease_renewals(renewals)
    except Exception:  # noqa: BLE001 - any database error: the next round writes them
        log.exception(
            "replication: what this replica heard was not written down; the next round tries again"
        )
        rt.liveness.unflushed_again(dict(heard[saved:]))
        rt.leases.unflushed_again(renewals)
        return saved
    return saved
