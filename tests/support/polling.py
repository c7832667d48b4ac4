"""One polling helper for every test package: wait until something is true, bounded, with a clear
message."""

import threading
import time

_NEVER_SET = threading.Event()  # waited on between looks: a pause that no test tunes as a timing


def wait_until(
    condition, timeout=30.0, interval=0.1, message="condition", *, pause=None, details=None
):
    """Look at `condition()` until it returns something truthy and return that; AssertionError after
    `timeout` seconds, naming `message` and, when given, `details()` (what was seen meanwhile).
    `condition` may itself raise AssertionError to give up at once (a process that exited).

    Between looks it waits up to `interval` seconds with `pause(seconds)`: by default on an event
    that is never set; a `threading.Condition`'s `wait`, called with its lock held, looks again as
    soon as the condition is notified (and `condition` then runs under the lock). Bounded in time
    (the deadline) and in the number of pauses that run their whole interval (timeout / interval +
    2)."""
    pause = pause or _NEVER_SET.wait
    deadline = time.monotonic() + timeout
    quiet_pauses = int(timeout / interval) + 2
    while True:  # bounded: by the deadline and by the count of quiet pauses
        value = condition()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0 or quiet_pauses <= 0:
            break
        if not pause(
            min(interval, remaining)
        ):  # ran its whole interval (a notified wait returns True)
            quiet_pauses -= 1
    seen = f"\n{details()}" if details is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {message}{seen}")
