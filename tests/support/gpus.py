"""GPU reports as an agent sends them, for registering nodes in tests."""

GPU_H100 = {
    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    "index": 0,
    "vendor": "nvidia",
    "model": "NVIDIA H100 80GB HBM3",
    "memory_total_bytes": 80 * 1024**3,
    "numa_node": 0,
    "max_tflops": 989.0,
    "healthy": True,
    "health_reason": "",
    "mig_mode": "disabled",
}


def gpus(count, model=GPU_H100["model"]):
    """`count` distinct H100-like GPU reports."""
    return [
        dict(GPU_H100, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", index=i, model=model)
        for i in range(count)
    ]


def topology_x3():
    """The topology an agent reports for gpus(3), listed in another order than their indexes (GPU 2,
    0, 1): GPUs 0 and 1 NVLinked with 12 links, GPU 2 across the sockets, an HCA beside GPU 0."""
    uuids = [gpu["uuid"] for gpu in gpus(3)]
    return {
        "gpus": [uuids[2], uuids[0], uuids[1]],
        "links": [
            ["self", "system", "system"],
            ["system", "self", "nvlink"],
            ["system", "nvlink", "self"],
        ],
        "nvlink_count": [[0, 0, 0], [0, 0, 12], [0, 12, 0]],
        "nics": [
            {
                "name": "mlx5_0",
                "kind": "infiniband",
                "pci_bus_id": "0000:19:00.0",
                "links": ["system", "pcie_switch", "host_bridge"],
            }
        ],
    }


def mig_gpu(index, profiles, model="NVIDIA A100-SXM4-80GB", mig_mode="enabled"):
    """A MIG-enabled GPU report whose slices are `profiles` [(profile, start, size)...], with MIG
    device uuids MIG-<index>-<slot>."""
    return dict(
        GPU_H100,
        uuid=f"GPU-{index:08d}-0000-0000-0000-00000000a100",
        index=index,
        model=model,
        mig_mode=mig_mode,
        mig_devices=[
            {
                "uuid": f"MIG-{index:08d}-0000-4000-8000-{start:012d}",
                "memory_total_bytes": 10 * 1024**3 * size,
                "profile": profile,
                "start": start,
                "size": size,
            }
            for profile, start, size in profiles
        ],
    )
