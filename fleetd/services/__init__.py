"""fleetd's use cases, by domain. Services own their transactions and change state only through
the status switches; views call one service function each (docs/architecture.md).

- ``workloads/``  jobs and instances, their state machines and how their runs end
- ``placement/``  the cluster as the scheduler sees it, kept engines, parked groups, passes, policy
- ``agents/``     the agent protocol: sessions (register, heartbeat, deregister) and work
- ``nodes/``      nodes, their GPUs, health, validation and upgrades
- ``accounting/`` the usage ledger, usage reports and budgets
- ``identity/``   API tokens, who a task runs as, per-owner limits
- ``notify/``     events (the audit trail) and webhooks
- ``fleet_ops/``  fleets, rollouts, replicas, metrics, retention, the effective configuration
- ``pagination``  keyset pagination, shared by every listing
"""
