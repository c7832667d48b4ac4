"""The scheduler loop: passes after kicks, and a periodic one, in a thread of `fleetd serve`."""

import logging
import threading
import time

from fleetd.db import Fenced, after_commit, database
from fleetd.services.placement.scheduling import run_pass

log = logging.getLogger(__name__)


class SchedulerLoop:
    """Runs a pass soon after each kick (submit, task end, node change), coalescing kicks.

    The periodic pass is the `scheduling` background task. Without a started loop (tests,
    one-off tools), kick() runs a pass in the caller.
    """

    COALESCE_SECONDS = 0.005
    MAX_PAUSE_SECONDS = 0.1

    def __init__(self, app, rt):
        self.app = app
        self.rt = rt
        self._kicked = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        self.publish = None  # replicas: fn(capacity, fleet) that asks the leader for a pass

    def kick(self, capacity=True, what=None):
        """Ask for a pass soon (now, when no loop runs); True when the pass ran in the caller.

        `capacity`: the event may let parked work fit (capacity freed, a node joined, a quota
        raised); `what` (a parking.Capacity) says what changed, and only the parked groups it
        could let fit are woken (all of them when not given). A submit is no such event. A
        kicked pass skips parked groups. Inside a write transaction the kick waits for its commit
        (a pass reads what it wrote), and answers False.
        """
        if database.in_transaction():
            after_commit(lambda: self.kick(capacity, what))
            return False
        if capacity:
            self.rt.parked.bump(what)
        if self.rt.leader.shared and not self.rt.leader.leading():
            if self.publish is not None:  # the leader runs the pass
                self.publish(capacity, what.to_wire() if capacity and what is not None else None)
            return False
        if self._thread is None:
            run_pass(self.rt, full=False)
            return True
        self._kicked.set()
        return False

    @property
    def running(self):
        """True while the loop runs passes on its own (`fleetd serve`)."""
        return self._thread is not None

    def start(self):
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout=10):
        self._stop.set()
        self._kicked.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self):
        pause = self.COALESCE_SECONDS
        while not self._stop.is_set():
            self._kicked.wait()
            # Let a burst of submits and task ends land first: one pass then places them all.
            # The pause is at least as long as the last pass took, so that passes (which read
            # every active task) take at most about half of fleetd's time however deep the backlog.
            self._stop.wait(pause)
            self._kicked.clear()
            if self._stop.is_set():
                return
            started = time.perf_counter()
            result = {}
            try:
                with self.app.app_context(), database.connection_context():
                    result = run_pass(self.rt, full=False)
            except Fenced as exc:  # the lead moved while the pass decided: the new leader places it
                log.warning("scheduling pass not written: %s", exc)
            except Exception:  # a failed pass is logged; the next kick or interval retries
                log.exception("scheduling pass failed")
            pause = min(
                self.MAX_PAUSE_SECONDS, max(self.COALESCE_SECONDS, time.perf_counter() - started)
            )
            if result.get("retry_in"):  # the inventory was a throttled view: a pass on the new one
                pause = max(
                    pause, result["retry_in"]
                )  # (what that view did not show yet woke its groups)
                self._kicked.set()
