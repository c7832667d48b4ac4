"""The first hour of a new user with the `fleetd` CLI against a real `fleetd serve`: field errors,
wrong URLs, `job why`, per-GPU allocation, numbers, 403s, `submit --wait` output, join tokens run as
printed."""

import json
import os
import queue
import shlex
import subprocess
import sys
import threading

import pytest
import requests

from tests.conftest import gpus
from tests.integration.conftest import fleetd_cmd
from tests.integration.test_cli import run  # noqa: F401 - the fixture
from tests.support import wait_until

pytestmark = pytest.mark.integration


def stand_in_node(run, url, gpu_count=2, fleet="gpu-a"):
    """A registered, heartbeating stand-in node: (node id, the protocol headers of its session)."""
    run("fleet", "create", fleet, "--no-validation")  # stand-ins run no checks
    token = json.loads(run("join-token", "create", "--fleet", fleet, "--json").stdout)["token"]
    headers = {"X-Fleet-Protocol": "1"}
    reg = requests.post(
        url + "/api/v1/agent/register",
        timeout=30,
        json={
            "hostname": "h1",
            "machine_id": "m1",
            "agent_version": "0.1",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**35},
            "gpus": gpus(gpu_count),
        },
        headers={"Authorization": f"Bearer {token}", **headers},
    ).json()
    headers["Authorization"] = f"Bearer {reg['session_token']}"
    requests.post(url + "/api/v1/agent/heartbeat", json={}, timeout=30, headers=headers)
    return reg["node_id"], headers


def schedule_now(url, admin):
    """One pass of the scheduler that starts after this call (the serve loop's own pass may be
    running)."""

    def run_pass():
        resp = requests.post(
            url + "/api/v1/admin/tasks/scheduling/run",
            timeout=30,
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert resp.status_code in (200, 409), resp.text  # 409: a pass is running
        return resp.json() if resp.status_code == 200 else None

    return wait_until(run_pass, 60, 0.01, "the scheduling task to run")


def submitter(run, team="ml"):
    return json.loads(
        run(
            "token",
            "create",
            "--name",
            f"s-{team}",
            "--role",
            "submitter",
            "--team",
            team,
            "--json",
        ).stdout
    )["token"]


# ---------------------------------------------------------------- item 1: field errors


def test_validation_errors_print_each_field_and_why_one_per_line(run, tmp_path):
    run("fleet", "create", "gpu-a", "--no-validation")
    assert run("join-token", "create", "--fleet", "gpu-a", "--ttl", "30", expect=1).stderr == (
        "fleetd: invalid_request: ttl_seconds: Must be greater than or equal to 60 and less than "
        "or equal to 31536000.\n"
    )
    window = run(
        "fleet", "update", "gpu-a", "--window", "25:00-26:00", expect=1
    ).stderr.splitlines()
    assert window == [
        "fleetd: invalid_request: the request did not validate",
        "  availability.windows[0].end: HH:MM (24 h)",
        "  availability.windows[0].start: HH:MM (24 h)",
    ]
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: typo\ncommand: [python3, train.py]\nresources: {gpus: 1, gpu: 2}\nenvv: {A: b}\n"
    )
    typo = run("job", "submit", "-f", str(spec), expect=1).stderr.splitlines()
    assert typo == [
        "fleetd: invalid_request: the request did not validate",
        "  envv: Unknown field.",
        "  resources.gpu: Unknown field.",
    ]


# ---------------------------------------------------------------- item 8: wrong URLs


def test_wrong_urls_say_what_is_wrong_and_the_fix(run, server):
    host_port = server.url.split("://", 1)[1]
    https = run("fleet", "list", expect=1, FLEETD_URL=f"https://{host_port}").stderr
    assert (
        https == f"fleetd: https://{host_port} speaks plain HTTP, not TLS: use http://{host_port}\n"
    )
    no_scheme = run("fleet", "list", expect=1, FLEETD_URL=host_port).stderr
    assert no_scheme == (
        f"fleetd: fleetd URL '{host_port}' has no scheme: use http://{host_port} "
        "(or https:// when fleetd is served with TLS)\n"
    )
    other_path = run("fleet", "list", expect=1, FLEETD_URL=server.url + "/fleetd").stderr
    assert other_path.startswith(
        f"fleetd: not_found: {server.url}/fleetd has no fleetd API at /fleetd/api/v1/"
    )
    assert "check your spelling" not in other_path
    # The API's own base path, copied from docs/api.md, is the same server.
    run("fleet", "create", "via-api-path", FLEETD_URL=server.url + "/api/v1/")
    assert "via-api-path" in run("fleet", "list", FLEETD_URL=server.url + "/api/v1").stdout


# ---------------------------------------------------------------- item 12: 403


def test_forbidden_says_which_token_the_command_needs_without_a_contradicting_hint(run):
    proc = run("fleet", "create", "x", expect=1, FLEETD_TOKEN=submitter(run))
    assert proc.stderr == (
        "fleetd: forbidden: role 'submitter' may not do this: `fleetd fleet create` needs "
        "an admin token\n"
    )


# ---------------------------------------------------------------- item 2: job why


def test_job_why_of_a_quota_blocked_job_names_the_quota_first_then_where_it_would_go(
    run, server, admin
):
    node_id, _ = stand_in_node(run, server.url)
    run("quota", "set", "ml", "--max-gpus", "1")
    job = json.loads(
        run(
            "job", "submit", "--gpus", "2", "--json", "--", "true", FLEETD_TOKEN=submitter(run)
        ).stdout
    )
    schedule_now(server.url, admin)
    why = run("job", "why", job["id"]).stdout.splitlines()
    assert why[0] == (
        f"job {job['id']} is queued, blocked: team ml at its quota for all classes: "
        f"holds 0 of 1 GPUs, job needs 2"
    )
    assert why[1] == f"it would go to {node_id} once that is lifted"
    assert "fits now" not in "\n".join(why)


def test_job_why_of_a_job_no_node_fits_names_each_node_and_no_blocker(run, server, admin):
    node_id, _ = stand_in_node(run, server.url)
    job = json.loads(run("job", "submit", "--gpus", "4", "--json", "--", "true").stdout)
    schedule_now(server.url, admin)
    why = run("job", "why", job["id"]).stdout
    assert why.startswith(
        f"job {job['id']} is queued: "
    )  # then the pending reason, in the scheduler's words
    assert f"{node_id}  gpu_count  node has 2 usable GPU(s), job needs 4" in why
    assert "blocked:" not in why and "would go to" not in why


def test_job_why_of_a_running_job_says_it_waits_for_nothing(run, server, admin):
    stand_in_node(run, server.url)
    job = json.loads(run("job", "submit", "--gpus", "1", "--json", "--", "true").stdout)
    schedule_now(server.url, admin)
    assert run("job", "why", job["id"]).stdout.strip() == (
        f"job {job['id']} is running: it waits for nothing (`fleetd job show {job['id']}` says "
        f"where it runs)"
    )


# ---------------------------------------------------------------- item 7: allocation per GPU


def test_node_show_says_which_job_holds_each_gpu_and_tells_a_submitter_it_cannot(
    run, server, admin
):
    node_id, _ = stand_in_node(run, server.url)
    job = json.loads(run("job", "submit", "--gpus", "0.5", "--json", "--", "sleep", "60").stdout)
    schedule_now(server.url, admin)
    shown = json.loads(run("job", "show", job["id"], "--json").stdout)
    held = shown["tasks"][0]["gpus"][0]
    lines = {
        line.split()[1]: line
        for line in run("node", "show", node_id).stdout.splitlines()
        if line.strip().startswith(("0 ", "1 "))
    }
    other = next(uuid for uuid in lines if uuid != held)
    assert f" used   job {job['id']} rank 0 (" in lines[held] and "50% compute" in lines[held]
    assert " free " in lines[other] and job["id"] not in lines[other]
    as_submitter = run("node", "show", node_id, FLEETD_TOKEN=submitter(run)).stdout
    assert "shown to admins only" in as_submitter and job["id"] not in as_submitter


# ---------------------------------------------------------------- items 10, 11: windows and numbers


def test_fleet_show_prints_the_availability_windows(run):
    run("fleet", "create", "gpu-a", "--no-validation")
    assert "always open" in run("fleet", "show", "gpu-a").stdout
    run(
        "fleet",
        "update",
        "gpu-a",
        "--window",
        "20:00-08:00@mon,tue",
        "--window",
        "00:00-00:00@sat,sun",
        "--timezone",
        "Europe/Paris",
    )
    assert (
        "AVAILABILITY  open 20:00-08:00@mon,tue, 00:00-00:00@sat,sun (Europe/Paris); GPUs are "
        "blocked outside" in run("fleet", "show", "gpu-a").stdout
    )


def test_gpu_counts_print_whole_numbers_as_integers_fractions_as_fractions_with_the_right_plural(
    run, server
):
    stand_in_node(run, server.url)
    assert (
        run("quota", "set", "ml", "--max-gpus", "1").stdout.strip()
        == "team ml: at most 1 GPU (any)"
    )
    assert (
        run("quota", "set", "cv", "--max-gpus", "0.25").stdout.strip()
        == "team cv: at most 0.25 GPUs (any)"
    )
    quotas = run("quota", "list").stdout
    assert " 1 " in quotas and "0.25" in quotas and "1.0" not in quotas
    run("job", "submit", "--gpus", "4", "--", "true")  # more than the node has: it stays queued
    # Over its team's quota: it stays queued too, asking for half an H100.
    run(
        "job",
        "submit",
        "--gpus",
        "0.5",
        "--gpu-type",
        "NVIDIA H100 80GB HBM3",
        "--",
        "true",
        FLEETD_TOKEN=submitter(run, "cv"),
    )
    status = run("status").stdout.splitlines()
    # The series' QUEUED column counts jobs that name its model; a job that takes any model has its
    # own row.
    gpus_at = next(
        i for i, line in enumerate(status) if line.startswith("GPUs: ")
    )  # after "your use" and nodes
    assert status[gpus_at] == "GPUs: 2 total = 0 used + 2 free + 0 blocked; 4.5 queued"
    assert status[gpus_at + 2].split() == [
        "NVIDIA",
        "H100",
        "80GB",
        "HBM3",
        "2",
        "0",
        "2",
        "0",
        "0.5",
    ]
    assert status[gpus_at + 3].split() == ["any", "GPU", "model", "0", "0", "0", "0", "4"]


# ---------------------------------------------------------------- item 12: show and --wait


def test_job_show_quotes_the_command_as_a_shell_would_take_it(run):
    job = json.loads(run("job", "submit", "--json", "--", "python3", "-c", 'print("a b")').stdout)
    command = next(
        line
        for line in run("job", "show", job["id"]).stdout.splitlines()
        if line.startswith("COMMAND")
    )
    assert shlex.split(command.split(None, 1)[1]) == ["python3", "-c", 'print("a b")']


def _lines(stream):
    lines = queue.Queue()

    def pump():
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _run_one_task(url, headers, lines):
    """Acquire, start and log one task as a node would; returns (assignment, task URL),
    unfinished."""
    assignment = requests.post(
        url + "/api/v1/agent/acquire", json={"wait_seconds": 30}, timeout=60, headers=headers
    ).json()["assignment"]
    task = f"{url}/api/v1/agent/tasks/{assignment['task_id']}"
    requests.post(
        task + "/start", json={"epoch": assignment["epoch"], "pid": 1}, timeout=30, headers=headers
    )
    requests.post(
        task + "/logs",
        json={"epoch": assignment["epoch"], "lines": lines},
        timeout=30,
        headers=headers,
    )
    return assignment, task


def test_submit_wait_prints_the_jobs_output_while_it_runs_then_how_it_ended(run, server):
    _, headers = stand_in_node(run, server.url)
    proc = subprocess.Popen(
        fleetd_cmd("job", "submit", "--gpus", "1", "--wait", "--", "python3", "train.py"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=run.env,
    )
    try:
        out, err = _lines(proc.stdout), _lines(proc.stderr)
        assignment, task = _run_one_task(
            server.url, headers, [["stdout", "epoch 1"], ["stderr", "careful"]]
        )
        # Printed while the job still runs: the task has not finished yet.
        assert out.get(timeout=30) == "epoch 1\n"
        requests.post(
            task + "/finish",
            json={"epoch": assignment["epoch"], "outcome": "succeeded", "exit_code": 0},
            timeout=30,
            headers=headers,
        )
        assert out.get(timeout=30) == f"job {assignment['job_id']} succeeded\n"
        assert proc.wait(timeout=30) == 0
        said = []
        while (line := err.get(timeout=30)) is not None:
            said.append(line)
        assert said[0].startswith(
            f"job {assignment['job_id']} queued; printing its output until it ends"
        )
        assert said[1:] == ["careful\n"]
    finally:
        proc.kill()


def test_submit_wait_of_a_failing_job_exits_1_and_says_why(run, server):
    _, headers = stand_in_node(run, server.url)
    proc = subprocess.Popen(
        fleetd_cmd("job", "submit", "--gpus", "1", "--wait", "--", "false"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=run.env,
    )
    try:
        assignment, task = _run_one_task(server.url, headers, [["stdout", "boom"]])
        requests.post(
            task + "/finish",
            json={"epoch": assignment["epoch"], "outcome": "failed", "exit_code": 3},
            timeout=30,
            headers=headers,
        )
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 1
        assert out.splitlines() == [
            "boom",
            f"job {assignment['job_id']} failed (rank 0 failed: exit code 3)",
        ]
    finally:
        proc.kill()


# ---------------------------------------------------------------- item 13: join tokens


def _agent_config(tmp_path, name):
    root = tmp_path / name
    root.mkdir()
    shape = os.path.join(os.path.dirname(__file__), "..", "fixtures", "nvml", "h100_x8.json")
    config = root / "agent.toml"
    config.write_text(
        f'state_dir = {json.dumps(str(root / "state"))}\nmachine_id = "{name}"\n'
        f'[local_api]\nlisten = "127.0.0.1:0"\n[devices]\nbackend = {json.dumps("fake:" + shape)}\n'
    )
    return config


def test_join_token_is_single_use_by_default_and_its_printed_command_enrols_a_host_as_printed(
    run, server, tmp_path
):
    run("fleet", "create", "gpu-a", "--no-validation")
    out = run("join-token", "create", "--fleet", "gpu-a").stdout
    assert ": enrols 1 host until " in out.splitlines()[0]
    line = next(line for line in out.splitlines() if "fleet-agent join" in line).strip()
    assert "--token" not in line  # the secret is not in the agent's argv
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_AGENT_")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")

    def enrol(name):
        return subprocess.run(
            ["sh", "-c", f"{line} --config {shlex.quote(str(_agent_config(tmp_path, name)))}"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    first = enrol("host-1")
    assert first.returncode == 0 and first.stdout.startswith("enrolled as node "), first.stderr
    second = enrol("host-2")
    assert second.returncode == 1 and "enrolment failed" in second.stderr
    listed = json.loads(run("join-token", "list", "--fleet", "gpu-a", "--json").stdout)
    assert [(t["uses"], t["max_uses"]) for t in listed] == [(1, 1)]
    unlimited = json.loads(
        run("join-token", "create", "--fleet", "gpu-a", "--unlimited", "--json").stdout
    )
    assert unlimited["max_uses"] is None
    assert (
        "enrols any number of hosts"
        in run("join-token", "create", "--fleet", "gpu-a", "--unlimited").stdout
    )


# ---------------------------------------------------------------- item 2: work that can never run


def test_submit_says_when_no_node_could_ever_hold_a_job_and_can_refuse_it(run, server):
    stand_in_node(run, server.url, gpu_count=2)
    queued = run("job", "submit", "--gpus", "16", "--", "true").stdout
    assert "queued: no enrolled node could ever hold it: it needs 16 GPUs on one node" in queued
    refused = run("job", "submit", "--gpus", "16", "--no-wait-for-capacity", "--", "true", expect=1)
    assert refused.stderr.startswith("fleetd: conflict: no enrolled node could ever hold it")
    assert (
        len(json.loads(run("job", "list", "--json").stdout)) == 1
    )  # the refused one was not stored
