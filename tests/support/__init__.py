"""Helpers every test package shares: polling (`wait_until`), the HTTP test clients (`tests.support.http`)
and fake GPU reports (`tests.support.gpus`)."""

from tests.support.polling import wait_until

__all__ = ["wait_until"]
