"""Every task on this host: accepts assignments, recovers after a restart, stops them all.

Each assignment from fleetd becomes a Task (agent/task/task.py), or an InstanceTask
(agent/task/instance.py) for an instance run, with its own supervisor thread. On start,
`Runner.recover` takes back every task whose process was started before a restart (a task's
output goes into files and its exit status is recorded by a root-owned shell, so neither needs
the agent): one still running is watched again, one that ended is reported with the outcome it
recorded, as it would have been live. Tasks left before their process started, or with no usable
journal, are killed (found from their journal: process group and start ticks, or their
FLEET_TASK_ID/FLEET_TASK_EPOCH environment) and reported lost. On stop, `Runner.shutdown` stops
the tasks and leaves the instances running (unless the node was revoked). The runner also keeps
the instances' volumes and host ports.
"""

import functools
import logging
import os
import shutil
import signal
import threading
import time

from agent.isolation import Isolation, blocked_directory
from agent.ports import PortAllocator
from agent.procfs import read_boot_id, read_proc, recorded_pids, signal_pids, wait_gone
from agent.task.container import ContainerRuntime
from agent.task.dirs import SPARE_DIR, STATE_FILE, TaskDirs
from agent.task.errors import Fenced
from agent.task.finish import FinishReports, report_finish
from agent.task.instance import InstanceTask
from agent.task.journal import append_state, read_state
from agent.task.limits import Limits, LimitSettings
from agent.task.output import OutputKeeper, OutputSettings
from agent.task.shipping import Outputs, OutputShipper
from agent.task.supervisor import kill_recorded
from agent.task.task import Task
from agent.task.volumes import Volumes
from agent.threads import Pool
from agent.watch import ExitWatcher, Ticker
from fleetwire.assignment import Assignment

log = logging.getLogger("agent.runner")

TASKS_DIR = "tasks"
OUTCOMES = ("succeeded", "failed", "cancelled")
RECOVERY_KILL_WAIT_SECONDS = 10.0
DEFAULT_REPORT_RETRY_SECONDS = 7 * 86400.0
MAX_IDLE_CLIENTS = 8


class Runner:
    """Every task on this host: accepts assignments, recovers after a restart, stops them all."""

    def __init__(
        self,
        state_dir,
        workers,
        client_factory,
        address,
        kill_grace_seconds=10.0,
        rendezvous_timeout_seconds=600.0,
        report_retry_seconds=DEFAULT_REPORT_RETRY_SECONDS,
        backoff_max_seconds=60.0,
        output_settings=None,
        limits=None,
        ports=None,
        containers=None,
        isolation=None,
        restart_limit=10,
    ):
        self.isolation = isolation or Isolation()
        # Tasks pass through the state dir to their own directories, and list nothing in it.
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.isolation.passable(state_dir)
        self.state_dir = state_dir
        self._warn_if_unreachable(state_dir)
        self.tasks_dir = os.path.join(state_dir, TASKS_DIR)
        # Tasks running as their own uid pass through the directory of all tasks and their own.
        self.dirs = TaskDirs(
            os.path.join(state_dir, SPARE_DIR), mode=0o711 if self.isolation.enabled else 0o700
        )
        # Without a Limits from the daemon: env and isolation checks only, no cgroups, no MPS.
        self.limits = limits or Limits(LimitSettings(cgroup_parent=""), state_dir=state_dir)
        self.volumes = Volumes(state_dir, root_mode=0o711 if self.isolation.enabled else 0o700)
        self.volumes.prepare()
        self.ports = ports or PortAllocator(state_dir)
        self.containers = (
            containers  # a ContainerRuntime, or None: instances with an image cannot run
        )
        self.workers = workers
        self.new_client = client_factory  # callable() -> a FleetClient for one thread
        self.address = address
        self.kill_grace_seconds = kill_grace_seconds
        self.restart_limit = (
            restart_limit  # an instance's restarts in a row under 60 s before its policy gives up
        )
        self.rendezvous_timeout_seconds = rendezvous_timeout_seconds
        self.report_retry_seconds = report_retry_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.output_settings = output_settings or OutputSettings(
            backoff_max_seconds=backoff_max_seconds
        )
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._tasks = {}  # task_id -> Task
        self._deleting = set()  # instance ids whose volume is being deleted
        # FleetClients with open keep-alive connections, for the next thread.
        self._idle_clients = []
        self._threads = []
        self.threads = Pool("task")  # supervisors, pipe readers and log shippers of tasks
        self.start_says_when = True  # start reports carry started_seconds_ago (an older fleetd: no)
        self.exits = ExitWatcher("task-exits")  # the exits of tasks whose output goes to files
        self.tails = Ticker(self.output_settings.interval_seconds, "task-tails")  # their output
        self.outputs = Outputs()  # shipping on after their task was left
        self.finishes = FinishReports()

    def _warn_if_unreachable(self, state_dir):
        """Say at start, naming it, which directory on the way to the state dir other uids cannot
        pass: every task run as its own uid would fail there (each is refused with that reason, and
        root's run)."""
        blocked = blocked_directory(state_dir) if self.isolation.enabled else None
        if blocked is not None:
            directory, mode = blocked
            log.warning(
                "state dir %s: %s (mode %04o) on the way to it is not passable by other users, so "
                "no task can run as its own uid here (each is refused; root's tasks run): chmod "
                "o+x %s, or put state_dir where other users may pass (as /var/lib)",
                state_dir,
                directory,
                mode,
                directory,
            )

    @classmethod
    def from_config(
        cls, config, state_dir, workers, client_factory, address, limits=None, isolation=None
    ):
        """A Runner with the [tasks] settings of the agent config."""
        settings = OutputSettings(
            batch_lines=config.tasks_log_batch_lines,
            batch_bytes=config.tasks_log_batch_bytes,
            interval_seconds=config.tasks_log_interval_seconds,
            tick_bytes=config.tasks_log_buffer_bytes,
            chunk_age_seconds=config.tasks_output_chunk_age_seconds,
            backoff_max_seconds=config.backoff_max_seconds,
        )
        low, high = config.ports_bounds
        return cls(
            state_dir,
            workers,
            client_factory,
            address,
            kill_grace_seconds=config.tasks_kill_grace_seconds,
            rendezvous_timeout_seconds=config.tasks_rendezvous_timeout_seconds,
            report_retry_seconds=config.tasks_report_retry_seconds,
            backoff_max_seconds=config.backoff_max_seconds,
            output_settings=settings,
            limits=limits,
            ports=PortAllocator(state_dir, low, high),
            containers=ContainerRuntime.detect(config.containers_command),
            isolation=isolation,
            restart_limit=config.instances_restart_limit,
        )

    def checkout_client(self):
        """A FleetClient for one thread's use (reused: short tasks need no new connection each)."""
        with self._lock:
            if self._idle_clients:
                return self._idle_clients.pop()
        return self.new_client()

    def checkin_client(self, client):
        """Hand a client back; beyond a few idle ones it is closed."""
        with self._lock:
            if len(self._idle_clients) < MAX_IDLE_CLIENTS and not self.closing.is_set():
                self._idle_clients.append(client)
                return
        client.close()

    def tasks(self):
        """The tasks this runner supervises now."""
        with self._lock:
            return list(self._tasks.values())

    def get(self, task_id):
        """The Task for an id, or None."""
        with self._lock:
            return self._tasks.get(task_id)

    def submit(self, data):
        """Run an assignment from acquire; returns its Task, or None when it is not run."""
        try:
            assignment = Assignment.from_wire(data)
        except ValueError as exc:
            log.error("invalid assignment from fleetd: %s", exc)
            self._refuse(data, f"invalid assignment: {exc}")
            return None
        with self._lock:
            closing = self.closing.is_set()
            old = None if closing else self._tasks.get(assignment.task_id)
            if old is not None and old.epoch >= assignment.epoch:
                log.warning(
                    "task %s: assignment for epoch %d ignored, epoch %d runs here",
                    assignment.task_id,
                    assignment.epoch,
                    old.epoch,
                )
                return None
            if not closing:
                task = (
                    InstanceTask(self, assignment, data)
                    if assignment.instance
                    else Task(self, assignment, data)
                )
                self._tasks[assignment.task_id] = task
        if closing:  # handed back outside the lock: the report is a network call
            self.decline(assignment.task_id, assignment.epoch)
            return None
        if old is not None:
            old.fence(f"superseded by epoch {assignment.epoch}")
        log.info(
            "task %s: assigned (job %s, rank %d of %d, %d GPU(s))",
            task.label,
            assignment.job_id,
            assignment.rank,
            assignment.num_nodes,
            len(assignment.gpus),
        )
        task.start()
        return task

    def cancel(self, task_ids, reason):
        """Stop these tasks (fleetd said so): SIGTERM now, SIGKILL after the grace; each then
        reports its finish. Ids of tasks not running here are ignored."""
        for task_id in task_ids:
            task = self.get(task_id)
            if task is not None:
                log.warning("stopping task %s: %s", task.label, reason)
                task.cancel(reason)

    def flush_output(self, task_ids):
        """A reader waits for these tasks' output: seal each one's open chunk and upload it now.
        Ids of tasks not running here are ignored."""
        for task_id in task_ids:
            task = self.get(task_id)
            if task is not None and task.output is not None:
                task.output.flush_now()

    def fence_jobs(self, reason, grace):
        """Stop every job task (not the instances): their lease ran out while fleetd was
        unreachable. Each is reported `lost` once fleetd answers again (fleetd has declared it lost
        by then, or does at that report). Returns how many were stopped."""
        stopped = 0
        for task in self.tasks():
            if task.assignment.instance is None:
                task.cancel(reason, outcome="failed", lost=True, grace=grace)
                stopped += 1
        return stopped

    def decline(self, task_id, epoch):
        """Hand back an assignment that came while the agent stops, not started: reported failed
        with `lost` and `agent_stopping`, so fleetd requeues its job without using an attempt
        (rather than waiting for its lease to expire). One try: a report not delivered leaves it to
        the lease."""
        log.warning(
            "task %s/%s: not started, the agent is stopping; handing it back to fleetd",
            task_id,
            epoch,
        )
        self._report_orphan(
            None,
            task_id,
            epoch,
            ("failed", None, "not started: fleet-agent is stopping"),
            lost=True,
            agent_stopping=True,
        )

    def _refuse(self, data, reason):
        """Report an assignment that cannot even be parsed as failed, when it names a task and
        epoch."""
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("task_id"), str)
            or not isinstance(data.get("epoch"), int)
        ):
            return
        self._background(
            f"refuse-{data['task_id']}",
            self._report_orphan,
            None,
            data["task_id"],
            data["epoch"],
            ("failed", None, reason),
        )

    def forget(self, task):
        """The task's supervisor is done with it."""
        task_id = task.assignment.task_id
        with self._lock:
            if self._tasks.get(task_id) is task:
                del self._tasks[task_id]

    # After a restart.

    def recover(self):
        """Take back the instance runs left from before a restart; kill the processes of the other
        tasks left and report those tasks to fleetd.

        Returns [(task_id, epoch, killed pids)] of the tasks killed; the reports go on in background
        threads.
        """
        try:
            entries = sorted(os.listdir(self.tasks_dir))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            path = os.path.join(self.tasks_dir, entry)
            try:
                record = read_state(os.path.join(path, STATE_FILE))
                task_id, epoch = record["task_id"], int(record["epoch"])
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("task directory %s has no usable state file; removing it", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            if record.get("finish_reported"):
                self._resume_output(path, record)
            elif not self._take_back(record):
                found.append(self._kill_and_report(path, record, task_id, epoch))
        return found

    def _take_back(self, record):
        """A task (or an instance run) whose process was started and whose outcome was not recorded:
        supervised again, its process alive (watched, its outcome reported as it would have been
        live) or not (the exit status its root-owned wrapper recorded is the outcome; none: lost).
        False for anything else, which is killed and reported."""
        if (
            record.get("outcome") in OUTCOMES
            or not record.get("pid")
            or not record.get("assignment")
        ):
            return False
        try:
            assignment = Assignment.from_wire(record["assignment"])
        except (KeyError, TypeError, ValueError) as exc:
            log.error(
                "task %s/%s: its journal holds no usable assignment (%s)",
                record["task_id"],
                record["epoch"],
                exc,
            )
            return False
        if (assignment.task_id, assignment.epoch) != (record["task_id"], int(record["epoch"])):
            return False
        if not _leader_alive(record):  # what is left of it goes before the policy restarts it
            pids = recorded_pids(record)
            signal_pids(pids, signal.SIGKILL)
            if pids and not wait_gone(pids, RECOVERY_KILL_WAIT_SECONDS):
                log.error(
                    "task %s/%d: process(es) %s survived SIGKILL",
                    assignment.task_id,
                    assignment.epoch,
                    pids,
                )
        kind = InstanceTask if assignment.instance is not None else Task
        task = kind(self, assignment, record["assignment"], adopted=record)
        with self._lock:
            self._tasks[assignment.task_id] = task
        what = (
            f"an instance run (instance {assignment.instance.id})"
            if assignment.instance
            else "a task"
        )
        log.info(
            "task %s: %s left from before the agent restarted; taking it back", task.label, what
        )
        task.start()
        return True

    def _kill_and_report(self, path, record, task_id, epoch):
        """Kill what is left of a task from before a restart; report it in the background."""
        pids = recorded_pids(record)
        if not kill_recorded(record, pids, self.limits.cgroups, RECOVERY_KILL_WAIT_SECONDS):
            log.error("task %s/%d: process(es) %s survived SIGKILL", task_id, epoch, pids)
        lost = True  # the agent's restart ended it, not the task itself
        stopping = False  # not known to be a graceful stop: the agent may have crashed
        if record.get("outcome") in OUTCOMES:
            result = (record["outcome"], record.get("exit_code"), record.get("reason"))
            lost = bool(record.get("lost"))
            stopping = lost and bool(record.get("agent_stopping"))
        elif pids:
            result = (
                "failed",
                None,
                "fleet-agent restarted while the task ran; its processes were killed",
            )
        elif not record.get("pid"):  # still preparing (directories, artifacts, the rendezvous)
            result = (
                "failed",
                None,
                "fleet-agent restarted before the task's command started; nothing of it ran",
            )
        else:
            result = (
                "failed",
                None,
                "fleet-agent restarted; the task's process had ended and its exit "
                "status is unknown",
            )
        log.warning(
            "task %s/%d: left from before the agent restarted; killed %d process(es); reporting %s",
            task_id,
            epoch,
            len(pids),
            result[0],
        )
        extra = {"idle": True} if record.get("idle") else None
        self._background(
            f"recover-{task_id}",
            self._report_orphan,
            path,
            task_id,
            epoch,
            result,
            lost,
            stopping,
            extra,
            record,
        )
        return task_id, epoch, pids

    def _output_of(self, path, record):
        """An OutputShipper for the output a task left in its directory `path` (its journal
        `record`), resumed from its state file."""
        task_id, epoch = record["task_id"], int(record["epoch"])
        cap = (record.get("assignment") or {}).get("output_cap_bytes")
        label = f"{task_id}/{epoch}"
        settings = self.output_settings
        keeper = OutputKeeper(path, epoch, cap if isinstance(cap, int) else None, settings, label)
        return OutputShipper(keeper, self, task_id, settings, label=label)

    def _resume_output(self, path, record):
        """A task fleetd has the finish of, whose output was not all shipped before a restart:
        shipped now, then its directory goes."""
        shipper = self._output_of(path, record)
        shipper.finish()
        log.info("task %s/%s: shipping the rest of its output", record["task_id"], record["epoch"])
        shipper.when_done(functools.partial(self.dirs.remove, path, reuse=False))

    def _report_orphan(
        self,
        path,
        task_id,
        epoch,
        result,
        lost=False,
        agent_stopping=False,
        extra=None,
        record=None,
    ):
        client = self.checkout_client()
        label = f"{task_id}/{epoch}"
        # What the task wrote is read to its end and reported with the finish, shipped after it.
        output = self._output_of(path, record) if path and record else None
        summary = output.finish() if output is not None else None
        try:
            done = report_finish(
                client,
                self,
                task_id,
                epoch,
                result,
                label,
                lost=lost,
                agent_stopping=agent_stopping,
                extra=extra,
                output=summary,
            )
        except Fenced as exc:
            log.warning(
                "task %s: %s; the task is no longer this node's (stale epoch), forgotten",
                label,
                exc,
            )
            done = True
        finally:
            self.checkin_client(client)
        if not (done and path):
            if output is not None:
                output.stop()
            return
        if output is None:
            self.dirs.remove(path, reuse=False)
            return
        if output.keeper.pending():
            try:  # a restart before the output is shipped ships it, and reports nothing again
                append_state(os.path.join(path, STATE_FILE), dict(record, finish_reported=True))
            except OSError as exc:
                log.warning("task %s: cannot record its finish report: %s", label, exc)
        output.when_done(functools.partial(self.dirs.remove, path, reuse=False))

    def background(self, name, target, *args):
        """Run target(*args) on a thread that shutdown() waits for (bounded)."""
        self._background(name, target, *args)

    def _background(self, name, target, *args):
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    # Stopping.

    def shutdown(self, reason, timeout=None, lost=True, stop_instances=False):
        """Stop every task (SIGTERM, SIGKILL after the grace) and wait for their supervisors,
        bounded.

        The tasks are reported failed with `lost` and `agent_stopping` (the agent stopped them as it
        shuts down: fleetd requeues their jobs without using an attempt). Finish reports get one
        more attempt; those not delivered stay in the state dir for the next start. Instance runs
        whose process started are left running for the next start to take back, unless
        `stop_instances` (the node was revoked). Returns how many tasks it stopped.
        """
        self.closing.set()
        tasks = self.tasks()
        left = [task for task in tasks if not stop_instances and task.detach()]
        tasks = [task for task in tasks if task not in left]
        for task in tasks:
            task.cancel(reason, outcome="failed", lost=lost, agent_stopping=lost)
            if task.output is not None:
                task.output.nudge()
        timeout = self.kill_grace_seconds + 15 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if left:
            log.info("leaving %d instance(s) running for the next start to take back", len(left))
        for task in left + tasks:
            task.thread.join(max(0.1, deadline - time.monotonic()))
            if task.thread.is_alive():
                task.fence("the agent is stopping", keep_state=True)
                task.thread.join(5)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        with self._lock:
            idle, self._idle_clients = self._idle_clients, []
        for client in idle:
            client.close()
        self.outputs.stop_all()  # the next start ships the rest
        self.tails.close()
        self.exits.close()
        return len(tasks)

    # Instances: their volumes, their figures.

    def instances_report(self):
        """The heartbeat's `instances`: the figures of every instance run that started here."""
        reports = [task.report() for task in self.tasks() if isinstance(task, InstanceTask)]
        return [report for report in reports if report is not None]

    def delete_volumes(self, instance_ids, reason="fleetd asked"):
        """Delete volumes (in the background) and free their instances' host ports; never the volume
        of an instance that has a run on this host."""
        busy = {
            task.assignment.instance.id
            for task in self.tasks()
            if task.assignment.instance is not None
        }
        present = set(self.volumes.list())
        for instance_id in instance_ids:
            if not isinstance(instance_id, str) or (
                instance_id not in present and not self.ports.get(instance_id)
            ):
                continue
            if instance_id in busy:
                log.warning(
                    "volume %s: not deleted (%s): its instance runs here", instance_id, reason
                )
                continue
            with self._lock:
                if instance_id in self._deleting:
                    continue
                self._deleting.add(instance_id)
            self._background(
                f"delete-volume-{instance_id}", self._delete_volume, instance_id, reason
            )

    def _delete_volume(self, instance_id, reason):
        try:
            gone = self.volumes.delete(instance_id)
        except (OSError, ValueError) as exc:
            log.error("volume %s: cannot delete it: %s", instance_id, exc)
            gone = False
        finally:
            with self._lock:
                self._deleting.discard(instance_id)
        if gone:
            self.ports.release(instance_id)
            log.info("volume %s deleted (%s); its host ports are free", instance_id, reason)


def _leader_alive(record):
    """True when the process a journal record started is still running (same boot, same start
    time)."""
    if record.get("boot_id") and record["boot_id"] != read_boot_id():
        return False
    info = read_proc(record["pid"]) if isinstance(record.get("pid"), int) else None
    return info is not None and info.start_ticks == record.get("start_ticks")
