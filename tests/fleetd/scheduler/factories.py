"""Plain factories for scheduler tests: nodes, GPUs and snapshots with fixed, readable ids."""

from fleetd.scheduler import ClusterSnapshot, GpuSnapshot, NodeSnapshot

GIB = 1024**3


def make_gpu(node_id="n0", index=0, model="H100", memory_gib=80, numa=None, **overrides):
    """A healthy, idle GPU; `numa` defaults to 0 for the first half of an 8-GPU host."""
    fields = dict(
        uuid=f"GPU-{node_id}-{index}",
        model=model,
        memory_total_bytes=memory_gib * GIB,
        numa_node=index // 4 if numa is None else numa,
    )
    fields.update(overrides)
    return GpuSnapshot(**fields)


def make_node(
    node_id="n0", gpus=8, model="H100", cpus=64, memory_gib=512, gpu_overrides=None, **overrides
):
    """A ready node with `gpus` idle GPUs; `gpu_overrides` maps a GPU index to field overrides."""
    gpu_overrides = gpu_overrides or {}
    fields = dict(
        id=node_id,
        gpus=tuple(make_gpu(node_id, i, model, **gpu_overrides.get(i, {})) for i in range(gpus)),
        cpu_free_milli=cpus * 1000,
        memory_free_bytes=memory_gib * GIB,
    )
    fields.update(overrides)
    return NodeSnapshot(**fields)


def make_cluster(*nodes):
    """A snapshot of the given nodes, in that order."""
    return ClusterSnapshot(tuple(nodes))


def link_matrix(count, link):
    """A node's links: `link(i, j)` for each pair, `self` on the diagonal."""
    return tuple(
        tuple("self" if i == j else link(i, j) for j in range(count)) for i in range(count)
    )


# The four host shapes of issue 50 (the fake NVML fixtures of the same names report these).
H100_NVSWITCH_X8 = link_matrix(8, lambda i, j: "nvswitch")
L40S_PCIE_X8 = link_matrix(  # two sockets, each with two PCIe switches of two GPUs
    8,
    lambda i, j: "pcie_switch" if i // 2 == j // 2 else "numa" if i // 4 == j // 4 else "system",
)
A100_NVLINK_PAIRS_X4 = link_matrix(4, lambda i, j: "nvlink" if i // 2 == j // 2 else "system")
CONSUMER_X2 = link_matrix(2, lambda i, j: "system")
