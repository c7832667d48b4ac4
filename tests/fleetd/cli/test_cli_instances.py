"""`fleetd instance ...` against a real `fleetd serve`: the spec the options build, tables and
--json, field errors in one place, stop / resume / rm with its question, and a run that the test's
stand-in agent starts (connect, logs, runtime figures, --wait)."""

import json
import threading

import pytest
import requests

from tests.conftest import gpus
from tests.integration.conftest import admin, data_dir, server, server_factory  # noqa: F401 - fixtures
from tests.integration.test_cli import run  # noqa: F401 - the fixture
from tests.support import wait_until

pytestmark = pytest.mark.integration

H100 = gpus(1)[0]["model"]


class Agent:
    """A registered, heartbeating stand-in for fleet-agent on 127.0.0.1."""

    def __init__(self, run, url, gpu_count=2):
        self.url = url
        run("fleet", "create", "gpu-a", "--no-validation")  # a stand-in runs no checks
        token = json.loads(run("join-token", "create", "--fleet", "gpu-a", "--json").stdout)[
            "token"
        ]
        reg = self.call(
            "/register",
            {
                "hostname": "h1",
                "machine_id": "m1",
                "agent_version": "0.1",
                "address": "127.0.0.1",
                "resources": {"cpu_count": 8, "memory_bytes": 2**35},
                "gpus": gpus(gpu_count),
            },
            token,
        )
        self.node_id, self.session = reg["node_id"], reg["session_token"]
        self.call("/heartbeat", {})

    def call(self, path, body, token=None):
        resp = requests.post(
            self.url + "/api/v1/agent" + path,
            json=body,
            timeout=30,
            headers={"Authorization": f"Bearer {token or self.session}", "X-Fleet-Protocol": "1"},
        )
        assert resp.status_code in (200, 201, 204), resp.text
        return resp.json() if resp.content else None

    def start(self, ports=()):
        """Acquire the next assignment (an instance's run) and report it started with these host
        ports."""
        assignment = self.call("/acquire", {"wait_seconds": 20})["assignment"]
        assert assignment is not None and assignment["instance"] is not None
        self.task(
            assignment,
            "start",
            pid=4242,
            ports=[{"port": p, "host_port": h, "protocol": proto} for p, h, proto in ports],
        )
        return assignment

    def task(self, assignment, action, **body):
        return self.call(
            f"/tasks/{assignment['task_id']}/{action}", dict(body, epoch=assignment["epoch"])
        )


def in_thread(fn):
    """Run `fn` in a thread; returns (thread, list that gets its result)."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_create_builds_the_spec_from_its_options_and_list_and_show_say_why_it_waits(run):
    created = json.loads(
        run(
            "instance",
            "create",
            "--name",
            "nb",
            "--gpus",
            "1",
            "--gpu-type",
            H100,
            "--cpus",
            "4",
            "--memory",
            "64G",
            "--port",
            "8888",
            "--port",
            "22/tcp",
            "--volume",
            "10G",
            "--volume-mount",
            "/data",
            "--env",
            "MODE=dev",
            "--fleet",
            "gpu-a",
            "--label",
            "zone=eu-1",
            "--restart",
            "always",
            "--idle-stop",
            "5:30m",
            "--json",
            "--",
            "jupyter",
            "lab",
            "--port",
            "8888",
        ).stdout
    )
    spec = created["spec"]
    assert spec["command"] == ["jupyter", "lab", "--port", "8888"] and spec["name"] == "nb"
    assert spec["resources"] == {
        "gpus": 1,
        "gpu_types": [H100],
        "cpus": 4.0,
        "memory_bytes": 64 * 2**30,
    }
    assert spec["ports"] == [{"port": 8888, "protocol": "http"}, {"port": 22, "protocol": "tcp"}]
    assert (spec["volume_bytes"], spec["volume_mount_path"]) == (10 * 2**30, "/data")
    assert spec["env"] == {"MODE": "dev"} and spec["restart"] == "always"
    assert spec["node_selector"]["fleet"] == "gpu-a" and spec["node_selector"]["labels"] == {
        "zone": "eu-1"
    }
    assert spec["idle_stop"] == {"gpu_util_below_percent": 5, "for_seconds": 1800}
    assert spec["priority_class"] == "on-demand" and spec["bid"] is None
    # No node at all: it waits, and says why.
    assert created["state"] == "pending" and created["pending_reason"]
    reason = created["pending_reason"]

    spot = run(
        "instance", "create", "--gpus", "2", "--spot", "--bid", "1.5", "--image", "localhost/app:1"
    ).stdout
    assert spot.startswith("instance ") and " pending: " in spot
    spot_id = spot.split()[1]
    spot_spec = json.loads(run("instance", "show", spot_id, "--json").stdout)["spec"]
    assert (spot_spec["name"], spot_spec["image"], spot_spec["command"]) == (
        "app",
        "localhost/app:1",
        [],
    )
    assert (spot_spec["priority_class"], spot_spec["bid"]) == ("spot", 1.5)

    table = run("instance", "list").stdout.splitlines()
    assert table[0].split() == [
        "ID",
        "NAME",
        "STATE",
        "NODE",
        "GPUS",
        "PORTS",
        "PRICE/H",
        "COST",
        "PENDING",
        "REASON",
    ]
    row = next(line for line in table if line.lstrip().startswith(created["id"]))
    assert row.split()[1:4] == ["nb", "pending", "-"] and f" 1 ({H100}) " in row
    assert " 8888/http, 22/tcp " in row and row.rstrip().endswith(reason)
    assert [i["id"] for i in json.loads(run("instance", "list", "--json").stdout)] == [
        created["id"],
        spot_id,
    ]
    assert json.loads(run("instance", "list", "--state", "running", "--json").stdout) == []

    shown = run("instance", "show", created["id"]).stdout
    for line in (
        "STATE           pending",
        f"PENDING REASON  {reason}",
        "VOLUME          10.0 GiB in $FLEET_VOLUME",
        "IDLE STOP       under 5% GPU utilization for 30m 00s",
        "RESTART         always",
        "COMMAND         jupyter lab --port 8888",
        "CLASS           on-demand",
    ):
        assert line in shown, line
    assert "CLASS           spot, bid 1.5" in run("instance", "show", spot_id).stdout


def test_bad_options_and_specs_are_refused_with_the_field_named(run, admin):  # noqa: F811
    usage = [
        (
            ("--port", "8888/udp", "--", "x"),
            "Invalid value for '--port': '8888/udp' is not PORT, PORT/http or PORT/tcp",
        ),
        (("--port", "70000", "--", "x"), "Invalid value for '--port'"),
        (
            ("--volume", "10X", "--", "x"),
            "Invalid value for '--volume': '10X' is not a size like 512M, 10G or 2T",
        ),
        (
            ("--idle-stop", "5", "--", "x"),
            "Invalid value for '--idle-stop': '5' is not PERCENT:DURATION",
        ),
        (("--bid", "2", "--", "x"), "--bid is a spot instance's bid: add --spot"),
        (
            (
                "--gpus",
                "1",
            ),
            "give a command after --, or --image",
        ),
    ]
    for args, message in usage:
        proc = run("instance", "create", *args, expect=2)
        assert message in proc.stderr, proc.stderr
    refused = [
        (
            ("--idle-stop", "5:30m", "--", "x"),
            "fleetd: invalid_request: idle_stop: idle stop watches GPU utilisation: the instance "
            "needs GPUs",
        ),
        (
            ("--env", "FLEET_VOLUME=/", "--", "x"),
            "fleetd: invalid_request: env: FLEET_* variables are set by fleet-agent",
        ),
        (
            ("--port", "22", "--port", "22/tcp", "--", "x"),
            "fleetd: invalid_request: ports: each port at most once (repeated: [22])",
        ),
        (("--volume-mount", "relative", "--", "x"), "fleetd: invalid_request: volume_mount_path: "),
    ]
    for args, message in refused:
        proc = run("instance", "create", *args, expect=1)
        assert proc.stderr.startswith(message), proc.stderr
        assert "Traceback" not in proc.stderr
    assert json.loads(run("instance", "list", "--json").stdout) == []  # nothing was created

    mine = json.loads(run("instance", "create", "--json", "--", "sleep", "1d").stdout)["id"]
    submitter = json.loads(
        run("token", "create", "--name", "alice", "--role", "submitter", "--json").stdout
    )["token"]
    proc = run("instance", "show", mine, expect=1, FLEETD_TOKEN=submitter)
    assert proc.stderr.strip() == (
        f"fleetd: not_found: instance {mine} not found: no instance this token may see "
        "has that id or name"
    )
    run("instance", "stop", mine, expect=1, FLEETD_TOKEN=submitter)
    assert json.loads(run("instance", "list", "--json", FLEETD_TOKEN=submitter).stdout) == []
    theirs = json.loads(
        run("instance", "create", "--json", "--", "sleep", "1d", FLEETD_TOKEN=submitter).stdout
    )
    assert theirs["owner"] == "alice"
    assert [i["id"] for i in json.loads(run("instance", "list", "--json").stdout)] == [
        mine,
        theirs["id"],
    ]
    assert [
        i["id"] for i in json.loads(run("instance", "list", "--owner", "alice", "--json").stdout)
    ] == [theirs["id"]]


def test_stop_resume_and_rm_which_asks_first(run):
    inst = json.loads(
        run(
            "instance",
            "create",
            "--gpus",
            "4",
            "--volume",
            "1G",
            "--port",
            "8888",
            "--json",
            "--",
            "sleep",
            "1d",
        ).stdout
    )
    iid = inst["id"]
    assert run("instance", "stop", iid).stdout.strip() == f"instance {iid} stopped"
    proc = run("instance", "connect", iid, expect=1)
    assert proc.stderr.strip() == f"fleetd: conflict: instance {iid} is stopped; resume it first"
    resumed = run("instance", "resume", iid, "--gpus", "2").stdout
    assert resumed.startswith(f"instance {iid} pending: ")
    assert (
        json.loads(run("instance", "show", iid, "--json").stdout)["spec"]["resources"]["gpus"] == 2
    )
    proc = run("instance", "connect", iid, expect=1)  # pending: not running yet, and no --wait
    assert proc.stderr.startswith(f"fleetd: timeout: instance {iid} is not running yet (pending)")
    assert f"`fleetd instance connect --wait {iid}` waits until it runs" in proc.stderr
    proc = run("instance", "resume", iid, expect=1)
    assert proc.stderr.startswith(f"fleetd: conflict: instance {iid} is pending; only a stopped")

    # rm asks; anything but yes keeps the instance.
    proc = subprocess_run(run, ["instance", "rm", iid], "n\n", expect=1)
    assert (
        f"delete instance {inst['name']} ({iid}) and its 1.0 GiB volume? this cannot be undone"
        in proc.stderr
    )
    assert f"instance {iid} not deleted (answer y, or pass --yes)" in proc.stderr
    assert json.loads(run("instance", "show", iid, "--json").stdout)["state"] == "pending"
    proc = subprocess_run(run, ["instance", "rm", iid], "y\n")
    assert proc.stdout.strip() == f"deleted instance {iid}"
    assert json.loads(run("instance", "list", "--json").stdout) == []
    deleted = json.loads(run("instance", "list", "--state", "deleted", "--json").stdout)
    assert [(i["id"], i["state"]) for i in deleted] == [(iid, "deleted")]
    other = json.loads(run("instance", "create", "--json", "--", "sleep", "1d").stdout)["id"]
    assert run("instance", "rm", other, "--yes").stdout.strip() == f"deleted instance {other}"
    events = json.loads(run("instance", "events", iid, "--json").stdout)
    assert [
        (e["from_status"], e["to_status"]) for e in events if e["kind"] == "instance.state"
    ] == [("pending", "stopped"), ("stopped", "pending"), ("pending", "deleted")]


def subprocess_run(run, args, stdin, expect=0):
    """`fleetd ARGS` with this text on its standard input (run's environment)."""
    import subprocess

    from tests.integration.conftest import fleetd_cmd

    proc = subprocess.run(
        fleetd_cmd(*args), input=stdin, capture_output=True, text=True, timeout=60, env=run.env
    )
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc


def test_a_running_instance_connect_logs_runtime_and_stop(run, server):  # noqa: F811
    agent = Agent(run, server.url)
    # --wait: the command returns once the node has started it.
    waiting, created = in_thread(
        lambda: run(
            "instance",
            "create",
            "--name",
            "nb",
            "--gpus",
            "1",
            "--port",
            "8888",
            "--port",
            "22/tcp",
            "--volume",
            "1G",
            "--wait",
            "--",
            "python3",
            "-m",
            "http.server",
        )
    )
    assignment = agent.start([(8888, 40888, "http"), (22, 40022, "tcp")])
    iid = assignment["instance"]["id"]
    waiting.join(timeout=60)
    assert created, "create --wait did not return"
    assert created[0].stdout.strip() == f"instance {iid} running"
    assert f"instance {iid} " in created[0].stderr and "waiting until it runs" in created[0].stderr

    assert (
        run("instance", "connect", iid, "--port", "8888").stdout.strip()
        == "http://127.0.0.1:40888/"
    )
    conn = json.loads(run("instance", "connect", iid, "--port", "22", "--json").stdout)
    assert conn == {
        "url": "tcp://127.0.0.1:40022",
        "host": "127.0.0.1",
        "port": 40022,
        "protocol": "tcp",
    }
    proc = run("instance", "connect", iid, expect=1)
    assert proc.stderr.startswith(f"fleetd: invalid_request: instance {iid} declares several ports")
    row = next(
        line
        for line in run("instance", "list").stdout.splitlines()
        if line.lstrip().startswith(iid)
    )
    assert (
        row.split()[1:4] == ["nb", "running", agent.node_id]
        and "8888/http->40888, 22/tcp->40022" in row
    )

    # What the node reports about the run shows in `show`.
    agent.call(
        "/heartbeat",
        {
            "tasks": [
                {"id": assignment["task_id"], "epoch": assignment["epoch"], "state": "running"}
            ],
            "instances": [
                {
                    "task_id": assignment["task_id"],
                    "epoch": assignment["epoch"],
                    "uptime_seconds": 3725,
                    "restarts": 2,
                    "gpus": [
                        {
                            "uuid": gpus(1)[0]["uuid"],
                            "gpu_util_percent": 37.0,
                            "memory_util_percent": 12.5,
                        }
                    ],
                    "container": {"cpu_percent": 85.0, "memory_percent": 3.125},
                    "volume_used_bytes": 2**29,
                }
            ],
        },
    )
    shown = run("instance", "show", iid).stdout
    for line in (
        "STATE           running",
        f"NODE            {agent.node_id}",
        "RESTARTS        2",
        "VOLUME          1.0 GiB in $FLEET_VOLUME, 512.0 MiB used",
        "CPU, MEMORY     85% CPU, 3.1% memory",
    ):
        assert line in shown, line
    assert (
        "STOPPED         -\n" in shown and " at /workspace" not in shown
    )  # no stop time while it runs
    assert any(line.split() == [gpus(1)[0]["uuid"], "37", "12.5"] for line in shown.splitlines()), (
        shown
    )
    assert any(
        line.split() == ["8888", "http", "40888", "127.0.0.1", "no"] for line in shown.splitlines()
    ), shown

    agent.task(assignment, "logs", lines=[["stdout", "serving on 8888"], ["stderr", "GET / 200"]])
    logs = run("instance", "logs", iid)
    assert logs.stdout == "serving on 8888\n" and logs.stderr == "GET / 200\n"
    as_json = [
        json.loads(line) for line in run("instance", "logs", iid, "--json").stdout.splitlines()
    ]
    assert [(line["stream"], line["text"]) for line in as_json] == [
        ("stdout", "serving on 8888"),
        ("stderr", "GET / 200"),
    ]

    # logs -f prints what comes until the instance has stopped.
    following, followed = in_thread(lambda: run("instance", "logs", iid, "--follow"))
    agent.task(assignment, "logs", lines=[["stdout", "last words"]])
    said = run("instance", "stop", iid).stdout.strip()
    assert said == f"instance {iid} stopping"
    reply = agent.call("/acquire", {"wait_seconds": 0})
    assert assignment["task_id"] in reply["cancel"]
    assert following.is_alive()  # stopping: its processes have not ended yet
    agent.task(assignment, "finish", outcome="cancelled", exit_code=143, reason="stopped")
    following.join(timeout=60)
    assert followed, "logs --follow did not end when the instance stopped"
    assert followed[0].stdout == "serving on 8888\nlast words\n"
    stopped = json.loads(run("instance", "show", iid, "--json").stdout)
    assert stopped["state"] == "stopped" and stopped["runtime"] is None


def test_connect_wait_answers_once_the_instance_runs(run, server):  # noqa: F811
    agent = Agent(run, server.url)
    iid = json.loads(
        run("instance", "create", "--gpus", "1", "--port", "8888", "--json", "--", "x").stdout
    )["id"]
    waiting, answered = in_thread(lambda: run("instance", "connect", iid, "--wait"))
    wait_until(
        lambda: json.loads(run("instance", "show", iid, "--json").stdout)["state"] == "starting",
        message="the run placed",
    )
    assert waiting.is_alive() and not answered
    assignment = agent.start([(8888, 41000, "http")])
    waiting.join(timeout=60)
    assert answered and answered[0].stdout.strip() == "http://127.0.0.1:41000/"
    # stop --wait answers once the node reports its processes ended, not when it was asked.
    stopping, stopped = in_thread(lambda: run("instance", "stop", iid, "--wait"))
    wait_until(
        lambda: assignment["task_id"] in agent.call("/acquire", {"wait_seconds": 0})["cancel"],
        message="the node told to stop the run",
    )
    assert stopping.is_alive() and not stopped
    agent.task(assignment, "finish", outcome="cancelled", exit_code=143)
    stopping.join(timeout=60)
    assert stopped and stopped[0].stdout.strip() == f"instance {iid} stopped"


def test_create_wait_prints_why_the_instance_failed_and_show_its_last_exit(run, server):  # noqa: F811
    agent = Agent(run, server.url)
    waiting, created = in_thread(
        lambda: run(
            "instance", "create", "--name", "loop", "--gpus", "1", "--wait", "--", "false", expect=1
        )
    )
    assignment = agent.call("/acquire", {"wait_seconds": 20})[
        "assignment"
    ]  # it ends before its start report
    iid = assignment["instance"]["id"]
    agent.task(assignment, "restart", exit_code=126, reason="exit code 126", backoff_seconds=1)
    shown = run("instance", "show", iid).stdout
    assert "STATE           restarting" in shown and "LAST EXIT       exit code 126 at " in shown, (
        shown
    )
    assert "; starts again in 1s" in shown
    agent.task(
        assignment,
        "finish",
        outcome="failed",
        exit_code=126,
        reason="exit code 126; restart policy on-failure gave up after 10 restarts",
    )
    waiting.join(timeout=60)
    assert created, "create --wait did not return"
    assert created[0].stdout.strip() == (
        f"instance {iid} failed: exit code 126; restart policy on-failure gave up after 10 restarts"
    )
    row = next(
        line
        for line in run("instance", "list").stdout.splitlines()
        if line.lstrip().startswith(iid)
    )
    assert row.split()[1:3] == ["loop", "failed"] and "stopping" not in row


def test_logs_follow_ends_when_the_instance_is_deleted_meanwhile(run):
    iid = json.loads(
        run("instance", "create", "--gpus", "1", "--json", "--", "sleep", "1d").stdout
    )["id"]
    following, followed = in_thread(lambda: run("instance", "logs", iid, "--follow"))
    # pending: no node has it, so a delete makes it gone at once (a GET of it answers 404)
    assert run("instance", "rm", iid, "--yes").stdout.strip() == f"deleted instance {iid}"
    following.join(timeout=60)
    assert followed and followed[0].returncode == 0, (
        "logs --follow did not end once the instance was gone"
    )
