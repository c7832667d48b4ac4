"""Workloads: what users run.

- ``lifecycle``  each state machine's table and switch (jobs, tasks, instances, nodes); stops owed
- ``runs``       what a task's end does; the runs of instances
- ``node_status`` a node's status change and what it does to the work it holds
- ``prices``     what an instance's run costs per hour
- ``jobs``       submit, read, cancel, logs, events
- ``instances``  long-running reserved workloads: ports, a volume, stop and resume
- ``instance_views``  an instance as users read it: its run, node, ports and costs
- ``artifacts``  content-addressed files jobs refer to
- ``shares``     read-only links to a job that need no token
"""
