"""Availability windows: open/closed and the next opening, across midnight and time zones."""

import datetime as dt

import pytest

from fleetd.windows import WindowError, is_open, next_open_at, validate

NIGHTS_PARIS = {"timezone": "Europe/Paris", "windows": [{"start": "20:00", "end": "08:00"}]}


def utc(*args):
    return dt.datetime(*args)


def test_overnight_window_in_a_time_zone():
    # 2026-01-05 is a Monday; Paris is UTC+1 in January.
    assert is_open(NIGHTS_PARIS, utc(2026, 1, 5, 19, 0))  # 20:00 Paris
    assert is_open(NIGHTS_PARIS, utc(2026, 1, 6, 6, 59))  # 07:59 Paris
    assert not is_open(NIGHTS_PARIS, utc(2026, 1, 6, 7, 0))  # 08:00 Paris
    assert next_open_at(NIGHTS_PARIS, utc(2026, 1, 6, 12, 0)) == utc(2026, 1, 6, 19, 0)
    assert next_open_at(NIGHTS_PARIS, utc(2026, 1, 6, 20, 0)) is None


def test_summer_time_moves_the_window_in_utc():
    assert next_open_at(NIGHTS_PARIS, utc(2026, 7, 6, 12, 0)) == utc(2026, 7, 6, 18, 0)  # UTC+2


def test_weekend_only_window():
    weekends = {
        "timezone": "UTC",
        "windows": [{"start": "00:00", "end": "00:00", "days": ["sat", "sun"]}],
    }
    assert not is_open(weekends, utc(2026, 1, 9, 23, 59))  # Friday
    assert is_open(weekends, utc(2026, 1, 10, 0, 0))  # Saturday
    assert is_open(weekends, utc(2026, 1, 11, 23, 59))
    assert next_open_at(weekends, utc(2026, 1, 12, 9, 0)) == utc(2026, 1, 17, 0, 0)


def test_no_availability_means_always_open():
    assert is_open(None, utc(2026, 1, 1, 3, 0)) and next_open_at(None, utc(2026, 1, 1)) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"timezone": "Mars/Olympus", "windows": [{"start": "20:00", "end": "08:00"}]},
        {"timezone": "UTC", "windows": []},
        {"timezone": "UTC", "windows": [{"start": "25:00", "end": "08:00"}]},
        {"timezone": "UTC", "windows": [{"start": "20:00", "end": "08:00", "days": ["someday"]}]},
        {"timezone": "UTC", "windows": [{"start": "20:00"}]},
        {"tz": "UTC"},
    ],
)
def test_malformed_availability_is_refused(bad):
    with pytest.raises(WindowError):
        validate(bad)
