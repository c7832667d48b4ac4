"""An instance run on this host: a task that restarts its process per a policy, outlives the agent,
and keeps a volume and host ports from one run to the next (the assignment's `instance`).

On top of a Task (agent/task/task.py):

- the volume ``<state_dir>/volumes/<instance id>/`` (agent/task/volumes.py) and one host port per
  declared port (agent/ports.py), given to the process as FLEET_VOLUME and FLEET_PORT_<port>, with
  FLEET_INSTANCE_ID;
- the command, or the image through the container runtime (agent/task/container.py), under a shell
  that writes the exit status into the task directory: a process found again after an agent
  restart is no child of the agent, whose exit status the agent could not wait for;
- the output in files of the task directory, kept and shipped from there (agent/task/output.py), so
  that the process never writes into a pipe whose reader is gone;
- the restart policy (`always`, `on-failure`, `never`), 1 s before a restart, doubling to 60 s,
  back to 1 s after a run of 60 s; a stop never restarts; each exit that is restarted is reported
  (POST .../restart, the instance reads `restarting`) and each restart's start too; after
  `instances.restart_limit` restarts in a row whose process each ran under 60 s the policy gives up
  and the run fails;
- on the agent's stop the process is left running (`detach`); `Runner.recover` hands each run it
  finds in a journal back here (`adopted`): a live process is watched again (a pidfd), a dead one
  counts as an exit (its status from the file, else a failure) for the policy to decide on;
- the figures of the heartbeat and the idle stop (agent/task/monitor.py).
"""

import logging
import os
import re
import time

from agent.client import FleetdError, Unreachable
from agent.ports import NoFreePort, port_states
from agent.procfs import uptime_ticks, wait_gone
from agent.task.assignment import DEFAULT_PATH, task_env
from agent.task.container import (
    READY,
    ContainerError,
    cdi_has_nvidia,
    container_name,
    remove_env_file,
    write_env_file,
)
from agent.task.errors import Detached, Fenced, Stopped, TaskError, is_fencing
from agent.task.journal import compact_state
from agent.task.monitor import CLOCK_TICKS, InstanceMonitor
from agent.task.supervisor import check_executable, read_exit_status
from agent.task.task import Task
from agent.task.volumes import tree_bytes
from fleetwire.assignment import visible_device

log = logging.getLogger("agent.runner")

ENV_FILE = (
    "container.env"  # a container's variables, for its runtime's `run` to read; removed once it has
)
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
BACKOFF_RESET_SECONDS = (
    60.0  # a process that ran this long is restarted after the first back-off again
)
JOURNAL_COMPACT_BYTES = 64 * 1024  # a restarting instance's journal starts again past this
MAX_RUNS = 1_000_000_000
LEAVE_LOGS_SECONDS = (
    5.0  # how long an agent that stops spends shipping a left instance's last lines
)
LEFTOVERS_GONE_SECONDS = 10.0  # how long a run's end waits for its killed leftovers to be gone
SIGNAL_RE = re.compile(r"killed by (SIG[A-Z0-9+]+)")  # how describe_exit words a signal's end


def restarts_after(policy, outcome):
    """Whether the restart policy restarts a process whose run ended with `outcome`."""
    return policy == "always" or (policy == "on-failure" and outcome != "succeeded")


class Backoff:
    """The wait before each restart: 1 s, doubling to 60 s; 1 s again after a run of 60 s. With a
    `limit`, none after that many restarts in a row each after a run under 60 s: the policy gives
    up."""

    def __init__(self, limit=0):
        self.failures = 0
        self.limit = limit

    def next(self, ran_seconds):
        """The wait before restarting a process that ran `ran_seconds`; None once the policy gives
        up."""
        if ran_seconds >= BACKOFF_RESET_SECONDS:
            self.failures = 0
        if self.limit and self.failures >= self.limit:
            return None
        delay = min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** min(self.failures, 16))
        self.failures += 1
        return delay


class InstanceTask(Task):
    """A Task whose assignment has an `instance`; `wire` is the assignment as fleetd sent it."""

    # An instance is long-lived and its URL is routed once it runs: its start is told at once.
    START_REPORT_DELAY_SECONDS = 0.05

    def __init__(self, runner, assignment, wire, adopted=None):
        super().__init__(runner, assignment, wire, adopted)
        self.spec = assignment.instance
        self.container = container_name(self.spec.id, assignment.epoch) if self.spec.image else None
        self.env_file = os.path.join(
            self.dir, ENV_FILE
        )  # in the task directory, root's: never the work dir
        self._env_file_run = (
            None  # the run (a count) whose env file is on disk, until it is removed
        )
        self.ports = {}  # declared port -> host port
        self.volume = None
        self.restarts = 0
        self.idle = False
        self.backoff = Backoff(runner.restart_limit)
        self.monitor = InstanceMonitor(self)
        self._env = None
        self._cwd = None
        self._start_ticks = None
        self._ran = False  # a process was started or found again: an agent stop leaves it running
        self._container_stopping = False
        self._container_removed = False  # after the last run, before the finish report
        # The worker's `instance` entry (the local API's and the heartbeat's), kept up to date from
        # here.
        self._entry: dict = {
            "id": self.spec.id,
            "name": self.spec.name,
            "restart": self.spec.restart,
            "image": self.spec.image,
            "ports": [],
            "restarts": 0,
            "volume": None,
        }
        self.worker.instance = self._entry
        if adopted is not None:
            self.worker.state = "running"  # as fleetd knows it: it ran before the agent restarted

    # Called from other threads.

    def cancel(self, reason, outcome="cancelled", lost=False, grace=None, agent_stopping=False):
        """Task.cancel, and a container is stopped by name as well (its client may not pass SIGTERM
        on)."""
        super().cancel(reason, outcome, lost, grace, agent_stopping)
        self._stop_container(self.runner.kill_grace_seconds if grace is None else grace)

    def fence(self, why, keep_state=False):
        """Task.fence, and a container is removed by name."""
        super().fence(why, keep_state)
        self._stop_container(0)

    def _stop_container(self, grace):
        with self._lock:
            if (
                not self.container
                or not self._ran
                or self._container_stopping
                or self.runner.containers is None
            ):
                return
            self._container_stopping = True
        self.runner.background(
            f"stop-{self.container}", self.runner.containers.stop, self.container, grace
        )

    def detach(self):
        """The agent stops: leave the process running (True), unless none was started yet or it is
        being stopped (False: it is stopped as a task is)."""
        with self._lock:
            if (not self._ran and self.adopted is None) or self._stop is not None or self._fenced:
                return False
            self._detached = True
        self.process.wake.set()
        return True

    def stop_idle(self, reason):
        """The idle watch fired: stop the instance; its finish says `idle: true`."""
        self.cancel(reason)
        with self._lock:
            self.idle = self._stop is not None and self._stop[1] == reason

    def running(self):
        """True while a process of the instance runs (not between runs)."""
        process = self.process
        return process.proc is not None and not process.exited.is_set()

    def uptime_seconds(self):
        """How long the current process has run (0 between runs)."""
        if not self.running() or self._start_ticks is None:
            return 0
        try:
            return max(0.0, round((uptime_ticks() - self._start_ticks) / CLOCK_TICKS, 1))
        except OSError:
            return 0

    def check_scratch(self):
        """Bytes its scratch space holds now (its working directory, and a container's own writable
        layer), or None when that cannot be read; a run holding more than its `scratch_bytes` is
        stopped, failed, with the reason."""
        used = tree_bytes(self.workdir, f"the scratch space of instance {self.spec.id}")
        if self.container and self.runner.containers is not None:
            layer = self.runner.containers.writable_bytes(self.container)
            if layer is not None:
                used = (used or 0) + layer
        limit = self.spec.scratch_bytes
        if used is not None and limit and used > limit:
            self.cancel(
                f"scratch space over its size: it holds {used} bytes, more than its {limit} "
                "(scratch_bytes); stopped by fleet-agent",
                outcome="failed",
            )
        return used

    def container_stats(self):
        """(cpu percent, memory percent) of the container, or None."""
        runtime = self.runner.containers
        return runtime.stats(self.container) if runtime is not None else None

    def check_ports(self):
        """{host port: state} of the instance's host ports now (agent/ports.py port_states), also
        shown in the local API's worker record: whether each listener is this instance's (its
        processes, or for a container its runtime's forwarder for it)."""
        if not self.ports:
            return {}
        runtime = self.runner.containers
        if self.container:
            state = runtime.state(self.container) if runtime is not None and self._ran else None
            running = state is not None and (
                state.get("Running") is True or state.get("Status") == "running"
            )
            owners = (
                [*runtime.forwarder_pids(self.container, state), state.get("Pid")]
                if state and running
                else []
            )
            states = port_states(
                self.ports.values(),
                [pid for pid in owners if isinstance(pid, int) and pid > 0],
                published=running,
            )
        else:
            states = port_states(self.ports.values(), self.pids())
        self.monitor.port_states = states
        self._entry["ports"] = [
            dict(port, state=states.get(port["host_port"])) for port in self._wire_ports()
        ]
        return states

    def settle_env_file(self):
        """Remove the run's env file once its container exists: the runtime's client read it before
        it made the container (called by the monitor until it is gone; the run's end removes it
        too)."""
        written = self._env_file_run
        runtime = self.runner.containers
        if written is None or runtime is None or runtime.state(self.container) is None:
            return
        with self._lock:
            if (
                self._env_file_run != written
            ):  # a restart wrote another since (the old container was gone)
                return
            self._env_file_run = None
        remove_env_file(self.env_file)

    def _drop_env_file(self):
        with self._lock:
            self._env_file_run = None
        remove_env_file(self.env_file)

    def _write_env_file(self):
        env = {
            **self.assignment.env,
            **self.worker.env,
        }  # the spec's, the injected over it: as for a process
        with self._lock:
            self._env_file_run = self.restarts
        try:
            write_env_file(self.env_file, env)
        except (OSError, ValueError) as exc:
            raise TaskError(f"cannot pass the variables to the container: {exc}") from None

    def report(self):
        """The heartbeat's `instances` entry; None before its process started (or was taken
        back)."""
        return self.monitor.figures() if self._ran else None

    # The first run.

    def _spawn(self, cwd, addr, port):
        self._prepare_instance()
        self._cwd = cwd
        self._env = self._instance_env(addr, port)
        self._make_output()
        self._save(
            assignment=self.wire,
            instance=self.spec.id,
            ports={str(p): hp for p, hp in self.ports.items()},
            cwd=cwd,
            master_addr=addr,
            master_port=port,
            restarts=0,
        )
        self._run_once()

    def _volume_mode(self):
        # The task's user's alone (a container runs as that user too); others pass the parent (0711)
        # only.
        return 0o700

    def _ensure_volume(self):
        """The volume's directory, its user's: only the top is given (a resumed volume's files are
        the same user's already, as fleetd gives an owner the same uid on every run)."""
        volume = self.runner.volumes.ensure(self.spec.id, self._volume_mode())
        self.runner.isolation.own(self.run_as, volume)
        return volume

    def _prepare_instance(self):
        try:
            self.volume = self._ensure_volume()
            no_room = self.runner.volumes.room_for(self.spec.id, self.spec.volume_bytes)
        except (OSError, ValueError) as exc:
            raise TaskError(f"cannot make the instance's volume: {exc}") from None
        if no_room:
            raise TaskError(no_room)
        try:
            self.ports = self.runner.ports.allocate(
                self.spec.id, [port for port, _ in self.spec.ports]
            )
        except NoFreePort as exc:
            raise TaskError(str(exc)) from None
        except OSError as exc:
            raise TaskError(f"cannot record the instance's host ports: {exc}") from None
        self._entry.update(ports=self._wire_ports(), volume=self.volume)

    def _wire_ports(self):
        return [
            {"port": port, "host_port": self.ports[port], "protocol": protocol}
            for port, protocol in self.spec.ports
            if port in self.ports
        ]

    def _instance_env(self, addr, port):
        extra = dict(self._prepared_limits().env)
        extra["FLEET_INSTANCE_ID"] = self.spec.id
        extra["FLEET_VOLUME"] = self.spec.volume_mount_path if self.container else self.volume
        extra.update({f"FLEET_PORT_{p}": str(hp) for p, hp in self.ports.items()})
        env, injected = task_env(self.assignment, addr, port, extra=extra)
        self.worker.env = injected
        return self.runner.isolation.env(self.run_as, env, self.workdir)

    def _argv(self):
        """What to spawn for one run: the command (or the container's run) under the status
        wrapper."""
        # Each run comes after the user was resolved and the env made (_spawn, _prepare_taken_back).
        run_as, env = self.run_as, self._env
        assert run_as is not None and env is not None
        if self.container:
            runtime = self.runner.containers
            if runtime is None:
                raise TaskError(
                    f"cannot run image {self.spec.image}: no container runtime on this host "
                    "(containers.command: neither podman nor docker found, or none)"
                )
            readiness = runtime.readiness()
            if readiness != READY:
                raise TaskError(f"cannot run image {self.spec.image}: containers {readiness}")
            try:
                runtime.check_image(self.spec.image)
            except ContainerError as exc:
                raise TaskError(str(exc)) from None
            uuids, cdi = [visible_device(g) for g in self.assignment.gpus], cdi_has_nvidia()
            if uuids and not runtime.gpu_flags(uuids, cdi):
                self._system(
                    "[fleet-agent] no CDI spec for nvidia.com/gpu on this host: the container does "
                    "not see its GPUs (nvidia-ctk cdi generate makes one)"
                )
            self._write_env_file()
            try:
                inner = runtime.run_argv(
                    self.container,
                    self.spec.image,
                    self.assignment.command,
                    self.volume,
                    self.spec.volume_mount_path,
                    self.ports,
                    self.env_file,
                    (run_as.uid, run_as.gid),
                    uuids,
                    cdi,
                    self.spec.runtime_args,
                    memory_bytes=self.assignment.memory_bytes,
                    pids=self.assignment.pids,
                )
            except ContainerError as exc:
                raise TaskError(str(exc)) from None
        else:
            inner = list(self.assignment.command)
        check_executable(inner[0], self._cwd, env.get("PATH", DEFAULT_PATH))
        if (
            not self.container
        ):  # a container's user is the runtime's to set (--user); its client stays root
            inner = self.runner.isolation.wrap(self.run_as, inner)
        # The shell that records the exit status is root's: the task cannot forge it.
        return self.runner.limits.command(self.task_limits, inner, self.status_path)

    def _run_once(self):
        """Start one process of the instance: the first, or a restart."""
        runtime = self.runner.containers
        if self.container and runtime is not None and runtime.readiness() == READY:
            # Left by a run whose end the agent missed; gone before the env file is written, so that
            # the monitor's sight of a container always means this run's client read its env file.
            runtime.remove(self.container)
        argv = self._argv()
        env = self.runner.containers.env if self.container else self._env
        try:
            os.unlink(self.status_path)
        except FileNotFoundError:
            pass
        assert self.output is not None  # made before the first run (_spawn, _take_back)
        stdout, stderr = self.output.keeper.open_output()
        try:
            pid, start_ticks = self._launch(
                argv,
                self._cwd,
                env,
                output=(stdout, stderr),
                what=self.spec.image or self.assignment.command[0],
            )
        finally:
            os.close(stdout)
            os.close(stderr)
        self._ran = True
        self._start_ticks = start_ticks
        self.monitor.run_started()
        log.info(
            "instance %s (task %s): started pid %d, host ports %s",
            self.spec.id,
            self.label,
            pid,
            self.ports or "none",
        )
        self._save(
            state="running",
            pid=pid,
            pgid=self.process.pgid,
            start_ticks=start_ticks,
            started_at=self.worker.started_at,
            restarts=self.restarts,
            start_reported=self._start_reported,
        )

    # Supervision: the runs, one after the other.

    def _supervise(self, client):
        result = self._supervise_runs(
            client
        )  # Fenced or Detached go on up: _clean_up sees to the container
        # Before the finish report, which fleetd takes for "its processes are gone" (stopped): what
        # left the process group (a daemon in a session of its own) is killed and waited for here,
        # not after it.
        left = self.process.kill_leftovers()
        if left and not wait_gone(left, LEFTOVERS_GONE_SECONDS):
            log.warning(
                "task %s: processes %s outlived SIGKILL for %gs",
                self.label,
                left,
                LEFTOVERS_GONE_SECONDS,
            )
        # Before the finish report: a resume may publish the same host ports at once.
        self._remove_container()
        return result

    def _remove_container(self):
        if (
            self.container
            and self._ran
            and not self._container_removed
            and self.runner.containers is not None
        ):
            self.runner.containers.remove(self.container)
            self._container_removed = True

    def _supervise_runs(self, client):
        self.monitor.start()
        result, self._ended = self._ended, None
        for _ in range(MAX_RUNS):
            if result is None:
                result = super()._supervise(client)
                if self.container:
                    self._drop_env_file()  # read by now: the client ran
            if self._detached:  # the next start decides, from the exit status the wrapper wrote
                raise Detached()
            if (
                self._stop is not None
                or self._fenced
                or not restarts_after(self.spec.restart, result[0])
            ):
                return result
            try:
                gave_up = self._restart(result, client)
            except TaskError as exc:
                return "failed", None, str(exc)
            except Stopped as stopped:
                return stopped.outcome, None, stopped.reason
            if gave_up is not None:
                return gave_up
            result = None
        return result

    def _restart(self, result, client):
        """Report the exit, wait out the back-off and start the process again; None, or the result
        the run ends with when the policy gives up."""
        started = self.process.started_monotonic
        delay = self.backoff.next(time.monotonic() - started if started is not None else 0.0)
        how = result[2] or "exit code 0"
        if delay is None:
            reason = (
                f"{how}; restart policy {self.spec.restart} gave up after {self.backoff.limit} "
                f"restarts in a row that each ran under {BACKOFF_RESET_SECONDS:g}s"
            )
            self._system(f"[fleet-agent] the process ended ({how}); {reason.partition('; ')[2]}")
            return "failed", result[1], reason
        restart_at = time.monotonic() + delay
        self._system(
            f"[fleet-agent] the process ended ({how}); restarting it in "
            f"{delay:g}s (restart policy {self.spec.restart})"
        )
        self._report_restart(client, result[1], how, delay)
        self.process.kill_leftovers()
        self._pause(max(0.0, restart_at - time.monotonic()))
        with self._lock:
            identity = self.process.identity
            self.process = self._new_supervisor()
            self.process.identity = identity
        self.restarts += 1
        self._entry["restarts"] = self.restarts
        self._start_reported = (
            False  # each restart's start is reported: fleetd shows it running again
        )
        self._run_once()
        return None

    def _report_restart(self, client, exit_code, how, delay):
        """Tell fleetd the process ended and starts again in `delay` s: one try, as the restart must
        not wait for fleetd (the next start report, or the finish, tells it what it missed)."""
        found = SIGNAL_RE.search(how)
        try:
            client.task_restart(
                self.assignment.task_id,
                self.assignment.epoch,
                exit_code,
                found.group(1) if found else None,
                how[:2000],
                delay,
            )
        except Unreachable as exc:
            log.warning("task %s: the restart was not reported (%s)", self.label, exc)
        except FleetdError as exc:
            if is_fencing(exc):
                raise Fenced(str(exc)) from None
            log.error("task %s: fleetd refused the restart report: %s", self.label, exc)

    def _pause(self, seconds):
        """Wait out a back-off; Fenced, Detached or Stopped when that comes first."""
        deadline = time.monotonic() + seconds
        for _ in range(MAX_RUNS):
            if self._fenced:
                raise Fenced(self._fenced)
            if self._detached:
                raise Detached()
            if self._stop is not None:
                raise Stopped(*self._stop)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.process.wake.wait(remaining)
            self.process.wake.clear()

    def _outcome(self, code):
        if code is not None:
            return super()._outcome(code)
        if self._stop is not None:
            return self._stop[0], None, self._stop[1]
        return (
            "failed",
            None,
            "the process ended while fleet-agent was not running; its exit status is unknown",
        )

    def _start_extra(self):
        return {"ports": self._wire_ports(), "restarts": self.restarts}

    def _finish_extra(self):
        extra = {"ports": self._wire_ports()}
        if self.idle:
            extra["idle"] = True
        return extra

    def _system(self, text):
        log.info("task %s: %s", self.label, text)
        if self.output is not None:
            self.output.keeper.note(text)
            self.output.kick()

    def _save(self, **changes):
        if self.idle:
            changes["idle"] = True
        self.record.update(changes)
        assignment = self.assignment
        self.record.update(
            task_id=assignment.task_id,
            job_id=assignment.job_id,
            epoch=assignment.epoch,
            rank=assignment.rank,
        )
        compact_state(self.state_path, self.record, JOURNAL_COMPACT_BYTES)

    # After an agent restart.

    def _prepare_taken_back(self, record):
        """The run's directory, host ports, volume and env, as the journal has them."""
        self._cwd = record.get("cwd") or self.workdir
        self.ports = {int(p): hp for p, hp in (record.get("ports") or {}).items()}
        if self.container:
            remove_env_file(self.env_file)  # its client read it long ago; a restart writes another
        try:
            self.volume = self._ensure_volume()
        except (OSError, ValueError) as exc:
            raise TaskError(f"cannot find the instance's volume: {exc}") from None
        self._entry.update(ports=self._wire_ports(), volume=self.volume)
        self._env = self._instance_env(
            record.get("master_addr") or self.runner.address, record.get("master_port") or 0
        )
        self.restarts = self._entry["restarts"] = int(record.get("restarts") or 0)

    def _taken_back(self, record, alive):
        self._ran = True
        if alive:
            self._start_ticks = record.get("start_ticks")
        else:
            ended = self._outcome(read_exit_status(self.status_path))
            self._system(
                f"[fleet-agent] the process ended while fleet-agent was not running "
                f"({ended[2] or 'exit code 0'})"
            )

    def _leave_running(self):
        """The agent stops and the process runs on: ship what it wrote so far, remember how far."""
        self.process.release()
        self.monitor.stop()
        if self.container:
            self.settle_env_file()  # else it waits for the next agent start
        if self.output is not None:
            self.output.leave(LEAVE_LOGS_SECONDS)

    # The end.

    def _clean_up(self, keep_dir, left_running=False):
        self.monitor.stop()
        if not left_running:
            self._remove_container()  # after a failure of the agent's own, too
        if self.container and not left_running:
            self._drop_env_file()
        super()._clean_up(keep_dir, left_running)
