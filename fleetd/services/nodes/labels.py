"""A node's labels from two sources: the agent's config file (`[labels]`, FLEET_AGENT_LABELS),
reported at registration and in heartbeats (`node.agent_labels`), and labels an admin set through
the API (`node.label_overrides`). Those set through the API win per key; the agent's fill the
rest. `node.labels`, which placement reads, is always the merge of the two."""

from fleetd.db import write_transaction
from fleetd.errors import InvalidRequest, NotFound
from fleetd.models import Node
from fleetd.services.nodes.nodes import get_node
from fleetd.services.notify.events import record_event
from fleetd.services.placement.parking import node_changed

MAX_LABELS = 64


def merged_labels(agent_labels, overrides):
    """The labels a node has: the agent's, with those set through the API on top."""
    return {**(agent_labels or {}), **(overrides or {})}


def apply_agent_labels(node, agent_labels):
    """Take the labels the agent reported (inside the caller's transaction); True when they changed
    what the node has."""
    if agent_labels == node.agent_labels:
        return False
    before = node.labels
    node.agent_labels = dict(agent_labels)
    node.labels = merged_labels(node.agent_labels, node.label_overrides)
    node.save()
    return node.labels != before


def set_node_labels(rt, node_id, changes):
    """Set labels through the API ({key: value}) or drop them ({key: None}: the agent's value, if
    any, shows again). Returns the node."""
    now = rt.clock.now()
    with write_transaction():
        node = Node.get_or_none(Node.id == node_id)
        if node is None:
            raise NotFound(f"node {node_id} not found")
        overrides = dict(node.label_overrides or {})
        for key, value in changes.items():
            if value is None:
                overrides.pop(key, None)
            else:
                overrides[key] = value
        labels = merged_labels(node.agent_labels, overrides)
        if len(labels) > MAX_LABELS:
            raise InvalidRequest(
                f"a node has at most {MAX_LABELS} labels ({len(labels)} with these)",
                {"labels": [f"at most {MAX_LABELS} labels"]},
            )
        node.label_overrides = overrides or None
        node.labels = labels
        node.save()
        said = ", ".join(
            f"{k}={v}" if v is not None else f"-{k}" for k, v in sorted(changes.items())
        )
        record_event(now, "node.labels", "node", node_id, f"labels set through the API: {said}")
    rt.scheduler.kick(
        what=node_changed(node)
    )  # a job whose selector names these labels may fit now
    return get_node(node_id)
