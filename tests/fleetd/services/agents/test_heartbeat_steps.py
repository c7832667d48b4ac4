"""The steps of a heartbeat, each called on its own (fleetd.services.agents.sessions.STEPS)."""

from fleetd.db import database, write_transaction
from fleetd.models import Node
from fleetd.services.agents import sessions
from fleetwire.heartbeat import Heartbeat


def _step(api, node_id, **beat):
    rt = api.app.extensions["fleetd"]
    step = sessions.Beat(rt, Node.get_by_id(node_id), Heartbeat(**beat), rt.clock.now())
    sessions.learn(step)
    return step


def test_the_agent_drain_step_cordons_a_ready_node_and_only_ends_its_own_cordon(api):
    api.create_fleet()
    node_id, _ = api.ready_node(api.create_join_token(), "host-a", gpu_count=1)
    with database.connection_context():
        quiet = _step(api, node_id)
        assert not sessions.needs_write(quiet)  # a ready node's bare heartbeat writes nothing
        draining = _step(api, node_id, draining=True)
        assert sessions.needs_write(draining)
        with write_transaction():
            assert sessions.step_agent_drain(draining) is True
        assert Node.get_by_id(node_id).status == "cordoned"
        assert Node.get_by_id(node_id).status_reason == sessions.AGENT_DRAINING
        with write_transaction():
            assert sessions.step_agent_drain(_step(api, node_id, draining=True)) is False  # already
    api.post(f"/api/v1/nodes/{node_id}/uncordon", {})
    api.post(f"/api/v1/nodes/{node_id}/cordon", {"reason": "maintenance"})
    with database.connection_context(), write_transaction():
        assert (
            sessions.step_agent_drain(_step(api, node_id, draining=False)) is False
        )  # an admin's cordon stays
        assert Node.get_by_id(node_id).status == "cordoned"
        assert Node.get_by_id(node_id).status_reason == "cordon: maintenance"


def test_the_version_and_capabilities_steps_store_only_what_changed(api):
    api.create_fleet()
    node_id, _ = api.ready_node(api.create_join_token(), "host-a", gpu_count=1)
    with database.connection_context():
        step = _step(
            api,
            node_id,
            agent_version="9.9.9",
            capabilities={"containers": "unavailable: no podman"},
        )
        assert step.new_agent() and sessions.needs_write(step)
        with write_transaction():
            assert sessions.step_agent_version(step) is False  # no capacity change
            assert sessions.step_capabilities(step) is True
        node = Node.get_by_id(node_id)
        assert (
            node.agent_version == "9.9.9"
            and node.capabilities["containers"] == "unavailable: no podman"
        )
        again = _step(
            api,
            node_id,
            agent_version="9.9.9",
            capabilities={"containers": "unavailable: no podman"},
        )
        assert not again.new_agent() and not sessions.needs_write(again)
