"""Finish reports: each task's outcome to fleetd, retried through an outage, batched when they come
together."""

import dataclasses
import logging
import threading
import time

from agent.client import FleetdError, Rejected, Unreachable, backoff_delay, finish_body
from agent.task.errors import Fenced, is_fencing
from agent.threads import UNTIL_STOPPED
from fleetwire import MAX_FINISHES

log = logging.getLogger("agent.runner")


def report_finish(
    client,
    runner,
    task_id,
    epoch,
    result,
    label,
    lost=False,
    pid=None,
    started_monotonic=None,
    agent_stopping=False,
    extra=None,
    output=None,
):
    """POST finish, retried through a fleetd outage; True once fleetd has it or will never take it.

    False when given up (the agent stops, or the retry time is over): the state file stays, and
    the next start reports the task. `lost` adds `lost: true` (the agent, not the task, ended it);
    `agent_stopping` adds `agent_stopping: true` (it did so because it shuts down: no attempt used);
    `pid` reports the start with the finish (the process ended before its start was reported), and
    `started_monotonic` (time.monotonic() at the spawn) how long ago that was; `extra` are more
    fields (an instance's `idle`, and its `ports` with a `pid`); `output` the task's
    OutputSummary (None: it wrote nothing).
    A fleetd that does not know these fields (400) gets a start report, then the finish without
    them.
    """
    outcome, exit_code, reason = result
    deadline = time.monotonic() + runner.report_retry_seconds
    for attempt in range(1, 1_000_000):
        try:
            ago = (
                None
                if pid is None or started_monotonic is None
                else max(0.0, time.monotonic() - started_monotonic)
            )
            body = finish_body(
                epoch,
                outcome,
                exit_code,
                (reason or "")[:1000] or None,
                lost=lost,
                pid=pid,
                started_seconds_ago=ago,
            )
            extra = extra or {}
            body = dataclasses.replace(
                body,
                agent_stopping=agent_stopping and lost,
                idle=bool(extra.get("idle")),
                ports=tuple(extra["ports"]) if pid is not None and "ports" in extra else None,
                output=output,
            )
            runner.finishes.send(client, task_id, body)
            log.info(
                "task %s: %s%s%s",
                label,
                outcome,
                f", exit code {exit_code}" if exit_code is not None else "",
                f" ({reason})" if reason else "",
            )
            return True
        except Unreachable as exc:
            if runner.closing.is_set() or time.monotonic() >= deadline:
                log.warning(
                    "task %s: finish (%s) not reported: %s; it will be reported at the next start",
                    label,
                    outcome,
                    exc,
                )
                return False
            delay = backoff_delay(attempt, runner.backoff_max_seconds)
            if attempt == 1 or attempt % 10 == 0:
                log.warning(
                    "task %s: finish not reported yet (attempt %d): %s; retrying",
                    label,
                    attempt,
                    exc,
                )
            runner.closing.wait(delay)
        except FleetdError as exc:
            if is_fencing(exc):
                raise Fenced(str(exc)) from None
            if output is not None and exc.status == 400:
                log.info(
                    "task %s: fleetd does not take 'output' in a finish report (%s); reporting "
                    "without it",
                    label,
                    exc,
                )
                output = None
                continue
            if pid is not None and exc.status == 400:
                log.info(
                    "task %s: fleetd does not take the start in a finish report (%s); reporting it "
                    "first",
                    label,
                    exc,
                )
                try:
                    client.task_start(
                        task_id, epoch, pid, extra={k: v for k, v in extra.items() if k == "ports"}
                    )
                except FleetdError as start_exc:
                    if is_fencing(start_exc):
                        raise Fenced(str(start_exc)) from None
                pid = None
                continue
            if agent_stopping and lost and exc.status == 400:
                log.info(
                    "task %s: fleetd does not take 'agent_stopping' in a finish report (%s); "
                    "reporting without it",
                    label,
                    exc,
                )
                agent_stopping = False
                continue
            if lost and exc.status == 400:
                log.info(
                    "task %s: fleetd does not take 'lost' in a finish report (%s); reporting "
                    "without it",
                    label,
                    exc,
                )
                lost = False
                continue
            log.error("task %s: fleetd refused the finish report: %s", label, exc)
            return True
    return False


class _Report:
    __slots__ = ("task_id", "body", "error", "sent", "done")

    def __init__(self, task_id, body):
        self.task_id = task_id
        self.body = body
        self.error = None  # what fleetd's answer raises for this report
        self.sent = (
            False  # a call carried it; `done` set and not sent: its thread sends the next call
        )
        self.done = threading.Event()


class FinishReports:
    """The finish reports of this host's tasks, sent together when they come together.

    A report goes out at once when no call is on its way; the reports that come meanwhile wait
    for that call and then go out in one (POST /agent/finish, up to MAX_FINISHES), sent by the
    thread of the first of them. Nothing waits for company: when fleetd answers fast each
    report goes alone, by the single-finish route; when it is loaded it answers slower, more reports
    wait, and each call carries more of them (per-call cost is most of what fleetd spends on
    a finish). A fleetd without the route (404, 405) gets one call per report from then on.
    """

    def __init__(self):
        self.batch = True
        self._lock = threading.Lock()
        self._queue = []  # reports waiting for the next call
        self._sending = False  # a call is on its way; the queue waits for it

    def send(self, client, task_id, body):
        """Report one finish (a TaskFinish); raises what a single finish call would."""
        report = _Report(task_id, body)
        with self._lock:
            self._queue.append(report)
            leading = not self._sending
            self._sending = True
        if not leading:
            # Until a call carried it, or it is this thread's turn to send one (the call before
            # always ends: its thread hands over in a finally).
            for _ in range(UNTIL_STOPPED):
                if report.done.wait(60):
                    break
        if not report.sent:  # leading: this thread sends the next call, its own report in it
            self._lead(client)
        if report.error is not None:
            raise report.error

    def _lead(self, client):
        with self._lock:
            batch = self._queue[:MAX_FINISHES]
            del self._queue[:MAX_FINISHES]
        try:
            self._deliver(client, batch)
        except BaseException as exc:  # a bug or an interrupt: no waiting report may hang on it
            for report in batch:
                report.error = (
                    exc if isinstance(exc, FleetdError) else Unreachable(f"finish report: {exc!r}")
                )
            raise
        finally:
            with self._lock:
                if self._queue:  # the first waiting report sends the next call
                    self._queue[0].done.set()
                else:
                    self._sending = False
            for report in batch:
                report.sent = True
                report.done.set()

    def _deliver(self, client, batch):
        if len(batch) > 1 and self.batch:
            try:
                errors = client.task_finishes([(r.task_id, r.body) for r in batch])
            except (Unreachable, Rejected) as exc:
                for report in batch:
                    report.error = exc
                return
            except FleetdError as exc:  # answered one by one below; older fleetds lack the route
                if exc.status in (404, 405):
                    log.info(
                        "fleetd does not take finish reports together (%s); sending them one by "
                        "one",
                        exc,
                    )
                    self.batch = False
            else:
                for report, error in zip(batch, errors):
                    report.error = error
                return
        for report in batch:
            try:
                client.task_finish_body(report.task_id, report.body)
            except FleetdError as exc:
                report.error = exc
