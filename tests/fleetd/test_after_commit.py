"""One way to act after a commit (db.after_commit), and a Runtime that holds all of a process's
state."""

import pytest

from fleetd.db import after_commit, database, savepoint, write_transaction
from fleetd.liveness import Notifier


def test_hooks_run_once_the_outermost_write_transaction_commits_and_never_after_a_rollback(app):
    ran = []
    with app.app_context(), database.connection_context():
        with write_transaction():
            after_commit(lambda: ran.append("outer"))
            with write_transaction():
                after_commit(lambda: ran.append("inner"))
            assert ran == []  # the inner block committed nothing yet
        assert ran == ["outer", "inner"]
        with pytest.raises(KeyError), write_transaction():
            after_commit(lambda: ran.append("rolled back"))
            raise KeyError("refused")
        after_commit(lambda: ran.append("no transaction"))  # at once
    assert ran == ["outer", "inner", "no transaction"]


def test_a_savepoint_that_rolls_back_drops_its_hooks_and_keeps_the_others(app):
    ran = []
    with app.app_context(), database.connection_context():
        with write_transaction():
            after_commit(lambda: ran.append("before"))
            with pytest.raises(ValueError), savepoint():
                after_commit(lambda: ran.append("refused report"))
                raise ValueError("stale epoch")
            with savepoint():
                after_commit(lambda: ran.append("settled report"))
    assert ran == ["before", "settled report"]


def test_a_hook_inside_a_bare_atomic_is_refused_rather_than_left_for_a_later_transaction(app):
    with app.app_context(), database.connection_context():
        with pytest.raises(RuntimeError, match="write_transaction"), database.atomic():
            after_commit(lambda: None)


def test_a_notify_inside_a_transaction_is_sent_only_after_the_commit(app):
    notifier = Notifier()
    sent = []
    notifier.publish = sent.append  # what the other replicas would be told
    with app.app_context(), database.connection_context():
        with write_transaction():
            notifier.notify(("job", "j1"))
            assert sent == []
        assert sent == [("job", "j1")]
        with pytest.raises(KeyError), write_transaction():
            notifier.notify(("job", "j2"))
            raise KeyError("rolled back")
    assert sent == [("job", "j1")]


def test_two_apps_in_one_process_share_no_state(make_app):
    first, second = make_app().extensions["fleetd"], make_app().extensions["fleetd"]
    first.stops.owe("node-1", "task-1", 1)
    assert first.stops.owed("node-1") and not second.stops.owed("node-1")
    for name in (
        "stops",
        "terms",
        "parked",
        "inventory",
        "engines",
        "pass_lock",
        "notifier",
        "scheduler",
        "tasks",
        "instruments",
    ):
        assert getattr(first, name) is not None and getattr(first, name) is not getattr(
            second, name
        ), name
