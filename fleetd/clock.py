"""Time sources. Services take a Clock so that tests can move time by hand."""

import datetime as dt
import time


def utcnow():
    """The current time as a naive UTC datetime (how the database stores times)."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Clock:
    """Wall clock for timestamps and a monotonic clock for intervals."""

    def now(self):
        """Current time, naive UTC."""
        return utcnow()

    def monotonic(self):
        """Seconds from an arbitrary origin; never goes backwards."""
        return time.monotonic()


def isoformat(value):
    """RFC 3339 UTC string for a naive UTC datetime, or None."""
    if value is None:
        return None
    return value.isoformat(timespec="milliseconds") + "Z"
