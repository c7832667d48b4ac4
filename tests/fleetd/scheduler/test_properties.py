"""Property tests: random clusters and random job streams, every policy, checked independently.

Whatever the policy, a placement never over-allocates a GPU (memory, compute share, whole-GPU
exclusivity), a node (CPU, memory), never touches a non-schedulable node or an unhealthy
or held GPU, honours selectors and GPU types, and a gang is placed whole or not at all.
The engine is also complete: it refuses a request only when the filters reject enough
nodes, as its own explanation says.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetd.scheduler import (
    POLICIES,
    ClusterSnapshot,
    GpuSnapshot,
    NodeSelector,
    NodeSnapshot,
    Placement,
    PlacementEngine,
    TaskRequest,
    Unschedulable,
    profile_from_requests,
)
from tests.support.examples import examples

GIB = 1024**3
MODELS = ("A100", "H100")


@st.composite
def gpus_for(draw, node_id, count):
    model = draw(st.sampled_from(MODELS))
    out = []
    for i in range(count):
        total = draw(st.sampled_from([8, 16, 40])) * GIB
        state = draw(st.sampled_from(["idle", "idle", "shared", "full", "held", "unhealthy"]))
        compute, memory = 1000, total
        if state == "shared":
            compute = draw(st.sampled_from([100, 250, 500, 750, 1000]))
            memory = total // draw(st.sampled_from([1, 2, 4]))
            if compute == 1000 and memory == total:
                memory = total - GIB
        elif state == "full":
            compute, memory = 0, 0
        out.append(
            GpuSnapshot(
                uuid=f"GPU-{node_id}-{i}",
                model=model,
                memory_total_bytes=total,
                memory_free_bytes=memory,
                compute_free_milli=compute,
                numa_node=draw(st.integers(0, 1)),
                healthy=state != "unhealthy",
                exclusive=state == "held",
            )
        )
    return tuple(out)


@st.composite
def clusters(draw):
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        node_id = f"n{i}"
        schedulable = draw(st.booleans() | st.just(True))
        nodes.append(
            NodeSnapshot(
                id=node_id,
                gpus=draw(gpus_for(node_id, draw(st.integers(0, 4)))),
                fleet=draw(st.sampled_from(["a", "b"])),
                labels={"zone": draw(st.sampled_from(["x", "y"]))},
                schedulable=schedulable,
                status="ready"
                if schedulable
                else draw(st.sampled_from(["cordoned", "draining", "lost", "drained"])),
                cpu_free_milli=draw(st.integers(0, 16)) * 1000,
                memory_free_bytes=draw(st.integers(0, 64)) * GIB,
            )
        )
    return ClusterSnapshot(tuple(nodes))


@st.composite
def requests(draw):
    gpus = draw(st.sampled_from([0, 1, 1, 2, 3, 0.25, 0.5, 0.75]))
    memory = None
    if gpus == 1 or 0 < gpus < 1:
        memory = draw(st.none() | st.sampled_from([2, 6, 20]).map(lambda g: g * GIB))
    selector = draw(
        st.none()
        | st.builds(
            NodeSelector,
            fleet=st.none() | st.sampled_from(["a", "b"]),
            labels=st.sampled_from([{}, {"zone": "x"}]),
        )
    )
    return TaskRequest(
        gpus=gpus,
        num_nodes=draw(st.integers(1, 3)),
        gpu_memory_bytes=memory,
        gpu_types=draw(st.sampled_from([(), ("A100",), ("H100",), MODELS])),
        cpus=draw(st.sampled_from([0, 0.5, 1, 4])),
        memory_bytes=draw(st.sampled_from([0, 1, 8])) * GIB,
        node_selector=selector or NodeSelector(),
    )


def engine_state(engine):
    """White-box: the engine's own accounting, to see that a refusal changed nothing."""
    return tuple(
        (n.cpu_free, n.memory_free, tuple((g.milli_free, g.memory_free, g.holders) for g in n.gpus))
        for n in engine.nodes
    )


def check_placements(snapshot, placed):
    """Replay the placements against the snapshot with independent accounting."""
    nodes = {n.id: n for n in snapshot.nodes}
    cpu, mem = {}, {}
    exclusive, compute, gmem = {}, {}, {}
    for request, placement in placed:
        assert len(placement.ranks) == request.num_nodes
        assert len(set(placement.node_ids)) == request.num_nodes, "ranks share a node"
        for rank in placement.ranks:
            node = nodes[rank.node_id]
            assert node.schedulable, f"{node.id} is {node.status}"
            assert request.node_selector.matches(node)
            cpu[node.id] = cpu.get(node.id, 0) + request.cpu_milli
            mem[node.id] = mem.get(node.id, 0) + request.memory_bytes
            assert len(rank.gpus) == request.gpu_count
            gpus = {g.uuid: g for g in node.gpus}
            for alloc in rank.gpus:
                gpu = gpus[alloc.uuid]
                assert gpu.healthy and not gpu.exclusive
                if request.gpu_types:
                    assert gpu.model in request.gpu_types
                if alloc.exclusive:
                    assert gpu.idle, f"{gpu.uuid} given whole while in use"
                    exclusive[gpu.uuid] = exclusive.get(gpu.uuid, 0) + 1
                else:
                    assert alloc.compute_milli == request.gpu_milli
                    assert alloc.memory_limit_bytes == request.gpu_memory_for(
                        gpu.memory_total_bytes
                    )
                compute[gpu.uuid] = compute.get(gpu.uuid, 0) + alloc.compute_milli
                gmem[gpu.uuid] = gmem.get(gpu.uuid, 0) + alloc.memory_limit_bytes
    for node in snapshot.nodes:
        assert cpu.get(node.id, 0) <= node.cpu_free_milli
        assert mem.get(node.id, 0) <= node.memory_free_bytes
        for gpu in node.gpus:
            if exclusive.get(gpu.uuid):
                assert exclusive[gpu.uuid] == 1 and compute[gpu.uuid] == 1000, "whole GPU shared"
            assert compute.get(gpu.uuid, 0) <= gpu.compute_free_milli
            assert gmem.get(gpu.uuid, 0) <= gpu.free_memory


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshot=clusters(),
    stream=st.lists(requests(), min_size=1, max_size=12),
    policy=st.sampled_from(sorted(POLICIES)),
)
def test_no_overallocation_gangs_whole_and_refusals_explained(snapshot, stream, policy):
    engine = PlacementEngine(snapshot, policy=policy, profile=profile_from_requests(stream), seed=7)
    placed = []
    for request in stream:
        passing = {n.id for n in snapshot.nodes} - {d.node_id for d in engine.explain(request)}
        before = engine_state(engine)
        result = engine.place(request, explain=True)
        if isinstance(result, Placement):
            placed.append((request, result))
            assert set(result.node_ids) <= passing, "placed on a node the filters reject"
        else:
            assert isinstance(result, Unschedulable)
            assert engine_state(engine) == before, "a refused gang kept some of its reservations"
            assert len(passing) < request.num_nodes, (
                "refused although enough nodes pass every filter"
            )
            assert result.filter_detail, "a refusal without per-node detail"
    check_placements(snapshot, placed)


@settings(max_examples=examples(60), deadline=None)
@given(
    snapshot=clusters(),
    stream=st.lists(requests(), min_size=1, max_size=8),
    policy=st.sampled_from(sorted(POLICIES)),
)
def test_release_returns_every_reservation(snapshot, stream, policy):
    engine = PlacementEngine(snapshot, policy=policy, seed=3)
    start = engine_state(engine)
    placements = [r for r in (engine.place(q) for q in stream) if r.schedulable]
    for placement in reversed(placements):
        engine.release(placement)
    assert engine_state(engine) == start


@settings(max_examples=examples(60), deadline=None)
@given(snapshot=clusters(), request=requests())
def test_simulate_matches_place_and_reserves_nothing(snapshot, request):
    engine = PlacementEngine(snapshot, policy="bestfit")
    start = engine_state(engine)
    simulated = engine.simulate(request)
    assert engine_state(engine) == start
    placed = engine.place(request)
    assert simulated.schedulable == placed.schedulable
    if placed.schedulable:
        assert simulated.ranks == placed.ranks


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshot=clusters(),
    first=st.lists(requests(), min_size=1, max_size=6),
    then=st.lists(requests(), min_size=1, max_size=6),
    policy=st.sampled_from(sorted(p for p in POLICIES if p != "random")),
)
def test_a_refreshed_engine_decides_as_a_fresh_one(snapshot, first, then, policy):
    kept = PlacementEngine(snapshot, policy=policy)
    for request in first:
        kept.place(request)
    touched = kept.take_touched()
    assert kept.take_touched() == set()
    by_id = {n.id: n for n in snapshot.nodes}
    kept.refresh(
        by_id[node_id] for node_id in touched
    )  # what it reserved is forgotten: back to the snapshot
    fresh = PlacementEngine(snapshot, policy=policy)
    assert kept.snapshot() == fresh.snapshot()
    profile = profile_from_requests(then)
    kept.rescore(policy, profile)
    fresh.rescore(policy, profile)
    assert [kept.place(r) for r in then] == [fresh.place(r) for r in then]
