"""Registrations admitted per process: a rate and a bound on those being served at once."""

import pytest

from fleetd.errors import RateLimited
from fleetd.services.agents.admission import Registrations


def test_past_those_in_flight_a_registration_is_told_to_come_back_in_a_second():
    registrations = Registrations(per_second=0, in_flight=2)
    with registrations.admitted(0.0), registrations.admitted(0.0):
        with pytest.raises(RateLimited) as refused:
            with registrations.admitted(0.0):
                pass
        assert refused.value.headers == {"Retry-After": "1"}
        assert "2 registrations are being served on this fleetd (at most 2 at once)" in str(
            refused.value
        )
    with registrations.admitted(0.0):  # both ended: room again
        pass


def test_a_registration_that_fails_gives_its_place_back():
    registrations = Registrations(per_second=0, in_flight=1)
    with pytest.raises(ValueError), registrations.admitted(0.0):
        raise ValueError("refused join token")
    with registrations.admitted(0.0):
        pass


def test_the_rate_holds_a_seconds_worth_and_refills():
    registrations = Registrations(per_second=3, in_flight=0)
    for _ in range(3):
        with registrations.admitted(10.0):
            pass
    with pytest.raises(RateLimited), registrations.admitted(10.0):
        pass
    with registrations.admitted(10.34):  # a third of a second: one more
        pass
    with pytest.raises(RateLimited), registrations.admitted(10.34):
        pass
