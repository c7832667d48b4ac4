"""The node's fence keeper: stops job tasks whose lease ran out while no agent watches them.

A job task's lease (agent/lease.py) ends at a moment the agent knows; a live agent cut off from
fleetd stops its job tasks itself before then. An agent that is dead cannot, and its tasks run
on (their output and outcome do not need it): if it stays down past the lease, fleetd reruns
their jobs elsewhere, and the old copies would run beside the new. So the agent starts this
small process beside it (`python -m agent.keeper <state dir>`), in a cgroup of its own so that
systemd's clean-up of the agent's unit leaves it, and tells it the moment through
``lease.json`` (CLOCK_BOOTTIME seconds, which a suspend does not stop) after every heartbeat
fleetd answers. Once that moment is past, the keeper kills every job task's processes (its
cgroup, and the processes its journal names); instance runs are never fenced. The agent's next
start finds those tasks ended without an exit status and reports them lost, which fleetd has
ruled already.

The keeper reads the state dir and nothing else, and exits once it is replaced (a newer agent
started its own), once the state dir is gone, or once the agent that started it is dead and no
job task of its is left to fence.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from agent.cgroups import Cgroups
from agent.procfs import read_proc, recorded_pids, signal_pids
from agent.state import write_private
from agent.task.journal import read_state

log = logging.getLogger("agent.keeper")

LEASE_FILE = "lease.json"
KEEPER_FILE = "keeper.json"
TASKS_DIR = "tasks"
POLL_SECONDS = 1.0
SLACK_SECONDS = 0.5  # after the moment: a live agent stops its tasks itself, first
MAX_POLLS = 10**9  # about 30 years at one a second: the loop ends for the reasons above
START_WAIT_SECONDS = 10.0  # a new keeper waits this long for the agent to name it in keeper.json


def boottime():
    """Seconds since boot, counting suspends: comparable between processes and across a suspend."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def read_json(path):
    """The JSON object in `path`, or None."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def same_process(record, pid_key="pid", ticks_key="start_ticks"):
    """True when the process a record names (pid and start time) is still running."""
    pid = record.get(pid_key)
    info = read_proc(pid) if isinstance(pid, int) else None
    return info is not None and info.start_ticks == record.get(ticks_key)


def job_tasks(state_dir):
    """[(task directory, journal record)] of the job tasks (not instance runs) whose process was
    started and whose outcome was not recorded."""
    tasks_dir = os.path.join(state_dir, TASKS_DIR)
    try:
        entries = sorted(os.listdir(tasks_dir))
    except OSError:
        return []
    found = []
    for entry in entries:
        try:
            record = read_state(os.path.join(tasks_dir, entry, "task.json"))
        except (OSError, ValueError):
            continue
        if (
            record.get("instance")
            or record.get("outcome")
            or not record.get("pid")
            or not record.get("task_id")
        ):
            continue
        found.append((os.path.join(tasks_dir, entry), record))
    return found


def fence(state_dir):
    """Kill the processes of every job task: (tasks fenced, processes signalled)."""
    fenced = signalled = 0
    for _path, record in job_tasks(state_dir):
        pids = recorded_pids(record)
        cgroup = record.get("cgroup")
        if cgroup and os.path.isdir(cgroup):
            Cgroups.kill(
                cgroup
            )  # all of it at once where the kernel can; the pids below in any case
        if pids:
            signal_pids(pids, signal.SIGKILL)
            fenced += 1
            signalled += len(pids)
    return fenced, signalled


def run(state_dir, me=None, clock=boottime, sleep=time.sleep):
    """The keeper's loop; returns why it ended."""
    me = os.getpid() if me is None else me
    fenced_for = None
    named_by: float | None = time.monotonic() + START_WAIT_SECONDS
    for _ in range(MAX_POLLS):
        if not os.path.isdir(state_dir):
            return "the state dir is gone"
        keeper = read_json(os.path.join(state_dir, KEEPER_FILE)) or {}
        if keeper.get("pid") != me:
            if (
                named_by is not None and time.monotonic() < named_by
            ):  # the agent writes it once we run
                sleep(0.05)
                continue
            return "replaced by another keeper"
        named_by = None
        lease = read_json(os.path.join(state_dir, LEASE_FILE)) or {}
        fence_at = lease.get("fence_at_boottime")
        if (
            isinstance(fence_at, (int, float))
            and fence_at != fenced_for
            and clock() > fence_at + SLACK_SECONDS
        ):
            fenced_for = fence_at
            tasks, pids = fence(state_dir)
            if tasks:
                log.error(
                    "the job tasks' lease ran out %.1fs ago and no agent stopped them: killed %d "
                    "process(es) of %d job task(s), so that no job runs in two places",
                    clock() - fence_at,
                    pids,
                    tasks,
                )
        if not same_process(keeper, "agent_pid", "agent_start_ticks") and not any(
            recorded_pids(record) for _path, record in job_tasks(state_dir)
        ):
            return "the agent is gone and no job task is left"
        sleep(POLL_SECONDS)
    return "ran out of polls"


# The agent's side.


def write_lease(state_dir, fence_at_monotonic):
    """Tell the keeper the moment (the agent's monotonic clock) by which job tasks must have
    stopped."""
    at = boottime() + (fence_at_monotonic - time.monotonic())
    write_private(
        os.path.join(state_dir, LEASE_FILE), json.dumps({"fence_at_boottime": round(at, 3)}) + "\n"
    )


def start_keeper(state_dir, cgroups):
    """Start this agent's keeper (an earlier agent's goes: the keeper runs this agent's code), in a
    cgroup of its own where the host has them; returns its Popen."""
    path = os.path.join(state_dir, KEEPER_FILE)
    old = read_json(path) or {}
    if same_process(old):
        signal_pids([old["pid"]], signal.SIGTERM)
    output = os.open(
        os.path.join(state_dir, "keeper.log"),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
        0o600,
    )
    try:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "PYTHONPATH")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.keeper", state_dir],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    finally:
        os.close(output)
    threading.Thread(target=proc.wait, name="keeper-reaper", daemon=True).start()
    cgroup, _ = cgroups.create(
        "keeper", shared=True
    )  # an earlier agent's keeper may not have gone yet
    if cgroup:
        try:
            cgroups.move(proc.pid, cgroup)
        except OSError as exc:
            log.warning(
                "fence keeper: cannot move it into %s (%s): a stop of the agent's service may end "
                "it",
                cgroup,
                exc.strerror or exc,
            )
    else:
        log.warning(
            "fence keeper: no cgroup of its own (%s): a stop of the agent's service may end it",
            cgroups.why,
        )
    me, keeper = read_proc(os.getpid()), read_proc(proc.pid)
    write_private(
        path,
        json.dumps(
            {
                "pid": proc.pid,
                "start_ticks": keeper.start_ticks if keeper else None,
                "agent_pid": os.getpid(),
                "agent_start_ticks": me.start_ticks if me else None,
            }
        ),
    )
    log.info(
        "fence keeper started (pid %d): it stops job tasks whose lease runs out while no agent "
        "runs",
        proc.pid,
    )
    return proc


def stop_keeper(state_dir, proc):
    """The agent stops its job tasks itself as it stops: the keeper goes, and the lease with it."""
    for name in (LEASE_FILE, KEEPER_FILE):
        try:
            os.unlink(os.path.join(state_dir, name))
        except FileNotFoundError:
            pass
    if proc is not None and proc.poll() is None:
        proc.terminate()


def main(argv=None):
    """`python -m agent.keeper <state dir>`."""
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(
        level=logging.INFO,
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)r",
    )
    if len(args) != 1:
        print("usage: python -m agent.keeper <state dir>", file=sys.stderr)
        return 2
    why = run(os.path.abspath(args[0]))
    log.info("fence keeper exits: %s", why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
