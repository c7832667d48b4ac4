"""Capacity truth: total = used + free + blocked for the cluster and every series, with codes."""

from hypothesis import given, settings

from fleetd.scheduler import gpu_capacity
from tests.fleetd.scheduler.factories import make_cluster, make_node
from tests.fleetd.scheduler.test_properties import clusters
from tests.support.examples import examples


def test_counts_used_free_and_blocked_with_reason_codes():
    cluster = make_cluster(
        make_node(
            "a",
            gpus=4,
            gpu_overrides={
                0: {"exclusive": True},
                1: {"compute_free_milli": 700},
                2: {"healthy": False},
            },
        ),
        make_node("b", gpus=2, model="A100", schedulable=False, status="drained"),
        make_node("c", gpus=2, model="A100", fleet="night"),
    )
    total, series = gpu_capacity(cluster, closed_fleets={"night"})
    assert (total.total, total.used, total.free, total.blocked) == (8, 2, 1, 5)
    assert total.blocked_by == {"unhealthy": 1, "drained": 2, "outside_window": 2}
    assert (series["H100"].used, series["H100"].free, series["H100"].blocked) == (2, 1, 1)
    assert series["A100"].blocked_by == {"drained": 2, "outside_window": 2}


@settings(max_examples=examples(100), deadline=None)
@given(snapshot=clusters())
def test_total_is_used_plus_free_plus_blocked_everywhere(snapshot):
    total, series = gpu_capacity(snapshot, closed_fleets={"b"})
    for counts in [total, *series.values()]:
        assert counts.total == counts.used + counts.free + counts.blocked
        assert counts.blocked == sum(counts.blocked_by.values())
    assert (
        total.total
        == sum(s.total for s in series.values())
        == sum(len(n.gpus) for n in snapshot.nodes)
    )
