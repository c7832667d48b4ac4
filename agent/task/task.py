"""One task on this host, from its assignment to the acknowledged finish report.

1. a working directory ``state_dir/tasks/<task_id>.<epoch>/work`` and a journal ``task.json``
   beside it (pid, process group, process start ticks, boot id, outcome);
2. input artifacts downloaded into the working directory and verified by sha256;
3. the rendezvous: rank 0 publishes a free port on this host's address; every rank, rank 0 too,
   waits until all ranks of the attempt have arrived (a start barrier: no rank runs ahead of an
   unplaced peer);
4. the command as a supervised process (agent/task/supervisor.py) with the spec's env plus the
   injected variables, its output kept in files and shipped to fleetd in the background
   (agent/task/output.py, agent/task/shipping.py);
5. cancellation (SIGTERM to its processes, SIGKILL after a grace), max_runtime_seconds;
6. the outcome reported with ``finish`` (agent/task/finish.py), retried through a fleetd outage.

Any task call answered 409 (stale epoch), 404, 403 or 401 means fleetd no longer leases the
task to this node: its processes are killed at once and the task is forgotten (fencing).
"""

import functools
import logging
import os
import threading
import time

from agent.client import Conflict, DigestMismatch, FleetdError, Unreachable, backoff_delay
from agent.procfs import TaskKey, read_boot_id, uptime_ticks
from agent.task.assignment import DEFAULT_PATH, free_port, inside, task_env
from agent.task.dirs import STATE_FILE, STATUS_FILE, WORK_DIR
from agent.task.errors import (
    Detached,
    Fenced,
    LimitError,
    Stopped,
    TaskError,
    is_fencing,
    is_fencing_artifact,
)
from agent.task.finish import report_finish
from agent.task.journal import append_state
from agent.task.output import OutputKeeper
from agent.task.shipping import OutputShipper
from agent.task.supervisor import Supervisor, check_executable, describe_exit, read_exit_status
from agent.threads import UNTIL_STOPPED, PoolWork
from agent.workers import Worker
from fleetwire.assignment import system_uid_problem

log = logging.getLogger("agent.runner")

READER_JOIN_SECONDS = (
    5.0  # a process that escaped the group may hold the pipes; do not wait on it for ever
)
RENDEZVOUS_POLL_SECONDS = 30
# The finish report waits this long for the last batch of output (the count of every line and the
# newest texts), so that the output of a short task is all readable when its end is: a long one's
# middle follows in its chunks, after the report.
FINAL_BATCH_SECONDS = 2.0


def wrapped_exit(code):
    """A Popen returncode, or the status a wrapper recorded: the shell's 128+N for a task killed by
    signal N reads as that signal (-N), as if the task were the process reaped."""
    if code is not None and 128 < code < 128 + 65:
        return 128 - code
    return code


def _utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Task:
    """One assignment on this host, from preparation to the acknowledged finish report."""

    # The start is reported once the process has run this long: a task that ends sooner reports
    # its start with its finish, one call instead of two (short tasks are most of what fleetd hears
    # under load; on a busy host a no-op task often takes over 50 ms from spawn to its exit being
    # seen). Either report says how long ago the process started, so fleetd's started_at is not
    # late by the delay; the job shows `running` that much later at most.
    START_REPORT_DELAY_SECONDS = 0.25

    def __init__(self, runner, assignment, wire=None, adopted=None):
        self.runner = runner
        self.assignment = assignment
        self.wire = (
            dict(wire) if wire is not None else None
        )  # the assignment as fleetd sent it (journaled)
        self.adopted = adopted  # the journal record of the task, found again after an agent restart
        self.label = f"{assignment.task_id}/{assignment.epoch}"
        self.dir = os.path.join(runner.tasks_dir, f"{assignment.task_id}.{assignment.epoch}")
        self.state_path = os.path.join(self.dir, STATE_FILE)
        self.status_path = os.path.join(self.dir, STATUS_FILE)
        self.workdir = os.path.join(self.dir, WORK_DIR)
        self.output = None  # an OutputShipper: its output kept in files, shipped to fleetd
        self._ended = None  # the outcome of a process that ended while the agent was not running
        self._vanished = False  # ... which recorded no exit status: the task is lost
        self.process = self._new_supervisor()
        self.process.identity = TaskKey(assignment.task_id, assignment.epoch)
        self._lock = threading.Lock()  # taken before process.lock, never after it
        self._stop = None  # (outcome, reason) once a stop is asked for
        self._lost = (
            False  # the stop is the agent's doing (it stops), not the task's nor the user's
        )
        self._agent_stopping = False  # ... because the agent is shutting down (stop, upgrade)
        self._fenced = None  # why, once fleetd fenced the task off
        self._detached = False  # the agent stops and leaves the process running (an instance's)
        self._start_reported = False
        self._keep_state = False
        self.record = {}
        self._start_with_finish = False  # the process ended before its start was reported
        self.task_limits = None  # what agent.task.limits set up (env, cgroup), once prepared
        self.run_as = None  # whom the task runs as (agent.isolation.RunAs), once resolved
        self.worker = Worker(
            task_id=assignment.task_id,
            epoch=assignment.epoch,
            job_id=assignment.job_id,
            rank=assignment.rank,
            state="starting",
            priority_class=assignment.priority_class,
            bid=assignment.bid,
            gpus=[dict(g) for g in assignment.gpus],
            stop=self.cancel,
            limits={
                "max_runtime_seconds": assignment.max_runtime_seconds,
                "kill_grace_seconds": runner.kill_grace_seconds,
                "isolation": assignment.isolation,
            },
            list_pids=self.pids,
        )
        self.thread = PoolWork(
            self._main, name=f"task-{self.label}"
        )  # run on one of the runner's threads

    @property
    def epoch(self):
        """The assignment's lease epoch."""
        return self.assignment.epoch

    @property
    def proc(self):
        """The leader's Popen, once started."""
        return self.process.proc

    # Called from other threads.

    def key(self):
        """The TaskKey that finds this task's processes (group and session while the leader is not
        reaped)."""
        return self.process.key()

    def pids(self):
        """The live processes of the task: its group and session, its cgroup, its FLEET_TASK_*
        environment."""
        return self.process.pids()

    def cancel(self, reason, outcome="cancelled", lost=False, grace=None, agent_stopping=False):
        """Stop the task: SIGTERM to all its processes now, SIGKILL after the grace.

        `lost`: the agent itself is stopping; fleetd is told so (finish `lost: true`), so that the
        job is retried as for a lost node rather than failed. `agent_stopping` (with `lost`): it
        stops because it is shutting down (finish `agent_stopping: true`): fleetd requeues the job
        without using an attempt. `grace` overrides tasks.kill_grace_seconds (the limits watchdog
        uses limits.kill_grace_seconds).
        """
        grace = self.runner.kill_grace_seconds if grace is None else grace
        with self._lock:
            if self._stop is None:
                self._stop = (outcome, reason)
                self._lost = lost
                self._agent_stopping = lost and agent_stopping
                log.info("task %s: stopping (%s)", self.label, reason)
                with self.process.lock:
                    self.process.terminate(grace)
        self.process.wake.set()

    def fence(self, why, keep_state=False):
        """fleetd no longer leases the task here: SIGKILL its processes at once; no report follows.

        With `keep_state` (the agent is stopping, not fenced by fleetd) the state file stays, so
        that the next start reports the task.
        """
        with self._lock:
            if self._fenced is None:
                self._fenced = str(why)
                self._keep_state = keep_state
                with self.process.lock:
                    self.process.kill()
        self.process.wake.set()

    def detach(self):
        """Leave the process running as the agent stops; False: a task is stopped instead (see
        InstanceTask)."""
        return False

    def _new_supervisor(self):
        return Supervisor(
            self.label,
            self.runner.threads,
            self.runner.limits.cgroups,
            on_reaped=self._reaped,
            exits=self.runner.exits,
        )

    def _reaped(self):
        self.worker.pgid = None  # the pid may be reused from now on

    # The supervisor thread.

    def start(self):
        """Run the task in its supervisor thread."""
        self.runner.threads.submit(self.thread)

    def _main(self):
        client = self.runner.checkout_client()
        keep_dir = left_running = False
        try:
            self.runner.workers.add(self.worker)
            keep_dir = not self._run_and_report(client)
        except Detached:
            log.info(
                "task %s: left running as the agent stops; the next start takes it back", self.label
            )
            keep_dir = left_running = True
            self._leave_running()
        except Fenced as exc:
            if self._keep_state:
                log.warning("task %s: abandoned (%s); killed its process group", self.label, exc)
                keep_dir = True
            else:
                log.warning(
                    "task %s: fleetd no longer leases it to this node (%s); killed its process "
                    "group and forgot it",
                    self.label,
                    exc,
                )
        except Exception:  # a bug here must not leave the process running unsupervised
            log.exception("task %s: supervisor failed; killing the task", self.label)
            keep_dir = True
        finally:
            self._clean_up(keep_dir, left_running)
            self.runner.checkin_client(client)

    def _run_and_report(self, client):
        """Run the task, record and report its outcome; True once fleetd has the report."""
        try:
            result = self._run_to_result(client)
        except (Fenced, Detached):
            raise
        except (
            Exception
        ) as exc:  # a host problem (disk full) or a bug: the task fails, and fleetd hears why
            log.exception("task %s: the agent could not run it", self.label)
            self.process.kill_and_reap()
            result = ("failed", None, f"fleet-agent could not run the task: {exc}")
        self.worker.state = "finishing"
        lost = (
            self._lost and self._stop is not None and result[0] == self._stop[0]
        ) or self._vanished
        stopping = lost and self._agent_stopping
        try:
            self._save(
                state="finished",
                outcome=result[0],
                exit_code=result[1],
                reason=result[2],
                lost=lost,
                agent_stopping=stopping,
            )
        except OSError as exc:
            log.error(
                "task %s: cannot record its outcome in %s: %s", self.label, self.state_path, exc
            )
        output = self._finish_output()
        reported = report_finish(
            client,
            self.runner,
            self.assignment.task_id,
            self.assignment.epoch,
            result,
            self.label,
            lost=lost,
            agent_stopping=stopping,
            pid=self._reported_pid() if self._start_with_finish else None,
            started_monotonic=self.process.started_monotonic,
            extra=self._finish_extra(),
            output=output,
        )
        if reported and self.output is not None and self.output.keeper.pending():
            try:  # a restart before the output is shipped ships it, and reports nothing again
                self._save(finish_reported=True)
            except OSError as exc:
                log.warning("task %s: cannot record its finish report: %s", self.label, exc)
        return reported

    def _reported_pid(self):
        """The leader's pid for a start report carried by the finish."""
        if self.proc is not None:
            return self.proc.pid
        return self.record.get("pid")

    def _finish_extra(self):
        """More fields of the finish report (an instance's)."""
        return None

    def _leave_running(self):
        """The agent stops and the process goes on: what the task still owes before it lets go (an
        instance's)."""

    def _clean_up(self, keep_dir, left_running=False):
        contained = False
        if not left_running:
            self.process.kill_and_reap()
            # A task directory is reused only when the kernel vouches that none of the task's
            # processes is left (its cgroup is gone): one left could write into the next task's.
            contained = self._release_limits()
        if self.output is not None and keep_dir:
            self.output.stop()  # the next start ships the rest
        elif self.output is not None:
            self.output.finish()  # what fleetd still takes of a task it fenced off is shipped too
        if self.runner.workers.get(self.assignment.task_id) is self.worker:
            self.runner.workers.remove(self.assignment.task_id)
        self.runner.forget(self)
        if not keep_dir:
            remove = functools.partial(self.runner.dirs.remove, self.dir, reuse=contained)
            if self.output is None:
                remove()
            else:  # once its output is shipped or given up, after the finish report
                self.output.when_done(remove)

    def _check(self):
        """Raise Fenced or Stopped when the task must not go on preparing."""
        if self._fenced:
            raise Fenced(self._fenced)
        if self._stop is not None:
            raise Stopped(*self._stop)

    def _run_to_result(self, client):
        """(outcome, exit_code, reason) of the task: run, or taken back after an agent restart."""
        if self.adopted is not None:
            try:
                self._take_back(self.adopted)
            except TaskError as exc:
                log.warning("task %s: cannot take it back: %s; stopping it", self.label, exc)
                with (
                    self.process.lock
                ):  # watched, so that the clean-up kills it: nothing runs unsupervised
                    if self.process.proc is None:
                        self.process.adopt(
                            self.adopted["pid"], self.adopted.get("start_ticks"), self.status_path
                        )
                return "failed", None, str(exc)
            return self._supervise(client)
        try:
            run_as = self._resolve_user()
            self._refuse_system_user(run_as)
            self.runner.isolation.check_reachable(run_as, self.runner.state_dir)
            self.runner.dirs.make(self.dir, (run_as.uid, run_as.gid))
            task_limits = (
                self._prepare_limits()
            )  # the cgroup exists before the state file that names it
            self._save(
                state="starting",
                created_ticks=uptime_ticks() - 1,
                boot_id=read_boot_id(),
                cgroup=task_limits.cgroup,
                run_as=run_as.describe(),
            )
            cwd = self.workdir
            if self.assignment.workdir:
                cwd = inside(self.workdir, self.assignment.workdir, "workdir", allow_root=True)
                os.makedirs(cwd, exist_ok=True)
                self.runner.isolation.own_below(run_as, self.workdir, cwd)
            self._download_artifacts(client, cwd)
            addr, port = self._rendezvous(client)
            self._spawn(cwd, addr, port)
        except TaskError as exc:
            log.warning("task %s: cannot run: %s", self.label, exc)
            return "failed", None, str(exc)
        except Stopped as stopped:
            return stopped.outcome, None, stopped.reason
        return self._supervise(client)

    def _refuse_system_user(self, run_as):
        """TaskError before a launch as a token's unix_user (`run_as`, the resolved user) that is a
        system account on this node (below uid 1000, or nobody), unless fleetd's operator allowed
        that user (run_as.allow_system_user). A task taken back after a restart is not asked again:
        its process runs already."""
        if run_as.source == "unix_user" and not (self.assignment.run_as or {}).get(
            "allow_system_user"
        ):
            problem = system_uid_problem(run_as.user, run_as.uid)
            if problem:
                raise TaskError(problem)

    def _resolve_user(self):
        """Whom the task runs as, also kept as `run_as` (TaskError when this node cannot run it
        so)."""
        run_as = self.run_as = self.runner.isolation.resolve(self.assignment.run_as)
        self.worker.run_as = run_as.describe()
        return run_as

    def _call(self, what, fn, deadline, fencing=is_fencing):
        """fn() retried while fleetd is unreachable, until `deadline` (monotonic); fencing raises
        Fenced."""
        for attempt in range(1, 1_000_000):
            self._check()
            try:
                return fn()
            except Unreachable as exc:
                if time.monotonic() >= deadline or self.runner.closing.is_set():
                    raise TaskError(f"{what}: {exc}") from None
                delay = min(
                    backoff_delay(attempt, self.runner.backoff_max_seconds),
                    max(0.0, deadline - time.monotonic()),
                )
                self.process.wake.wait(delay)
                self.process.wake.clear()
            except FleetdError as exc:
                if fencing(exc):
                    raise Fenced(str(exc)) from None
                raise TaskError(f"{what}: {exc}") from None
        raise TaskError(f"{what}: gave up")

    def _prep_deadline(self, limit):
        max_runtime = self.assignment.max_runtime_seconds
        bound = limit if max_runtime is None else min(limit, max_runtime)
        return time.monotonic() + bound

    def _download_artifacts(self, client, cwd):
        deadline = self._prep_deadline(self.runner.rendezvous_timeout_seconds)
        for item in self.assignment.artifacts:
            dest = inside(cwd, item["path"], "artifact path")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.isdir(dest):
                raise TaskError(f"artifact path {item['path']!r} is a directory")
            try:
                size = self._call(
                    f"downloading artifact {item['sha256']}",
                    functools.partial(client.download_artifact, item["sha256"], dest),
                    deadline,
                    fencing=is_fencing_artifact,
                )
                self.runner.isolation.own_below(self.run_as, self.workdir, dest)
            except DigestMismatch as exc:
                raise TaskError(str(exc)) from None
            except OSError as exc:
                raise TaskError(
                    f"cannot write artifact {item['path']!r}: {exc.strerror or exc}"
                ) from None
            log.info(
                "task %s: artifact %s (%d bytes) verified at %s",
                self.label,
                item["sha256"][:12],
                size,
                item["path"],
            )

    def _rendezvous(self, client):
        """(master address, master port): rank 0's, published by it or learnt from fleetd."""
        addr = self.runner.address
        if self.assignment.num_nodes <= 1:
            return addr, free_port(addr)
        started = time.monotonic()
        deadline = self._prep_deadline(self.runner.rendezvous_timeout_seconds)
        if self.assignment.rank == 0:
            port = free_port(addr)
            publish = functools.partial(
                client.publish_rendezvous,
                self.assignment.task_id,
                self.assignment.epoch,
                addr,
                port,
            )
            self._call("publishing the rendezvous", publish, deadline)
            log.info(
                "task %s: rank 0 of %d published rendezvous %s:%d; waiting for the other ranks",
                self.label,
                self.assignment.num_nodes,
                addr,
                port,
            )
        # Every rank, rank 0 too, waits until all ranks of the attempt have arrived: no rank starts
        # its command while a peer is unplaced or still preparing (fleetd answers once all are
        # here).
        for _ in range(1_000_000):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wait = max(1, min(RENDEZVOUS_POLL_SECONDS, int(remaining)))
            found = self._call(
                "waiting for the rendezvous",
                functools.partial(client.wait_rendezvous, self.assignment.task_id, wait),
                deadline,
            )
            if found:
                log.info(
                    "task %s: rank %d: all %d ranks arrived; rendezvous %s:%d",
                    self.label,
                    self.assignment.rank,
                    self.assignment.num_nodes,
                    *found,
                )
                return found
        raise TaskError(
            f"the {self.assignment.num_nodes} ranks did not all arrive at the rendezvous within "
            f"{deadline - started:.0f}s (rank 0 publishes its address, every rank waits for all)"
        )

    def _prepare_limits(self):
        """Set up the task's limits (MPS, cgroup); TaskError when they cannot be met here."""
        try:
            self.task_limits = self.runner.limits.prepare(self.assignment, self.run_as)
        except LimitError as exc:
            raise TaskError(str(exc)) from None
        except OSError as exc:
            raise TaskError(f"cannot set up the task's limits: {exc.strerror or exc}") from None
        limits = dict(self.worker.limits)
        limits.update(self.task_limits.describe())
        self.worker.limits = limits
        self.worker.cgroup = self.task_limits.cgroup_rel
        self.process.identity = TaskKey(
            self.assignment.task_id,
            self.assignment.epoch,
            None,
            self.task_limits.cgroup_rel,
            self.task_limits.cgroup,
            self.run_as.uid if self.run_as is not None else None,
        )
        return self.task_limits

    def _prepared_limits(self):
        """The task's limits: _prepare_limits set them before anything that starts a process of the
        task."""
        assert self.task_limits is not None, f"task {self.label}: its limits are not prepared"
        return self.task_limits

    def _spawn(self, cwd, addr, port):
        env, injected = task_env(self.assignment, addr, port, extra=self._prepared_limits().env)
        env = self.runner.isolation.env(self.run_as, env, self.workdir)
        check_executable(self.assignment.command[0], cwd, env.get("PATH", DEFAULT_PATH))
        # The cgroup first, then the root shell that records the exit status, then the task's own
        # uid.
        command = self.runner.isolation.wrap(self.run_as, self.assignment.command)
        argv = self.runner.limits.command(self.task_limits, command, self.status_path)
        # Files, not pipes: the task outlives an agent that dies.
        stdout, stderr = self._make_output().keeper.open_output()
        try:
            pid, start_ticks = self._launch(argv, cwd, env, output=(stdout, stderr))
        finally:
            os.close(stdout)
            os.close(stderr)
        self.worker.env = injected
        log.info(
            "task %s: started pid %d: %s", self.label, pid, " ".join(self.assignment.command)[:200]
        )
        self._save(
            state="running",
            pid=pid,
            pgid=self.process.pgid,
            start_ticks=start_ticks,
            started_at=self.worker.started_at,
            assignment=self.wire,
            cwd=cwd,
        )

    def _make_output(self):
        """The task's OutputKeeper (resumed from its state file after a restart) and shipper,
        read at every tick of the runner's ticker."""
        settings = self.runner.output_settings
        keeper = OutputKeeper(
            self.dir, self.epoch, self.assignment.output_cap_bytes, settings, self.label
        )
        self.output = OutputShipper(
            keeper, self.runner, self.assignment.task_id, settings, self.fence, self.label
        )
        self.output.start(self.runner.tails)
        return self.output

    def _take_back(self, record):
        """Supervise again the task a journal record describes (the agent restarted while it ran),
        its process alive (watched again) or not (its recorded exit status is its outcome)."""
        self.record = dict(record)
        self._resolve_user()
        self._prepare_limits()  # the same cgroup: its name is the task's
        self._prepare_taken_back(record)
        self._start_reported = bool(record.get("start_reported"))
        self._make_output()
        self.worker.state = "running"
        self.worker.started_at = record.get("started_at") or ""
        with self._lock, self.process.lock:
            alive = self.process.adopt(record["pid"], record.get("start_ticks"), self.status_path)
            if alive:
                self.worker.pgid, self.worker.pids = self.process.pgid, [record["pid"]]
        self._taken_back(record, alive)
        if alive:
            log.info(
                "task %s: took back pid %d, which ran on while the agent was down",
                self.label,
                record["pid"],
            )
            return
        self._start_with_finish = not self._start_reported
        self._ended = self._outcome(read_exit_status(self.status_path))
        log.info("task %s: its process ended while the agent was down: %s", self.label, self._ended)

    def _prepare_taken_back(self, record):
        """What a task taken back needs before its process is watched again (an instance's volume,
        ports, env)."""

    def _taken_back(self, record, alive):
        """The process of a task taken back is watched again (`alive`), or it had ended."""

    def _launch(self, argv, cwd, env, on_output=None, output=None, what=None):
        """Start the process (unless stopped meanwhile) -> (pid, start ticks); TaskError when it
        cannot start."""
        with self._lock, self.process.lock:
            self._check()
            try:
                self.process.spawn(argv, cwd, env, on_output, output)
            except OSError as exc:
                raise TaskError(
                    f"cannot start {what or self.assignment.command[0]!r}: {exc.strerror or exc}"
                ) from None
            self.worker.pgid = self.process.pgid
        self.worker.pids = [self.proc.pid]
        self.worker.started_at = _utc_now()
        self.worker.state = "running"
        return self.proc.pid, self.process.start_ticks()

    def _supervise(self, client):
        """Report the start, enforce max_runtime_seconds, wait for the exit; (outcome, exit_code,
        reason)."""
        ended, self._ended = self._ended, None
        if ended is not None:  # taken back after it ended
            return ended
        process = self.process
        with self._lock:
            if self._stop is not None:  # cancelled between the spawn and now
                with process.lock:
                    process.terminate(self.runner.kill_grace_seconds)
        attempts = 0
        next_report = process.started_monotonic + self.START_REPORT_DELAY_SECONDS
        runtime_deadline = None
        if self.assignment.max_runtime_seconds is not None:
            runtime_deadline = process.started_monotonic + self.assignment.max_runtime_seconds
        for _ in range(UNTIL_STOPPED):
            exited = process.exited.is_set()
            if self._fenced:
                raise Fenced(self._fenced)
            if self._detached:
                raise Detached()
            now = time.monotonic()
            if not self._start_reported and exited:
                # Ended before its start was reported: the finish report carries the start (one
                # call instead of two, which for short tasks is most of what fleetd hears).
                self._start_with_finish = self._start_reported = True
            if not self._start_reported and now >= next_report:
                self._start_reported, attempts = self._report_start(client, attempts)
                next_report = now + backoff_delay(attempts, self.runner.backoff_max_seconds)
            if exited:
                break
            if runtime_deadline is not None and now >= runtime_deadline and self._stop is None:
                self.cancel(
                    f"exceeded max_runtime_seconds={self.assignment.max_runtime_seconds:g}",
                    outcome="failed",
                )
            with process.lock:
                kill_at = process.kill_if_due(now)
            timeout = 1.0
            for moment in (
                kill_at,
                runtime_deadline if self._stop is None else None,
                None if self._start_reported else next_report,
            ):
                if moment is not None:
                    timeout = min(timeout, max(0.0, moment - now))
            process.wake.wait(timeout)
            process.wake.clear()
        if self._fenced:
            raise Fenced(self._fenced)
        process.end_group(self.runner.kill_grace_seconds, lambda: bool(self._fenced))
        code = process.reap()
        return self._outcome(code)

    def _outcome(self, code):
        """(outcome, exit_code, reason) for the leader's exit status (None: it ended while the agent
        was down and recorded none)."""
        if code is None:
            if self._stop is not None:
                return self._stop[0], None, self._stop[1]
            self._vanished = True
            return (
                "failed",
                None,
                (
                    "lost: the process ended while fleet-agent was not running and recorded no "
                    "exit status"
                ),
            )
        code = wrapped_exit(code)
        exit_code, how = describe_exit(code)
        if self._stop is not None:
            outcome, reason = self._stop
            return outcome, exit_code, f"{reason} ({how})"
        if code == 0:
            return "succeeded", 0, None
        task_limits = self.task_limits
        oom = self.runner.limits.cgroups.oom_kills(task_limits.cgroup if task_limits else None)
        if oom and task_limits:  # oom_kills(None) is 0
            record = task_limits.host.get("memory_bytes", {})
            limit = record.get("limit")
            default = (
                " (the fleet's task_memory_default_bytes: the spec sets no memory_bytes)"
                if record.get("source")
                else ""
            )
            return (
                "failed",
                exit_code,
                (
                    f"host_memory_limit_exceeded: memory_bytes {limit}{default}, the kernel "
                    f"OOM-killed {oom} process(es) of the task ({how})"
                ),
            )
        return "failed", exit_code, how

    def _report_start(self, client, attempts):
        """One try at POST start -> (reported or not worth retrying, attempts so far)."""
        ago = None
        if self.runner.start_says_when and self.process.started_monotonic is not None:
            ago = max(0.0, time.monotonic() - self.process.started_monotonic)
        try:
            client.task_start(
                self.assignment.task_id,
                self.assignment.epoch,
                self.proc.pid,
                extra=self._start_extra(),
                started_seconds_ago=ago,
            )
            self._save(
                start_reported=True
            )  # a restarted agent that takes the task back does not report it again
            return True, attempts
        except Unreachable as exc:
            log.warning(
                "task %s: start not reported yet (%s); the task keeps running", self.label, exc
            )
            return False, attempts + 1
        except FleetdError as exc:
            if attempts and isinstance(exc, Conflict) and exc.details.get("state") == "running":
                return True, attempts  # an earlier attempt got through; its answer did not
            if is_fencing(exc):
                raise Fenced(str(exc)) from None
            if ago is not None and exc.status == 400:
                log.info(
                    "fleetd does not take started_seconds_ago in a start report (%s); reporting "
                    "starts without it",
                    exc,
                )
                self.runner.start_says_when = False
                return self._report_start(client, attempts)
            log.error("task %s: fleetd refused the start report: %s", self.label, exc)
            return True, attempts

    def _start_extra(self):
        """More fields of the start report (an instance's ports)."""
        return None

    def _release_limits(self):
        """Whatever is left of the task outside its group is killed; its cgroup removed. True
        when the cgroup is gone, so that no process of the task is left."""
        if self.task_limits is None:
            return False
        try:
            self.process.kill_leftovers()
            return self.runner.limits.release(self.task_limits)
        except OSError as exc:
            log.warning("task %s: releasing its limits: %s", self.label, exc)
            return False

    def _finish_output(self):
        """Read the output files to their end and seal the last chunk: the OutputSummary for the
        finish report (None: no output). Batches and uploads go on in the background: the report
        does not wait for them."""
        if self.output is None:
            return None
        if self.process.watcher is not None:
            self.process.watcher.join(READER_JOIN_SECONDS)
        summary = self.output.finish()
        if summary is not None:
            self.output.flush_batch(FINAL_BATCH_SECONDS)
        if self._fenced:
            raise Fenced(self._fenced)
        return summary

    def _save(self, **changes):
        self.record.update(changes)
        assignment = self.assignment
        self.record.update(
            task_id=assignment.task_id,
            job_id=assignment.job_id,
            epoch=assignment.epoch,
            rank=assignment.rank,
        )
        append_state(self.state_path, self.record)
