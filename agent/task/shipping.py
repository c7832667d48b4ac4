"""A task's output on its way to fleetd (issue 47): tail batches and chunk uploads, in the
background, going on after the task's finish was reported.

- Batches (POST .../logs, an OutputBatch): one at a time and in order, at most one a tick; each
  covers every line since the last acknowledged one, with the texts the keeper kept (the first
  lines, the newest). While fleetd is slow or down the next batch simply covers more lines.
  413: sent again with half the texts.
- Uploads (PUT .../output/{first_line}): the sealed chunks, in order; a chunk leaves the node only
  once fleetd answered 204. fleetd stores them idempotently, so a chunk sent again after a restart
  is harmless.

Both retry with backoff while fleetd is unreachable, up to the runner's report_retry_seconds. Any
other refusal (409: this node may no longer write this output; 400, 403, 404, 405: a fleetd that
does not know the task or these routes) stops both, logged once; a 409 while the task runs also
fences it off, as the task's other calls do. Each loop runs on one of the runner's pool threads
while it has work and gives the thread back when it has none. Once the task is over and
everything is shipped (or given up) the keeper's files go and the `when_done` callback runs (the
task directory is removed there); an agent that stops leaves them for its next start.
"""

import logging
import threading
import time

from agent.client import Conflict, FleetdError, TooLarge, Unreachable, backoff_delay
from agent.threads import UNTIL_STOPPED, PoolWork

log = logging.getLogger("agent.runner")


class Outputs:
    """The shippers still at work after their task was left: stopped together at shutdown."""

    def __init__(self):
        self._lock = threading.Lock()
        self._shippers = set()

    def add(self, shipper):
        with self._lock:
            self._shippers.add(shipper)

    def discard(self, shipper):
        with self._lock:
            self._shippers.discard(shipper)

    def stop_all(self):
        """The agent stops: nothing more is sent; the files stay for the next start."""
        with self._lock:
            shippers = list(self._shippers)
        for shipper in shippers:
            shipper.stop()


class OutputShipper:
    """Ships one OutputKeeper's batches and chunks to fleetd, on the runner's threads.

    `runner` gives clients (checkout_client / checkin_client), `threads`, `outputs`,
    `report_retry_seconds` and `backoff_max_seconds`; `on_fenced(exc)` is told of a 409 while the
    task runs.
    """

    def __init__(self, keeper, runner, task_id, settings, on_fenced=None, label=""):
        self.keeper = keeper
        self.runner = runner
        self.task_id = task_id
        self.settings = settings
        self.label = label
        self._on_fenced = on_fenced
        self._cond = threading.Condition()
        self._batching = False
        self._uploading = False
        self._stopped = False  # the agent stops: nothing more is sent, the files stay
        self.refused = None  # why fleetd will not take this output: nothing more is sent
        self._ended = False  # the process ended and its output was read to the end
        self._on_done = None
        self._job = None

    # Feeding.

    def start(self, ticker):
        """Read the output at every tick of `ticker` (an agent.watch.Ticker shared by the tasks);
        what a resumed state left unshipped goes at once."""
        self._job = (ticker, ticker.add(self.tick))
        self.kick()

    def tick(self):
        """One look at the files; what is new goes out."""
        changed, _at_end = self.keeper.pump()
        if changed:
            self.kick()

    def _unschedule(self):
        job, self._job = self._job, None
        if job is not None:
            ticker, ident = job
            ticker.remove(ident)  # no pump of the ticker's from here on

    def kick(self):
        """Start the batch and upload loops that have work and are not running."""
        work = []
        with self._cond:
            if self._stopped or self.refused is not None:
                return
            if not self._batching and self.keeper.unacked():
                self._batching = True
                work.append(PoolWork(self._run, self._batches, name=f"output-{self.label}"))
            if not self._uploading and self.keeper.next_chunk() is not None:
                self._uploading = True
                work.append(PoolWork(self._run, self._uploads, name=f"upload-{self.label}"))
        for item in work:
            self.runner.threads.submit(item)

    # The task's side.

    def finish(self):
        """The process ended: read its files to the end, seal the chunk; the OutputSummary for the
        finish report (None: no output). Shipping goes on in the background."""
        self._unschedule()
        if self._ended:
            return self.keeper.summary()
        summary = self.keeper.finish()
        with self._cond:
            self._ended = True
            self._cond.notify_all()  # a batch loop between two batches sends the last one now
        self.kick()
        return summary

    def flush_now(self):
        """A reader waits: read what is new, seal the open chunk however small, ship both."""
        self.keeper.pump()
        self.keeper.seal_now()
        self.kick()

    def flush_batch(self, seconds):
        """Wait (at most `seconds`) until fleetd has every line counted and the texts of the
        newest: a finish reported after this leaves no line of a short output unread at fleetd
        (a long one's middle comes in its chunks). True when it got there."""
        deadline = time.monotonic() + seconds
        with self._cond:
            for _ in range(UNTIL_STOPPED):
                if not self.keeper.unacked():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped or self.refused is not None:
                    return False
                self._cond.wait(min(remaining, 0.05))
        return False

    def leave(self, seconds):
        """The agent stops and the process runs on (an instance's): read what is there, let the
        batch go (bounded by `seconds`), then stop; the next start resumes from the state file."""
        self._unschedule()
        self.keeper.pump()
        self.kick()
        deadline = time.monotonic() + seconds
        with self._cond:
            for _ in range(UNTIL_STOPPED):
                remaining = deadline - time.monotonic()
                if not self._batching or remaining <= 0:
                    break
                self._cond.wait(remaining)
        self.stop()

    def stop(self):
        """Send nothing more (the agent stops, or the task is abandoned); the files stay."""
        self._unschedule()
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self.runner.outputs.discard(self)

    def nudge(self):
        """Cut a retry backoff short."""
        with self._cond:
            self._cond.notify_all()

    def when_done(self, fn):
        """Call fn() once everything is shipped or given up (at once when it is); never when the
        agent stops first (the next start ships the rest). After finish()."""
        with self._cond:
            self._on_done = fn
        self.runner.outputs.add(self)
        self._maybe_done()

    def _maybe_done(self):
        with self._cond:
            fn = self._on_done
            if fn is None or self._stopped or self._batching or self._uploading or not self._ended:
                return
            if self.refused is None and self.keeper.pending():
                return
            self._on_done = None
        self.runner.outputs.discard(self)
        self.keeper.remove_files()
        fn()

    # The loops.

    def _run(self, loop):
        client = self.runner.checkout_client()
        try:
            loop(client)
        finally:
            self.runner.checkin_client(client)
            with self._cond:
                if loop == self._batches:
                    self._batching = False
                else:
                    self._uploading = False
                self._cond.notify_all()
            self._maybe_done()

    def _going(self):
        with self._cond:
            return not self._stopped and self.refused is None

    def _wait(self, seconds):
        with self._cond:
            if not self._stopped and self.refused is None:
                self._cond.wait(seconds)

    def _batches(self, client):
        failures, since, max_texts = 0, None, self.settings.batch_lines
        for _ in range(UNTIL_STOPPED):
            if not self._going():
                return
            with self._cond:
                ended = self._ended
            live = max_texts if ended else min(max_texts, self.settings.live_batch_lines)
            batch = self.keeper.batch(live)
            if batch is None:
                with self._cond:
                    if not self.keeper.unacked():
                        self._batching = False
                        return
                continue
            try:
                client.task_output_batch(self.task_id, batch)
            except TooLarge as exc:
                if not batch.lines:
                    self._refuse(exc)
                    return
                max_texts = len(batch.lines) // 2
                continue
            except Unreachable as exc:
                failures += 1
                since = since or time.monotonic()
                if self._retried_out(since, failures, exc, "a batch of output"):
                    return
                continue
            except FleetdError as exc:
                self._refuse(exc)
                return
            self.keeper.acked(batch)
            with self._cond:
                self._cond.notify_all()  # a finish waiting for its last batch goes on
                ended = self._ended
            failures, since, max_texts = 0, None, self.settings.batch_lines
            if not ended:
                self._wait(self.settings.interval_seconds)  # at most one batch a tick

    def _uploads(self, client):
        failures, since = 0, None
        for _ in range(UNTIL_STOPPED):
            if not self._going():
                return
            chunk = self.keeper.next_chunk()
            if chunk is None:
                with self._cond:
                    if self.keeper.next_chunk() is None:
                        self._uploading = False
                        return
                continue
            try:
                blob = self.keeper.chunk_blob(chunk)
            except FileNotFoundError as exc:
                log.error(
                    "task %s: output chunk at line %d is gone: %s",
                    self.label,
                    chunk.first_line,
                    exc,
                )
                self.keeper.uploaded(chunk)
                continue
            except OSError as exc:
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    log.error(
                        "task %s: cannot compress the output chunk at line %d (%s); trying again",
                        self.label,
                        chunk.first_line,
                        exc,
                    )
                self._wait(backoff_delay(failures, self.settings.backoff_max_seconds))
                continue
            try:
                client.put_output_chunk(self.task_id, chunk.meta(self.keeper.epoch), blob)
            except TooLarge as exc:
                log.error(
                    "task %s: fleetd refuses the output chunk at line %d (%d bytes): %s; dropped",
                    self.label,
                    chunk.first_line,
                    len(blob),
                    exc,
                )
                self.keeper.uploaded(chunk)
                continue
            except Unreachable as exc:
                failures += 1
                since = since or time.monotonic()
                if self._retried_out(since, failures, exc, "an output chunk"):
                    return
                continue
            except FleetdError as exc:
                self._refuse(exc)
                return
            self.keeper.uploaded(chunk)
            failures, since = 0, None

    def _retried_out(self, since, failures, exc, what):
        """Log and wait out a failed try; True once retrying is over (given up)."""
        if time.monotonic() - since >= self.runner.report_retry_seconds:
            self._refuse(exc, f"gave up sending {what} after {failures} tries")
            return True
        if failures == 1 or failures % 10 == 0:
            log.warning(
                "task %s: %s not delivered yet (attempt %d): %s; it waits on the node",
                self.label,
                what,
                failures,
                exc,
            )
        self._wait(backoff_delay(failures, self.settings.backoff_max_seconds))
        return False

    def _refuse(self, exc, why=None):
        with self._cond:
            first = self.refused is None
            if first:
                self.refused = why or str(exc)
            ended = self._ended
            self._cond.notify_all()
        if not first:
            return
        log.warning(
            "task %s: its output is no longer shipped (%s); what is left of it on the node goes",
            self.label,
            self.refused,
        )
        if isinstance(exc, Conflict) and not ended and self._on_fenced is not None:
            self._on_fenced(exc)
