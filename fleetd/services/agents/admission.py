"""How many registrations one fleetd process takes on at once: a storm of thousands of hosts
enrolling together must leave room for the jobs' requests and the nodes' heartbeats.

Two bounds, both per process (each replica counts its own): a rate (a token bucket holding a
second's worth) and the registrations being served at this moment. Past either, the answer is 429
with Retry-After, before any database work, and the agent comes back then (fleet-agent join does).
The rate is what an operator plans with; the bound on those in flight is what keeps latency low
when the process is slower than the rate (a loaded machine, a replica on a distant database): each
other request then waits behind a few registrations, never behind the whole storm.
"""

import contextlib
import threading

from fleetd.auth import RequestRates
from fleetd.errors import RateLimited


class Registrations:
    """The registrations this process admits: `per_second` (0: no rate) and `in_flight` at once
    (0: no bound)."""

    def __init__(self, per_second=0.0, in_flight=0):
        self._rate = RequestRates(per_second, 1.0)
        self.in_flight = in_flight
        self._serving = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def admitted(self, monotonic_now):
        """Serve one registration inside this block; RateLimited when past either bound."""
        with self._lock:
            if self.in_flight and self._serving >= self.in_flight:
                raise RateLimited(
                    f"{self._serving} registrations are being served on this fleetd (at most "
                    f"{self.in_flight} at once); retry later",
                    retry_after=1.0,
                )
            self._rate.take("register", None, monotonic_now, "registrations at once on this fleetd")
            self._serving += 1
        try:
            yield
        finally:
            with self._lock:
                self._serving -= 1
