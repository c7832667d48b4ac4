"""agent/procfs.py: the one reader of /proc, against real processes."""

import os
import signal
import subprocess
import sys

from agent.procfs import (
    group_pids,
    read_boot_id,
    read_proc,
    read_stat,
    recorded_pids,
    signal_group,
    uptime_ticks,
    wait_gone,
)
from tests.agent.conftest import wait_until

PY = sys.executable
SLEEPER = [PY, "-c", "import threading; threading.Event().wait(300)"]
# A leader whose child leaves its process group and session and clears its environment: only the
# parent chain still ties the child to the task. The child's pid goes to stdout.
LEAVER = (
    "import os, subprocess, sys, threading\n"
    "child = subprocess.Popen(" + repr(SLEEPER) + ", start_new_session=True, env={})\n"
    "print(child.pid, flush=True)\n"
    "threading.Event().wait(300)\n"
)


def _stop(*procs):
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_read_stat_sees_a_zombie_that_read_proc_counts_as_gone():
    proc = subprocess.Popen(["true"])
    wait_until(
        lambda: (info := read_stat(proc.pid)) is not None and info.state == "Z", message="a zombie"
    )
    try:
        assert read_stat(proc.pid).pgrp == os.getpgrp()
        assert read_proc(proc.pid) is None
        assert wait_gone([proc.pid], 1)  # a zombie counts as gone
    finally:
        proc.wait(10)
    assert read_stat(proc.pid) is None


def test_group_pids_lists_the_live_members_of_a_group_and_signal_group_ends_them():
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True)
    try:
        members = wait_until(
            lambda: len(pids := group_pids(leader.pid)) == 3 and pids, message="three members"
        )
        assert leader.pid in members
        assert group_pids(leader.pid, exclude=(leader.pid,)) == [
            p for p in members if p != leader.pid
        ]
        signal_group(leader.pid, signal.SIGKILL)
        assert wait_gone(members, 10)
        signal_group(leader.pid, signal.SIGKILL)  # a group that is gone: nothing raised
    finally:
        _stop(leader)


def test_recorded_pids_finds_a_child_that_left_the_group_and_its_environment_by_its_parent():
    env = dict(os.environ, FLEET_TASK_ID="t-rec", FLEET_TASK_EPOCH="2")
    created = uptime_ticks() - 1
    leader = subprocess.Popen(
        [PY, "-c", LEAVER], start_new_session=True, env=env, stdout=subprocess.PIPE
    )
    try:
        child = int(leader.stdout.readline())
        record = {
            "task_id": "t-rec",
            "epoch": 2,
            "pgid": leader.pid,
            "start_ticks": read_stat(leader.pid).start_ticks,
            "created_ticks": created,
            "boot_id": read_boot_id(),
        }
        assert sorted(recorded_pids(record)) == sorted([leader.pid, child])
        assert recorded_pids(dict(record, boot_id="another boot")) == []
        assert (
            recorded_pids(dict(record, epoch=3, start_ticks=0)) == []
        )  # another epoch, and the group not its
        assert (
            recorded_pids(dict(record, created_ticks=uptime_ticks() + 1000)) == []
        )  # older than the task
    finally:
        os.kill(child, signal.SIGKILL)
        _stop(leader)
