"""Supervised workloads on this host: tasks now, and what else the agent runs as supervised
processes.

- `assignment`  the environment and paths a task gets from its Assignment (fleetwire validates it)
- `supervisor`  a process in its own session and cgroup: spawn, watch, stop with a grace, reap
- `task`        one task's lifecycle: prepare, spawn, supervise, outcome, finish
- `runner`      every task on this host: submit, cancel, recover after a restart, shutdown
- `output`      output kept in files: numbered lines, framed chunks, a state file to resume from
- `chunks`      an output's chunks at rest: framed while open, gzip once sealed, until stored
- `texts`       the line texts a batch carries: the first lines and the newest, bounded
- `shipping`    that output to fleetd: tail batches and chunk uploads, in the background
- `journal`     the state file of a task: one JSON record a line, the last whole one counts
- `finish`      finish reports, retried through an outage, batched when they come together
- `dirs`        task directories, recycled when their task left them as made
- `limits`      each task's limits set up (isolation, MPS, cgroup); the node's limits facade
- `mps`         one MPS control daemon per GPU
- `watchdog`    the VRAM watchdog over every task
- `errors`      TaskError, Fenced, Stopped, LimitError; which fleetd answers fence a task off

/proc is read only through agent/procfs.py and cgroupfs written only through agent/cgroups.py.
"""
