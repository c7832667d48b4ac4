"""Tenants on one node: each task runs as its owner's uid and reaches neither another's data nor the
agent's secrets. Real processes, real files and real uids (the tests run as root, as CI does),
against the stand-in fleetd; the tasks run /usr/bin/python3, which every uid can execute (the venv
is root's)."""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from agent.client import FleetClient
from agent.isolation import Isolation
from agent.procfs import ProcessMapper, TaskKey, proc_uid
from agent.state import write_private
from agent.task.output import OutputSettings
from agent.task.runner import Runner
from agent.workers import Workers
from tests.agent.conftest import wait_until
from tests.agent.instance_support import instance_assignment
from tests.support import wait_until, wire
from tests.support.workloads import hold

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="switching users needs root and setpriv (CI runs as root)",
)

PY = "/usr/bin/python3"
ALICE = {"source": "dynamic", "user": None, "uid": 61301, "gid": 61301}
MALLORY = {"source": "dynamic", "user": None, "uid": 61302, "gid": 61302}


@pytest.fixture
def state_dir():
    """A state dir that other uids may pass through on the way to it, as /var/lib is (pytest's own
    temporary directories are root's, 0700)."""
    top = tempfile.mkdtemp(prefix="fleet-isolation-")
    os.chmod(top, 0o711)
    yield os.path.join(top, "state")
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def runner(state_dir, fleetd):
    made = Runner(
        state_dir,
        Workers(),
        lambda: FleetClient(fleetd.url, "fln_test", timeout=10),
        "127.0.0.1",
        kill_grace_seconds=1.0,
        backoff_max_seconds=0.2,
        output_settings=OutputSettings(interval_seconds=0.05, backoff_max_seconds=0.2),
    )
    yield made
    made.shutdown("test over", timeout=15)


def run(runner, fleetd, task_id, code, run_as, **overrides):
    """Run `code` with /usr/bin/python3 as `run_as`; (finish report, stdout lines, stderr lines)."""
    runner.submit(wire.assignment(task_id, [PY, "-c", code], run_as=run_as, **overrides))
    finish = fleetd.wait_outcome(task_id)
    return finish, fleetd.texts(task_id, "stdout"), fleetd.texts(task_id, "stderr")


PROBE = (
    "import json, os\n"
    "print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(), 'groups': "
    "os.getgroups(),\n"
    "    'cwd': os.getcwd(), 'home': os.environ.get('HOME'), 'user': os.environ.get('USER'),\n"
    "    'nnp': [l for l in open('/proc/self/status') if "
    "l.startswith('NoNewPrivs')][0].split()[1],\n"
    "    'cap_eff': [l for l in open('/proc/self/status') if "
    "l.startswith('CapEff')][0].split()[1],\n"
    "    'mode': oct(os.stat('.').st_mode & 0o777), 'owner': os.stat('.').st_uid}))\n"
)


def test_a_task_runs_as_its_owners_uid_with_no_privileges_in_a_directory_of_its_own(runner, fleetd):
    finish, out, _ = run(runner, fleetd, "t-alice", PROBE, ALICE)
    assert finish["outcome"] == "succeeded", finish
    seen = json.loads(out[0])
    assert (seen["uid"], seen["euid"], seen["gid"], seen["groups"]) == (61301, 61301, 61301, [])
    assert seen["nnp"] == "1" and int(seen["cap_eff"], 16) == 0
    assert seen["owner"] == 61301 and seen["mode"] == "0o700"
    assert seen["home"] == seen["cwd"] and seen["user"] is None


def test_root_only_when_fleetd_says_so_and_nobody_when_it_says_nothing(runner, fleetd):
    finish, out, _ = run(runner, fleetd, "t-root", PROBE, wire.ROOT)
    assert finish["outcome"] == "succeeded" and json.loads(out[0])["uid"] == 0
    assert json.loads(out[0])["nnp"] == "1"
    finish, out, _ = run(runner, fleetd, "t-old-fleetd", PROBE, None)
    assert finish["outcome"] == "succeeded", finish
    assert json.loads(out[0])["uid"] == 65534  # nobody


def test_a_task_cannot_read_the_agents_tokens_nor_list_its_state(runner, fleetd, state_dir):
    write_private(os.path.join(state_dir, "session.token"), "fln_secret\n")
    write_private(os.path.join(state_dir, "local-api.token"), "fll_secret\n")
    code = (
        "import os, sys\n"
        "state = sys.argv[1]\n"
        "for what in ('session.token', 'local-api.token'):\n"
        "    try:\n"
        "        open(os.path.join(state, what)).read(); print(what, 'READ')\n"
        "    except OSError as exc:\n"
        "        print(what, type(exc).__name__)\n"
        "for where in (state, os.path.join(state, 'tasks'), os.path.join(state, 'volumes')):\n"
        "    try:\n"
        "        os.listdir(where); print(where, 'LISTED')\n"
        "    except OSError as exc:\n"
        "        print(where, type(exc).__name__)\n"
    )
    runner.submit(wire.assignment("t-snoop", [PY, "-c", code, state_dir], run_as=MALLORY))
    assert fleetd.wait_outcome("t-snoop")["outcome"] == "succeeded"
    lines = fleetd.texts("t-snoop", "stdout")
    assert lines[:2] == ["session.token PermissionError", "local-api.token PermissionError"]
    assert all(line.endswith("PermissionError") for line in lines[2:]) and len(lines) == 5, lines
    for name in ("session.token", "local-api.token"):
        st = os.stat(os.path.join(state_dir, name))
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, 0)
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o711


def test_one_owners_task_cannot_read_anothers_volume_while_the_owner_reads_it(
    runner, fleetd, state_dir
):
    secret = (
        "import os\n"
        "open(os.path.join(os.environ['FLEET_VOLUME'], 'secret.txt'), 'w').write('alice only')\n"
    )
    runner.submit(
        instance_assignment(
            "t-alice-inst", [PY, "-c", secret], instance_id="inst-alice", run_as=ALICE
        )
    )
    assert fleetd.wait_outcome("t-alice-inst")["outcome"] == "succeeded"
    volume = os.path.join(state_dir, "volumes", "inst-alice")
    st = os.stat(volume)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (61301, 0o700)
    steal = (
        "import sys\n"
        "try:\n"
        "    print(open(sys.argv[1]).read())\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__, exc.errno)\n"
    )
    target = os.path.join(volume, "secret.txt")
    runner.submit(wire.assignment("t-mallory", [PY, "-c", steal, target], run_as=MALLORY))
    assert fleetd.wait_outcome("t-mallory")["outcome"] == "succeeded"
    assert fleetd.texts("t-mallory", "stdout") == ["PermissionError 13"]
    runner.submit(
        instance_assignment(
            "t-alice-again",
            [PY, "-c", steal, target],
            instance_id="inst-alice",
            epoch=2,
            run_as=ALICE,
        )
    )
    assert fleetd.wait_outcome("t-alice-again")["outcome"] == "succeeded"
    assert fleetd.texts("t-alice-again", "stdout") == ["alice only"]


def test_an_instances_exit_status_is_recorded_by_root_where_its_task_cannot_forge_it(
    runner, fleetd, state_dir
):
    forge = (
        "import glob, os, sys\n"
        "for path in glob.glob(os.path.join(sys.argv[1], 'tasks', '*', 'exit-status')) + "
        "[os.path.join(sys.argv[1], 'tasks', 't-forge.1', 'exit-status')]:\n"
        "    try:\n"
        "        open(path, 'w').write('0'); print('FORGED', path)\n"
        "    except OSError as exc:\n"
        "        print(type(exc).__name__)\n"
        "sys.exit(3)\n"
    )
    runner.submit(
        instance_assignment(
            "t-forge", [PY, "-c", forge, state_dir], instance_id="inst-forge", run_as=MALLORY
        )
    )
    finish = fleetd.wait_outcome("t-forge")
    assert (finish["outcome"], finish["exit_code"]) == ("failed", 3), finish
    assert fleetd.texts("t-forge", "stdout") == ["PermissionError"]


def test_a_dynamic_uid_that_is_a_host_users_is_refused(runner, fleetd):
    finish, _, _ = run(
        runner,
        fleetd,
        "t-taken",
        PROBE,
        {"source": "dynamic", "user": None, "uid": 65534, "gid": 65534},
    )
    assert finish["outcome"] == "failed" and "belongs to host user 'nobody'" in finish["reason"], (
        finish
    )
    finish, _, _ = run(
        runner, fleetd, "t-system", PROBE, {"source": "dynamic", "user": None, "uid": 0, "gid": 0}
    )
    assert finish["outcome"] == "failed" and "is not a task uid" in finish["reason"], finish
    finish, _, _ = run(
        runner, fleetd, "t-no-user", PROBE, {"source": "unix_user", "user": "no-such-user-here"}
    )
    assert finish["outcome"] == "failed" and "does not exist on this node" in finish["reason"], (
        finish
    )


def test_the_worker_record_says_whom_the_task_runs_as(runner, fleetd):
    code = hold(30)
    task = runner.submit(wire.assignment("t-record", [PY, "-c", code], run_as=ALICE))
    fleetd.wait_for(lambda: task.worker.state == "running", message="the task runs")
    record = runner.workers.get("t-record").to_dict()
    assert record["run_as"] == {"uid": 61301, "gid": 61301, "user": None, "source": "dynamic"}
    runner.cancel(["t-record"], "test over")
    assert fleetd.wait_outcome("t-record")["outcome"] == "cancelled"


def test_an_agent_that_is_not_root_says_isolation_none_and_runs_tasks_as_itself():
    isolation = Isolation(euid=1000, setpriv="/usr/bin/setpriv")
    caps = isolation.capabilities()
    assert caps["isolation"] == "none" and "not root" in caps["isolation_reason"]
    run_as = isolation.resolve(ALICE)
    assert (run_as.uid, run_as.source) == (1000, "agent")
    assert isolation.wrap(run_as, ["id"]) == ["id"]


def test_another_tenants_process_that_copies_a_tasks_markers_is_not_the_tasks():
    env = {"FLEET_TASK_ID": "victim", "FLEET_TASK_EPOCH": "1", "PATH": "/usr/bin:/bin"}
    argv = ["setpriv", "--reuid=61302", "--regid=61302", "--clear-groups", "--", "sleep", "30"]
    spoofer = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        wait_until(lambda: proc_uid(spoofer.pid) == 61302, message="the spoofer runs as its uid")
        assert ProcessMapper([TaskKey("victim", 1, uid=61301)]).owner(spoofer.pid) is None
        mine = TaskKey("victim", 1, uid=61302)
        assert (
            ProcessMapper([mine]).owner(spoofer.pid) is mine
        )  # the same uid: its own task's markers
    finally:
        spoofer.kill()
        spoofer.wait()


RUN_ONE = """
import sys
from agent.client import FleetClient
from agent.task.output import OutputSettings
from agent.task.runner import Runner
from agent.workers import Workers
from tests.support import wait_until, wire

url, state, code = sys.argv[1:4]  # run with -c: sys.argv[0] is "-c"
runner = Runner(state, Workers(), lambda: FleetClient(url, "fln_test", timeout=10), "127.0.0.1",
                output_settings=OutputSettings(interval_seconds=0.05))
runner.submit(wire.assignment("t-carol", ["/usr/bin/python3", "-c", code],
                              run_as={"source": "unix_user", "user": "carol"}))
wait_until(lambda: not runner.tasks(), timeout=30, message="the task's end")
runner.shutdown("done", timeout=15)
"""


def test_a_tokens_unix_user_runs_the_task_as_that_host_user_with_its_groups(
    fleetd, state_dir, tmp_path
):
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is needed to make a user in a private mount namespace")
    # The user exists only in a private mount namespace: the machine's /etc is never touched.
    passwd, group = tmp_path / "passwd", tmp_path / "group"
    passwd.write_text(
        open("/etc/passwd").read() + "carol:x:61400:61400:Carol:/home/carol:/bin/sh\n"
    )
    group.write_text(open("/etc/group").read() + "carol:x:61400:\nml-data:x:61401:carol\n")
    shell = 'mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/group && shift 2 && exec "$@"'
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            shell,
            "sh",
            str(passwd),
            str(group),
            sys.executable,
            "-c",
            RUN_ONE,
            fleetd.url,
            state_dir,
            PROBE,
        ],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert fleetd.wait_outcome("t-carol")["outcome"] == "succeeded"
    seen = json.loads(fleetd.texts("t-carol", "stdout")[0])
    assert (seen["uid"], seen["gid"], sorted(seen["groups"])) == (
        61400,
        61400,
        [61400, 61401],
    )  # initgroups
    assert (seen["home"], seen["user"], seen["nnp"]) == ("/home/carol", "carol", "1")
    assert "carol" not in open("/etc/passwd").read()


def test_a_tasks_workdir_and_artifacts_are_its_users_to_change(runner, fleetd):
    data = b"weights"
    digest = hashlib.sha256(data).hexdigest()
    fleetd.artifacts[digest] = data
    code = (
        "import os\n"
        "open('inputs/model.bin', 'ab').write(b'+tuned')\n"
        "os.makedirs('out'); open('out/log.txt', 'w').write('ok')\n"
        "print(open('inputs/model.bin', 'rb').read().decode(), os.stat('inputs').st_uid, "
        "os.stat('out').st_uid)\n"
    )
    finish, out, err = run(
        runner,
        fleetd,
        "t-art",
        code,
        ALICE,
        workdir="job/run1",
        artifacts=[{"sha256": digest, "path": "inputs/model.bin"}],
    )
    assert finish["outcome"] == "succeeded", (finish, err)
    assert out == ["weights+tuned 61301 61301"]


def test_a_unix_user_that_is_a_system_account_runs_only_where_fleetd_allowed_it(runner, fleetd):
    finish, _, _ = run(runner, fleetd, "t-daemon", PROBE, {"source": "unix_user", "user": "daemon"})
    assert finish["outcome"] == "failed" and "system account" in finish["reason"], finish
    assert "tokens_allow_system_users" in finish["reason"]
    allowed = {"source": "unix_user", "user": "daemon", "allow_system_user": True}
    finish, out, _ = run(runner, fleetd, "t-daemon-ok", PROBE, allowed)
    assert finish["outcome"] == "succeeded", finish
    assert json.loads(out[0])["uid"] == 1
