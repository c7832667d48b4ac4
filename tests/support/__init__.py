"""Helpers every test package shares: polling (`wait_until`), HTTP test clients
(`tests.support.http`), real `fleetd serve` processes and their fixtures (`tests.support.server`),
child processes whose output is kept (`tests.support.process`) and fake GPU reports
(`tests.support.gpus`)."""

from tests.support.polling import wait_until

__all__ = ["wait_until"]
