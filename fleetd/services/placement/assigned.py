"""What a task row keeps of the engine's placement of its rank: its GPUs as stored (and sent in
the Assignment), its GPUs' weakest link, and the reason its assignment event gives."""

from fleetd import scheduler


def stored_allocation(gpu: scheduler.GpuAllocation) -> dict:
    """A GpuAllocation as stored on the task and sent in the Assignment."""
    out = {"uuid": gpu.uuid, "exclusive": gpu.exclusive, "compute_milli": gpu.compute_milli}
    if gpu.mig_device is not None:  # whole, with hardware isolation: no limit to enforce
        out["mig_device"] = gpu.mig_device
    if not gpu.exclusive:
        out["memory_limit_bytes"] = gpu.memory_limit_bytes
        out["compute_percent"] = gpu.compute_milli / 10
    return out


def place_task(task, rank: scheduler.RankPlacement) -> str:
    """Write the rank's node, GPUs and link class on its task; the reason for its event (with why
    these GPUs, where its node's links are known, and, for a gang's rank on a node with a known
    network place, its block and leaf and why the gang went there)."""
    task.node = rank.node_id
    task.gpus = [stored_allocation(g) for g in rank.gpus]
    task.link_class = rank.link_class
    reason = f"placed on node {rank.node_id}"
    if rank.block is not None:
        reason += f" in block {rank.block}" + (f", leaf {rank.leaf}" if rank.leaf else "")
    for note in (rank.link_note, rank.network_note):
        if note:
            reason += f"; {note}"
    return reason
