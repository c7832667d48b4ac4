"""What tasks hold, per GPU and per node, kept up to date between reads.

Every scheduling pass, cluster status and /metrics scrape sums what the active (and still
stopping) tasks hold. At 20,000 running tasks that sum was about 150 ms each time, though
between two reads only the tasks that started or ended since differ. `Reservations` keeps each
task's share from the last read and applies only the difference: a task is known by its id, its
epoch and whether it is active, and what it holds does not change while it holds it (its GPUs,
its job's CPUs and memory). The GPUs each team holds by priority class (what quotas count: its
active jobs, each once) are kept the same way.

The maps it returns are new objects at every read and are never changed afterwards, so a reader
in another thread (a pass deciding off the event loop) keeps a consistent view.
"""

import threading

from fleetd import scheduler
from fleetd.services.workloads.lifecycle import ACTIVE_TASK_STATES
from fleetwire.mig import gpu_fraction

_ACTIVE = frozenset(ACTIVE_TASK_STATES)


def gpus_of(request):
    """GPUs a request holds in all, fractions included (what quotas count); a MIG device counts as
    its profile's compute slices over 7."""
    if request.mig is not None:
        return request.num_nodes * request.gpu_count * gpu_fraction(request.mig)
    if request.shared:
        return request.num_nodes * request.gpu_milli / scheduler.MILLI
    return float(request.num_nodes * request.gpu_count)


def _key(hold):
    return hold.id, hold.epoch, hold.state in _ACTIVE


def _shares(hold):
    """A task's shares: ((node id, device) -> (milli, memory, exclusive)), (cpu milli, memory)."""
    gpus = []
    for alloc in hold.gpus:
        # A MIG device is held by its own uuid; its GPU, in MIG mode, takes no other work.
        where = alloc.get("mig_device") or alloc["uuid"]
        gpus.append(
            (
                (hold.node_id, where),
                alloc.get("compute_milli", scheduler.MILLI),
                alloc.get("memory_limit_bytes") or 0,
                alloc.get("exclusive", False),
            )
        )
    req = hold.job.request
    return tuple(gpus), (req.cpu_milli, req.memory_bytes)


def compute(holds):
    """(held, node_use, usage) of these holds, from nothing: held is {(node id, device): [milli,
    memory bytes, exclusive, [task ids]]}, node_use {node id: [cpu milli, memory bytes, tasks]},
    usage {(team, priority class): GPUs its active jobs hold}."""
    held: dict[tuple[str, str], list] = {}
    node_use: dict[str, list[int]] = {}
    usage: dict[tuple[str, str], float] = {}
    counted = set()
    for hold in holds:
        if hold.state in _ACTIVE and hold.job_id not in counted:
            counted.add(hold.job_id)
            team = (hold.job.team, hold.job.priority_class)
            usage[team] = usage.get(team, 0) + gpus_of(hold.job.request)
        gpus, (cpu, memory) = _shares(hold)
        use = node_use.setdefault(hold.node_id, [0, 0, 0])
        use[0] += cpu
        use[1] += memory
        use[2] += 1
        for where, milli, mem, exclusive in gpus:
            h = held.setdefault(where, [0, 0, False, []])
            h[0] += milli
            h[1] += mem
            h[2] = h[2] or exclusive
            h[3].append(hold.id)
    return held, node_use, usage


class Reservations:
    """The sums of the last read, and who holds each GPU and node in them (one per runtime)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._tasks: dict[tuple, tuple] = {}  # _key(hold) -> (node id, devices, job id, team)
        self._gpus: dict = {}  # (node id, device) -> {task key: (milli, memory, excl, id)}
        self._nodes: dict = {}  # node id -> {task key: (cpu milli, memory bytes)}
        self._jobs: dict = {}  # job id -> its active task keys
        self._teams: dict = {}  # (team, class) -> {job id: GPUs it holds}
        self._held: dict = {}
        self._node_use: dict = {}
        self._usage: dict = {}

    def of(self, holds):
        """(held, node_use, usage) of these holds (as compute() gives), from the last read's sums
        and the tasks that came or went since. The maps are the caller's to read, not to change."""
        with self._lock:
            current = {_key(h): h for h in holds}
            known = self._tasks
            gone = [key for key in known if key not in current]
            new = [key for key in current if key not in known]
            if not gone and not new:
                return self._held, self._node_use, self._usage
            if len(gone) + len(new) > len(current) // 2 + 100:
                # Mostly new (the first read, or after a long pause): every sum afresh.
                self._tasks, self._gpus, self._nodes, self._jobs, self._teams = {}, {}, {}, {}, {}
                self._held, self._node_use, self._usage = {}, {}, {}
                gone, new = [], list(current)
            touched_gpus, touched_nodes, touched_teams = set(), set(), set()
            for key in gone:
                node_id, gpus, job_id, team = known.pop(key)
                touched_nodes.add(node_id)
                self._nodes[node_id].pop(key, None)
                for where in gpus:
                    touched_gpus.add(where)
                    self._gpus[where].pop(key, None)
                if team is not None:
                    keys = self._jobs[job_id]
                    keys.discard(key)
                    if not keys:  # the job's last active task: it holds nothing more
                        del self._jobs[job_id]
                        self._teams[team].pop(job_id, None)
                        touched_teams.add(team)
            for key in new:
                node_id, gpus, _job_id, team = self._add(key, current[key])
                touched_nodes.add(node_id)
                touched_gpus.update(gpus)
                if team is not None:
                    touched_teams.add(team)
            held = _resummed(self._held, self._gpus, touched_gpus, _gpu_total)
            node_use = _resummed(self._node_use, self._nodes, touched_nodes, _node_total)
            usage = _resummed(self._usage, self._teams, touched_teams, _team_total)
            self._held, self._node_use, self._usage = held, node_use, usage
            return held, node_use, usage

    def _add(self, key, hold):
        gpus, (cpu, memory) = _shares(hold)
        self._nodes.setdefault(hold.node_id, {})[key] = (cpu, memory)
        for where, milli, mem, exclusive in gpus:
            self._gpus.setdefault(where, {})[key] = (milli, mem, exclusive, hold.id)
        wheres = tuple(where for where, *_ in gpus)
        team = None
        if key[2]:  # active: its job counts toward its team's GPUs, once
            team = (hold.job.team, hold.job.priority_class)
            self._jobs.setdefault(hold.job_id, set()).add(key)
            self._teams.setdefault(team, {})[hold.job_id] = gpus_of(hold.job.request)
        self._tasks[key] = (hold.node_id, wheres, hold.job_id, team)
        return self._tasks[key]


def _resummed(sums, holders, touched, total):
    """A copy of `sums` whose touched keys are summed again from their holders (`total` of the
    holders' shares); a key no one holds any more leaves both."""
    out = dict(sums)
    for key in touched:
        shares = holders.get(key)
        if shares:
            out[key] = total(shares)
        else:
            holders.pop(key, None)
            out.pop(key, None)
    return out


def _gpu_total(shares):
    values = shares.values()
    return [
        sum(s[0] for s in values),
        sum(s[1] for s in values),
        any(s[2] for s in values),
        [s[3] for s in values],
    ]


def _node_total(shares):
    values = shares.values()
    return [sum(s[0] for s in values), sum(s[1] for s in values), len(shares)]


def _team_total(shares):
    return sum(shares.values())
