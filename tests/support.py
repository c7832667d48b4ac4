"""Helpers every test package shares."""

import threading
import time

_NEVER_SET = threading.Event()  # waited on between looks: a pause that no test tunes as a timing


def wait_until(condition, timeout=30.0, interval=0.1, message="condition"):
    """Look at `condition()` until it returns something truthy and return that; AssertionError
    after `timeout` seconds. Bounded in time and in the number of looks."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 2):
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        _NEVER_SET.wait(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")
