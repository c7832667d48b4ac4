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
