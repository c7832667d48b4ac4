"""Availability windows of a fleet: when its GPUs may take work (pure functions, no I/O).

A fleet's `availability` is None (always open) or
``{"timezone": "Europe/Paris", "windows": [{"start": "20:00", "end": "08:00", "days": ["mon",
...]}]}``. A window whose end is not after its start runs past midnight into the next day; `days`
(default: every day) names the days on which a window starts.
"""

import datetime as dt
import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
HHMM = r"^([01]\d|2[0-3]):([0-5]\d)$"
_HHMM = re.compile(HHMM)


class WindowError(ValueError):
    """An availability that cannot be used."""


def validate(availability):
    """Raise WindowError unless `availability` is well formed; returns it."""
    if availability is None:
        return None
    if not isinstance(availability, dict) or set(availability) - {"timezone", "windows"}:
        raise WindowError("availability is {timezone, windows: [{start, end, days?}]}")
    try:
        ZoneInfo(availability.get("timezone") or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise WindowError(f"unknown time zone {availability.get('timezone')!r}") from None
    windows = availability.get("windows")
    if not isinstance(windows, list) or not 1 <= len(windows) <= 64:
        raise WindowError("windows must list 1 to 64 windows")
    for w in windows:
        if not isinstance(w, dict) or set(w) - {"start", "end", "days"}:
            raise WindowError("a window is {start: 'HH:MM', end: 'HH:MM', days?: ['mon', ...]}")
        for key in ("start", "end"):
            if not isinstance(w.get(key), str) or not _HHMM.fullmatch(w[key]):
                raise WindowError(f"window {key} must be HH:MM (24 h)")
        days = w.get("days", list(DAYS))
        if not isinstance(days, list) or not days or any(d not in DAYS for d in days):
            raise WindowError(f"window days must be a non-empty list of {', '.join(DAYS)}")
    return availability


def _intervals(availability, around_utc):
    """Open intervals (UTC, aware) of windows starting from 8 days before to 8 days after."""
    tz = ZoneInfo(availability.get("timezone") or "UTC")
    local_day = around_utc.astimezone(tz).date()
    for offset in range(-8, 9):
        day = local_day + dt.timedelta(days=offset)
        for w in availability["windows"]:
            if DAYS[day.weekday()] not in w.get("days", DAYS):
                continue
            sh, sm = map(int, w["start"].split(":"))
            eh, em = map(int, w["end"].split(":"))
            start = dt.datetime.combine(day, dt.time(sh, sm), tz)
            end = dt.datetime.combine(day, dt.time(eh, em), tz)
            if end <= start:
                end += dt.timedelta(days=1)
            yield start.astimezone(dt.timezone.utc), end.astimezone(dt.timezone.utc)


def is_open(availability, now):
    """True when `now` (naive UTC) falls in a window, or when the fleet has no windows."""
    if not availability:
        return True
    now_utc = now.replace(tzinfo=dt.timezone.utc)
    return any(start <= now_utc < end for start, end in _intervals(availability, now_utc))


def next_open_at(availability, now):
    """When the next window opens (naive UTC), or None if open now or never."""
    if is_open(availability, now):
        return None
    now_utc = now.replace(tzinfo=dt.timezone.utc)
    starts = [start for start, _ in _intervals(availability, now_utc) if start > now_utc]
    return min(starts).replace(tzinfo=None) if starts else None
