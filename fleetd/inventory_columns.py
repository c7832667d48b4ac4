"""The node and fleet columns that placement reads, which the inventory triggers watch.

A change to a watched column bumps the inventory version (and notes the node as changed), so the
scheduler reads that node or the fleets again (services.placement.inventory.InventoryCache); a
change to any other column does not. Every GPU column is watched. The migrations that create the
triggers take their columns from here by their own number, so what each installed stays what it was,
and the history of the watched columns is in one place. A new column of either table is listed in
WATCHED (with a migration that re-creates the triggers) or in NOT_WATCHED with why
(tests/fleetd/test_inventory_triggers.py).
"""

# table -> {the migration that changed the triggers: the columns watched from then on}
WATCHED = {
    "node": {
        6: ("fleet", "hostname", "status", "labels", "cpu_count", "memory_bytes"),
        7: (
            "fleet",
            "hostname",
            "status",
            "labels",
            "cpu_count",
            "memory_bytes",
            "container_runtime",
        ),
        16: (
            "fleet",
            "hostname",
            "status",
            "labels",
            "cpu_count",
            "memory_bytes",
            "container_runtime",
            "capabilities",
        ),
        43: (
            "fleet",
            "hostname",
            "status",
            "labels",
            "cpu_count",
            "memory_bytes",
            "container_runtime",
            "capabilities",
            "topology",
        ),
    },
    "fleet": {
        6: ("availability", "labels"),
        16: ("availability", "labels", "allow_root_tasks", "require_isolation", "allowed_images"),
        34: (
            "availability",
            "labels",
            "allow_root_tasks",
            "require_isolation",
            "allowed_images",
            "task_identity",
        ),
        45: (
            "availability",
            "labels",
            "allow_root_tasks",
            "require_isolation",
            "allowed_images",
            "task_identity",
            "network_topology",
        ),
        46: (
            "availability",
            "labels",
            "allow_root_tasks",
            "require_isolation",
            "allowed_images",
            "task_identity",
            "network_topology",
            "mig",
        ),
    },
}

# table -> {column: why a change to it leaves placement's view as it was}
NOT_WATCHED = {
    "node": {
        "id": "the key: a new id is an insert",
        "machine_id": "identifies the host at enrolment",
        "address": "shown and used for SSH, never for placement",
        "agent_labels": "merged into labels, which are watched",
        "label_overrides": "merged into labels, which are watched",
        "agent_version": "shown; rollouts compare it outside placement",
        "bundle_sha256": "shown; rollouts compare it outside placement",
        "gpu_status": "a summary of the GPU rows, which are watched",
        "gpu_status_reason": "text",
        "status_reason": "text",
        "cordon": "the operator's own reason: text, which status already says in effect",
        "status_before_lost": "read when a lost node returns, which changes status",
        "registered_at": "a time",
        "last_heartbeat_at": "every heartbeat writes it; silence is tracked in memory",
        "drain_reason": "text",
        "drain_deadline": "read by the drain sweep, not placement",
        "drain_started_at": "a time",
        "session_id": "the agent's session",
        "session_hash": "the agent's session",
        "join_token_id": "how the node enrolled",
        "health_hold": "a health hold changes status, which is watched",
        "upgrade": "an upgrade's hold changes status, which is watched",
        "drain_repair": "a repair's drain changes status, which is watched",
    },
    "fleet": {
        "name": "the key: a new name is an insert",
        "description": "text",
        "created_at": "a time",
        "health_policy": "read by health checks, which change node status",
        "validation": "read by the validation gate, which changes node status",
        "task_pids_max": (
            "sent with each assignment as the task's pid limit; placement reserves no pids"
        ),
        "task_memory_default_bytes": (
            "sent with each assignment as the memory bound of a task that sets none; "
            "placement reserves only the memory_bytes a spec asks for"
        ),
        "task_path": "sent with each assignment as the task's PATH",
        "output_cap_bytes": "sent with each assignment as the task's output cap",
        "output_retention_days": "read by the retention collection",
    },
}


def watched(table, migration=None):
    """The columns of `table` watched as of `migration` (the latest when None), as SQL's list."""
    history = WATCHED[table]
    applies = [number for number in history if migration is None or number <= migration]
    if not applies:
        raise ValueError(f"no trigger of {table} watches columns before migration {min(history)}")
    return ", ".join(history[max(applies)])
