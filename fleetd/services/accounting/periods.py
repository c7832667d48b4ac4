"""Units and periods of the ledger: what it prices, and its days and months (UTC)."""

import calendar
import datetime as dt

GPU, STORAGE = "gpu", "storage"  # what the ledger prices
GB = 1_000_000_000  # storage is priced per GB (10^9 bytes) and month


def month_of(at):
    """'YYYY-MM' of a naive UTC time."""
    return f"{at.year:04d}-{at.month:02d}"


def month_start(at):
    """Midnight UTC of the first day of `at`'s month."""
    return dt.datetime(at.year, at.month, 1)


def month_seconds(at):
    return calendar.monthrange(at.year, at.month)[1] * 86400


def _next_midnight(at):
    return dt.datetime.combine(at.date(), dt.time()) + dt.timedelta(days=1)


def split_days(start, end):
    """[(a, b)] covering [start, end), cut at each UTC midnight."""
    out = []
    while start < end:
        cut = min(end, _next_midnight(start))
        out.append((start, cut))
        start = cut
    return out
