"""Helpers every test package shares: polling (`wait_until`)."""

from tests.support.polling import wait_until

__all__ = ["wait_until"]
