"""Runs the validation suites fleetd asks for (docs/validation.md), one at a time, on a thread of
its own.

A heartbeat's answer carries `validation: {id, suite}` while the node validates; `want()` starts
that suite once (a repeat of the same id while it runs or after it ran is ignored). The suite reads
the GPUs (agent/validation.py decides each check), runs `dcgmi diag -r N` where DCGM is installed,
then the fleet's command, if any, with its time limit, as an unprivileged user like tasks (nobody)
unless the fleet says root, in a directory of its own; the end of each command's output is kept with
its result. The results are posted to fleetd, retried with back-off until fleetd takes them or
refuses them for good.
"""

import logging
import os
import shutil
import signal
import subprocess
import threading
import time

from agent.client import FleetdError, backoff_delay
from agent.validation import Suite, result, run_checks
from fleetwire.tasks import ValidationReport

log = logging.getLogger("agent.validator")

OUTPUT_TAIL = 8000  # characters of a command's output kept with its result
DCGM_SECONDS = {1: 120, 2: 600, 3: 1800, 4: 7200}
DCGM_PATH = "/usr/bin:/usr/local/bin:/usr/sbin:/bin"
KILL_WAIT_SECONDS = 10
MAX_POST_ATTEMPTS = 1000  # bounded: then the validation is left to its deadline in fleetd
GONE = (
    400,
    404,
    409,
    413,
    422,
)  # fleetd will never take these results (refused, replaced, or the node left)


class Validator:
    """One validation at a time; `client_factory()` gives a FleetClient of this node."""

    def __init__(
        self, devices, client_factory, isolation, state_dir, stop, backoff_max=30.0, dcgmi=None
    ):
        self.devices = devices
        self.client_factory = client_factory
        self.isolation = isolation
        self.dir = os.path.join(state_dir, "validation")
        self.stop = stop
        self.backoff_max = backoff_max
        self.dcgmi = dcgmi if dcgmi is not None else shutil.which("dcgmi", path=DCGM_PATH)
        self._lock = threading.Lock()
        self._seen = set()  # ids started by this process
        self._thread = None

    def want(self, request):
        """fleetd asks for validation `request` ({id, suite}): run it unless it ran or runs
        already."""
        validation_id = request.get("id")
        if not validation_id:
            return False
        with self._lock:
            if validation_id in self._seen or (
                self._thread is not None and self._thread.is_alive()
            ):
                return False
            self._seen.add(validation_id)
            suite = Suite.from_wire(request.get("suite"))
            self._thread = threading.Thread(
                target=self._run, args=(validation_id, suite), name="validation", daemon=True
            )
            self._thread.start()
        return True

    def join(self, timeout=None):
        """Wait for the running validation (tests, shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self, validation_id, suite):
        log.info("validation %s: running %s", validation_id, ", ".join(suite.checks) or "no check")
        started = time.monotonic()
        try:
            body = self.run_suite(validation_id, suite)
        except (
            Exception
        ) as exc:  # a bug must still give fleetd an answer, not leave the node validating
            log.exception("validation %s crashed", validation_id)
            body = {
                "checks": [
                    result("agent", "failed", f"the agent's validation crashed: {exc!r}"[:1000])
                ],
                "system": {},
            }
        if (
            self.stop.is_set()
        ):  # cut short by the agent's stop: the next agent runs it again (fleetd still asks)
            log.info("validation %s: stopped before it finished; not reported", validation_id)
            return
        failed = [c for c in body["checks"] if c["status"] == "failed"]
        log.info(
            "validation %s: %s in %.1fs%s",
            validation_id,
            "failed" if failed else "passed",
            time.monotonic() - started,
            "".join(
                f"; {c['name']}"
                + (f" GPU {c['gpu']}" if c["gpu"] is not None else "")
                + f": {c['detail']}"
                for c in failed[:10]
            ),
        )
        self._post(validation_id, body)

    def run_suite(self, validation_id, suite):
        """{checks, system}: the NVML checks, DCGM, then the fleet's command."""
        inventory, readings = self.devices.validation_readings()
        checks = run_checks(suite, inventory, readings)
        if "dcgm" in suite.checks:
            checks.append(self._dcgm(suite.dcgm_level))
        if suite.command:
            checks.append(self._command(validation_id, suite))
        return {
            "checks": checks,
            "system": {
                "driver_version": inventory.driver_version,
                "cuda_version": inventory.cuda_version,
            },
        }

    def _dcgm(self, level):
        if not level:
            return result("dcgm", "skipped", "the fleet runs no DCGM diagnostic (dcgm_level 0)")
        if not self.dcgmi:
            return result("dcgm", "skipped", "DCGM is not installed (no dcgmi)")
        argv = [self.dcgmi, "diag", "-r", str(int(level))]
        code, output, timed_out = self._execute(
            argv, DCGM_SECONDS.get(int(level), 7200), env=_base_env()
        )
        failed_lines = [line.strip() for line in output.splitlines() if "Fail" in line]
        if timed_out:
            status, detail = (
                "failed",
                f"dcgmi diag -r {level} did not finish in {DCGM_SECONDS.get(int(level))} s",
            )
        elif code != 0 or failed_lines:
            status, detail = (
                "failed",
                f"dcgmi diag -r {level} exited {code}"
                + (f": {'; '.join(failed_lines[:5])}" if failed_lines else ""),
            )
        else:
            status, detail = "passed", f"dcgmi diag -r {level} passed"
        return dict(result("dcgm", status, detail), output=output[-OUTPUT_TAIL:])

    def _command(self, validation_id, suite):
        argv, timeout = list(suite.command), int(suite.timeout_seconds)
        run_as = self.isolation.resolve({"source": "root"} if suite.command_as_root else None)
        workdir = os.path.join(
            self.dir, "".join(c for c in validation_id if c.isalnum())[:64] or "run"
        )
        os.makedirs(self.dir, exist_ok=True)
        self.isolation.passable(self.dir)
        shutil.rmtree(workdir, ignore_errors=True)
        os.makedirs(workdir, mode=0o700)
        self.isolation.own(run_as, workdir)
        env = self.isolation.env(
            run_as, dict(_base_env(), FLEET_VALIDATION_ID=validation_id), workdir
        )
        code, output, timed_out = self._execute(
            self.isolation.wrap(run_as, argv), timeout, env=env, cwd=workdir
        )
        who = f"as {run_as.user or run_as.uid}"
        if timed_out:
            status, detail = "failed", f"{argv[0]} did not finish in {timeout} s ({who})"
        elif code != 0:
            status, detail = "failed", f"{argv[0]} exited {code} ({who})"
        else:
            status, detail = "passed", f"{argv[0]} exited 0 ({who})"
        shutil.rmtree(workdir, ignore_errors=True)
        return dict(result("command", status, detail), output=output[-OUTPUT_TAIL:])

    def _execute(self, argv, timeout, env, cwd=None):
        """(exit code, output tail, timed out): argv in a session of its own, its output in a file
        the agent owns, killed with its group at the time limit (or when the agent stops)."""
        os.makedirs(self.dir, exist_ok=True)
        out_path = os.path.join(self.dir, f"output-{os.getpid()}-{threading.get_ident()}.log")
        with open(out_path, "w+b") as out:
            os.chmod(out_path, 0o600)
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,  # nosec B603  # argv from the fleet's admin-only setting, run unprivileged
                    cwd=cwd,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                return 127, f"cannot start {argv[0]}: {exc.strerror or exc}", False
            deadline = time.monotonic() + timeout
            timed_out = False
            while proc.poll() is None:
                if self.stop.is_set() or time.monotonic() >= deadline:
                    timed_out = not self.stop.is_set()
                    _kill_group(proc)
                    break
                self.stop.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            out.seek(0, os.SEEK_END)
            size = out.tell()
            out.seek(max(0, size - OUTPUT_TAIL * 4))
            text = out.read().decode(errors="replace")
        os.unlink(out_path)
        return proc.returncode, text[-OUTPUT_TAIL:], timed_out

    def _post(self, validation_id, body):
        client = self.client_factory()
        try:
            for attempt in range(1, MAX_POST_ATTEMPTS + 1):
                try:
                    client.report_validation(
                        validation_id,
                        ValidationReport(tuple(body["checks"]), body.get("system") or {}),
                    )
                    return True
                except FleetdError as exc:
                    if exc.status in GONE:
                        log.warning(
                            "validation %s: fleetd no longer takes its results (%s)",
                            validation_id,
                            exc,
                        )
                        return False
                    delay = backoff_delay(attempt, self.backoff_max)
                    log.warning(
                        "validation %s: reporting failed (%s); retrying in %.1fs",
                        validation_id,
                        exc,
                        delay,
                    )
                    if self.stop.wait(delay):
                        return False
            return False
        finally:
            client.close()


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        log.error("validation command %d did not die after SIGKILL", proc.pid)


def _base_env():
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
    }
