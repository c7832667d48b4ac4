"""Shared fixtures: a fresh SQLite database per test, an injected clock, API helpers, factories;
real `fleetd serve` processes (tests/support/server.py) for every test package."""

import datetime as dt
import os
import shutil

import pytest

from fleetd.app import create_app
from fleetd.db import open_database, upgrade
from fleetd.services.identity.tokens import issue_first_admin_token
from fleetd.settings import Settings
from tests.support.gpus import GPU_H100, gpus  # noqa: F401 - tests import them from here
from tests.support.http import ApiClient  # tests import it from here too
from tests.support.server import ALLOW_LOOPBACK_WEBHOOKS, admin, data_dir, server, server_factory  # noqa: F401 - fixtures

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)
LOOPBACK_RECEIVERS = ALLOW_LOOPBACK_WEBHOOKS["FLEETD_WEBHOOKS_ALLOW_TARGETS"]


# The tests that take a minute or more each (their own hosts and playbooks, fuzzers, browsers, real
# agents), longest first: they start first, side by side on the two workers, and the short ones fill
# in behind them, so a run does not end with one worker waiting on a long test the other began late.
LONG_FIRST = (
    "tests/integration/test_schemathesis.py",
    "tests/provision/test_ansible.py",
    "tests/provision/test_bootstrap.py",
    "tests/provision/",
    "tests/agent/test_graphql_e2e.py",
    "tests/integration/test_cli_first_hour.py",
    "tests/ui/",
    "tests/integration/",
    "tests/agent/",
)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        return next(
            (i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)),
            len(LONG_FIRST),
        )

    items.sort(key=rank)  # stable: the same order on every worker


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start=T0):
        self._now = start
        self._mono = 1000.0

    def now(self):
        return self._now

    def monotonic(self):
        return self._mono

    def advance(self, seconds):
        self._now += dt.timedelta(seconds=seconds)
        self._mono += seconds


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def make_settings(tmp_path):
    """Settings for a database in this test's directory; overrides as keyword arguments."""

    def make(**overrides):
        overrides.setdefault("data_dir", str(tmp_path / "data"))
        overrides.setdefault("auth_failure_limit", 10_000)
        overrides.setdefault("long_poll_max_seconds", 0.5)  # long polls in tests end quickly
        overrides.setdefault(
            "limits_requests_per_second", 0
        )  # a FakeClock never refills a token's bucket
        # nor the registrations' (tests that fire registrations at once set their own bounds)
        overrides.setdefault("max_registrations_per_second", 0)
        overrides.setdefault("max_registrations_in_flight", 0)
        overrides.setdefault("webhooks_allow_targets", LOOPBACK_RECEIVERS)
        return Settings.load(environ={}, **overrides)

    return make


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory):
    """A SQLite database file that every migration has run on, made once per test process: a test's
    new database starts as a copy of it (running the migrations again for every test would cost
    most of the unit tests' time). upgrade() still runs on the copy and finds nothing to do."""
    path = tmp_path_factory.mktemp("migrated") / "fleetd.db"
    db = open_database(f"sqlite:///{path}")
    upgrade(db)
    db.execute_sql(
        "PRAGMA wal_checkpoint(TRUNCATE)"
    )  # everything in the main file, which is what is copied
    db.close_all()
    return path


@pytest.fixture
def make_app(make_settings, clock, migrated_sqlite):
    """Build an app over this test's database (calling it again is a restart of fleetd)."""
    opened = []

    def make(clock=clock, **overrides):
        settings = make_settings(**overrides)
        url = settings.database_url
        path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
        if path is not None and not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            shutil.copyfile(migrated_sqlite, path)
        db = open_database(url, settings.sqlite_synchronous)
        upgrade(db)
        opened.append(db)
        return create_app(settings, clock=clock, db=db)

    yield make
    for db in opened:
        db.close()


@pytest.fixture
def app(make_app):
    return make_app()


def admin_client(app, clock):
    """An ApiClient for `app` holding the first admin token of its database."""
    from fleetd.db import database

    with database.connection_context():
        return ApiClient(app, issue_first_admin_token(clock.now()))


@pytest.fixture
def api(app, clock):
    """An ApiClient holding the first admin token."""
    return admin_client(app, clock)
