"""The state machines' tables agree with each other and with the enums they speak of."""

import pytest

from fleetd.models import (
    NODE_ACTIONS,
    InstanceState,
    JobState,
    NodeStatus,
    TaskState,
    transition_table,
)
from fleetd.services.workloads import lifecycle


@pytest.mark.parametrize("action", sorted(NODE_ACTIONS))
def test_every_operator_action_on_a_node_is_a_transition_of_its_state_machine(action):
    sources, target = NODE_ACTIONS[action]
    for source in sources.split():
        assert NodeStatus(source).allows(action)
        assert NodeStatus(target) in lifecycle.NODE_TRANSITIONS[NodeStatus(source)], (
            action,
            source,
        )
    others = set(NodeStatus) - {NodeStatus(s) for s in sources.split()}
    assert not any(status.allows(action) for status in others)


@pytest.mark.parametrize(
    "states, table",
    [
        (NodeStatus, lifecycle.NODE_TRANSITIONS),
        (JobState, lifecycle.JOB_TRANSITIONS),
        (TaskState, lifecycle.TASK_TRANSITIONS),
        (InstanceState, lifecycle.INSTANCE_TRANSITIONS),
    ],
)
def test_each_transition_table_names_every_state(states, table):
    assert set(table) == set(states)
    assert all(targets <= set(states) for targets in table.values())


def test_a_table_that_forgets_a_state_or_names_an_unknown_one_is_refused():
    with pytest.raises(ValueError, match="lacks"):
        transition_table(JobState, {"queued": "running"})
    with pytest.raises(ValueError):
        transition_table(JobState, {s.value: "" for s in JobState} | {"queued": "paused"})


def test_a_lost_node_returns_only_to_a_live_status():
    assert lifecycle.LIVE_STATUSES == {
        NodeStatus.PENDING,
        NodeStatus.READY,
        NodeStatus.CORDONED,
        NodeStatus.DRAINING,
        NodeStatus.DRAINED,
        NodeStatus.VALIDATING,
        NodeStatus.FAILED_VALIDATION,
    }
