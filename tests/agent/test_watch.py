"""The shared exit watcher and tail ticker (agent/watch.py), with real processes."""

import os
import subprocess
import sys
import threading
import time

from agent.watch import ExitWatcher, Ticker


def _child(seconds):
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def _end(procs, watcher):
    """Kill and reap whatever of `procs` still runs; end the watcher's thread."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    watcher.close()


def test_the_watcher_sees_each_process_exit_and_reaps_none():
    watcher = ExitWatcher("test-exits")
    procs = [_child(0.05 * i) for i in range(6)]
    seen = [threading.Event() for _ in procs]
    try:
        watches = [watcher.watch(os.pidfd_open(p.pid), event.set) for p, event in zip(procs, seen)]
        for watch, event in zip(watches, seen):
            assert watch.join(10), "an exit was not seen"
            assert event.is_set() and not watch.is_alive()
        for proc in procs:  # still zombies: the watcher only saw them exit
            assert os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG) is not None
    finally:
        _end(procs, watcher)


def test_a_cancelled_watch_leaves_the_process_running_and_says_nothing():
    watcher = ExitWatcher("test-exits")
    proc = _child(30)
    told = threading.Event()
    try:
        watch = watcher.watch(os.pidfd_open(proc.pid), told.set)
        watch.cancel()
        assert watch.join(5) and not told.is_set()
        assert proc.poll() is None
        proc.kill()
        proc.wait()
        assert not told.wait(0.2)
    finally:
        _end([proc], watcher)


def test_a_process_that_exited_before_its_watch_is_seen_at_once():
    watcher = ExitWatcher("test-exits")
    proc = _child(0)
    try:
        pidfd = os.pidfd_open(proc.pid)
        proc.wait()  # reaped: the pidfd stays readable
        told = threading.Event()
        watcher.watch(pidfd, told.set)
        assert told.wait(5)
    finally:
        watcher.close()


def test_the_ticker_calls_until_removed_and_never_after():
    ticker = Ticker(0.01, "test-ticks")
    calls, after = [], []
    removed = threading.Event()

    def tick():
        if removed.is_set():
            after.append(1)
        calls.append(time.monotonic())
        time.sleep(0.005)  # a call in progress when remove() comes

    ident = ticker.add(tick)
    try:
        for _ in range(500):
            if len(calls) >= 5:
                break
            time.sleep(0.01)
        assert len(calls) >= 5
        ticker.remove(ident)
        removed.set()
        count = len(calls)
        time.sleep(0.1)
        assert len(calls) == count and not after
    finally:
        ticker.close()


def test_a_failing_function_does_not_stop_the_others():
    ticker = Ticker(0.01, "test-ticks")
    good = threading.Event()

    def bad():
        raise RuntimeError("broken tail")

    ticker.add(bad)
    ticker.add(good.set)
    try:
        assert good.wait(5)
    finally:
        ticker.close()
