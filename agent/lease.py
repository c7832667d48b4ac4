"""The node's hold on its job tasks: a lease that fleetd renews with every heartbeat it answers.

fleetd counts a task as this node's while its heartbeats list it; once it has heard nothing for
`lease_seconds` (the heartbeat reply says how long; it widens with the heartbeat interval), the task
is lost and its job may run again elsewhere. A node cut off from fleetd therefore stops its job
tasks *before* that moment, so a job never runs in two places at once: the lease is counted from
the send of the last heartbeat fleetd answered (fleetd renewed it later than that), less a margin
for clock rates, the stop's grace and a safety second or two. Instances are not fenced: fleetd
never runs them elsewhere (they resume on their volume's node).
"""

import time

CLOCK_RATE_MARGIN = 0.02  # the node's monotonic clock may run this much slower than fleetd's
SAFETY_SECONDS = 2.0
MAX_STOP_GRACE_SECONDS = (
    5.0  # SIGTERM to SIGKILL when the lease runs out: short, the deadline is near
)


class LeaseClock:
    """When this node must stop its job tasks if fleetd stays unreachable."""

    def __init__(self, kill_grace_seconds, clock=time.monotonic):
        self.clock = clock
        self.grace = min(kill_grace_seconds, MAX_STOP_GRACE_SECONDS)
        self.lease_seconds = None
        self.sent_at = None  # monotonic send time of the last heartbeat fleetd answered
        self.fenced_for = None  # the sent_at whose lease ran out and was acted on

    def renewed(self, sent_at, lease_seconds):
        """fleetd answered the heartbeat sent at `sent_at` (monotonic) with this lease."""
        if (
            isinstance(lease_seconds, (int, float))
            and not isinstance(lease_seconds, bool)
            and lease_seconds > 0
        ):
            self.lease_seconds = float(lease_seconds)
        self.sent_at = sent_at

    def fence_at(self):
        """The monotonic time by which the job tasks must be stopped (SIGKILL included), or None
        while fleetd has not told a lease."""
        if self.lease_seconds is None or self.sent_at is None:
            return None
        return (
            self.sent_at
            + self.lease_seconds * (1 - CLOCK_RATE_MARGIN)
            - self.grace
            - SAFETY_SECONDS
        )

    def seconds_left(self):
        """Seconds until the fence, or None."""
        at = self.fence_at()
        return None if at is None else at - self.clock()

    def due(self):
        """True once, when the lease ran out since fleetd last answered: the caller stops the job
        tasks."""
        left = self.seconds_left()
        if left is None or left > 0 or self.fenced_for == self.sent_at:
            return False
        self.fenced_for = self.sent_at
        return True
