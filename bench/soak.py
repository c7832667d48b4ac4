#!/usr/bin/env python3
"""Crash consistency soak: real agents and a real fleetd killed under load; nothing lost, run twice,
stuck or leaked.

One `fleetd serve` (SQLite, a temporary data dir, a fixed loopback port so that it can be restarted
where its agents look for it) and three `fleet-agent run` processes on fake 8 x H100 hosts, in a
fleet without `allow_root_tasks`: every task runs as its submitter's own uid. The load comes from
processes of its own (this file with --role): three submitters, each with its own submitter token,
about 9 jobs/s together (1-3 s of `sleep`, a tenth exiting 1 on purpose, a tenth two-node gangs,
half-GPU and 2-GPU jobs, a third with retry {max_attempts: 3, on: [node_lost, failed]}), and one
that creates, stops, resumes and deletes an instance in a loop. Chaos meanwhile: every
--agent-kill-every seconds one agent (in turn) gets SIGKILL (SIGTERM with --sigterm) and is started
again 5 s after it ended; once, mid-run, fleetd gets SIGKILL and is started again at once.

Every task writes its own run into a side-effect log (a 1777 directory), independently of fleetd:
`S|E|K job epoch rank pid time [exit]` at its start, its end, and on SIGTERM. After the load stops
the queue gets --drain-seconds to drain; then:

  acknowledged   jobs whose submission was answered 201
  lost           acknowledged jobs that fleetd does not know, or that are not terminal after the
                 drain
  ran twice      succeeded jobs one of whose ranks ran to completion (exit 0) more than once
  ran at once    jobs of which two runs of one rank (different epochs) overlapped in time
  wrong outcome  jobs that ended cancelled (nobody cancels here), or failed though they exit 0, or
                 succeeded though they exit 1
  stuck          tasks fleetd holds assigned/running whose process is not alive; instances that did
                 not reach the state asked for
  leaked GPUs    GPUs cluster/allocation shows held by no live task or instance (after the holds
                 settled), and fleetd_leaked_gpus_freed_total (summed over fleetd's lives)

with fleetd's RSS every 10 s. Prints a table, writes JSON to bench/results/soak.json (or --json),
and exits 1 when any of lost, ran twice, ran at once, wrong outcome, stuck or leaked is not 0. Every
process it starts is stopped by its pid at the end (also on Ctrl-C), and the temporary directory
removed (kept with --keep; its logs are copied to bench/results/soak-logs/ when the run found
something).

    .venv/bin/python bench/soak.py --seconds 120          # about 5 minutes with the drain
    .venv/bin/python bench/soak.py                        # the issue's run: 10 minutes of load
    .venv/bin/python bench/soak.py --seconds 300 --sigterm
"""

import argparse
import json
import os
import pathlib
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.client import HTTPConnection

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPE = ROOT / "tests" / "fixtures" / "nvml" / "h100_x8.json"
FLEET = "soak"
TERMINAL = ("succeeded", "failed", "cancelled")
ACTIVE_TASK = ("assigned", "running")
AGENTS = 3
SUBMITTERS = 3
LEAK_METRIC = "fleetd_leaked_gpus_freed_total"

# Runs as the submitter's uid under /bin/sh (dash): one line per event, each one write(2) in
# O_APPEND.
TASK_SCRIPT = r"""L="$SOAK_LOG"; me="$FLEET_JOB_ID $FLEET_TASK_EPOCH $FLEET_NODE_RANK $$"
echo "S $me $(date +%s.%N)" >>"$L"
trap 'echo "K $me $(date +%s.%N) 143" >>"$L"; exit 143' TERM INT HUP
sleep "$SOAK_SLEEP" & wait $!
echo "E $me $(date +%s.%N) $SOAK_EXIT" >>"$L"
exit "$SOAK_EXIT"
"""


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Api:
    """JSON calls on one kept-alive connection (the standard library's client: cheap on 2 cores)."""

    def __init__(self, url, token, timeout=30):
        split = urllib.parse.urlsplit(url)
        self.host, self.port, self.timeout = split.hostname, split.port, timeout
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.conn = None

    def request(self, method, path, body=None):
        """(status, parsed body); raises OSError when no answer came (the request may have been
        sent)."""
        data = None if body is None else json.dumps(body).encode()
        if self.conn is None:
            self.conn = HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.conn.request(method, path, body=data, headers=self.headers)
            resp = self.conn.getresponse()
            raw = resp.read()
        except (OSError, ValueError) as exc:  # http.client's errors are OSErrors or ValueErrors
            self.close()
            raise OSError(f"{method} {path}: {exc!r}") from exc
        if resp.getheader("Content-Type", "").startswith("application/json") and raw:
            return resp.status, json.loads(raw)
        return resp.status, raw.decode(errors="replace")

    def call(self, method, path, body=None, expect=(200, 201, 202, 204), retry_seconds=0.0):
        """The parsed answer of a call that must succeed (202: accepted, e.g. an instance `deleting`
        until its node removed the volume); connection failures retried for `retry_seconds`."""
        deadline = time.monotonic() + retry_seconds
        for _ in range(10_000):
            try:
                status, answer = self.request(method, path, body)
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(1)
                continue
            if status in expect:
                return answer
            if status in (502, 503) and time.monotonic() < deadline:
                time.sleep(1)
                continue
            raise RuntimeError(f"{method} {path} answered {status}: {str(answer)[:300]}")
        raise RuntimeError(f"{method} {path}: no answer")

    def pages(self, path, params, retry_seconds=60.0):
        """Every item of a paginated list (bounded: 1,000 pages of 1,000)."""
        items, cursor = [], None
        for _ in range(1000):
            query = dict(params, limit=1000, **({"cursor": cursor} if cursor else {}))
            page = self.call(
                "GET", f"{path}?{urllib.parse.urlencode(query)}", retry_seconds=retry_seconds
            )
            items += page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return items

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# --- the load: submitters and the instance loop, each its own process -----------------------------


class Stopping:
    """Set by SIGTERM: a load process finishes what it is doing and writes its summary."""

    def __init__(self):
        self.flag = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: self.flag.set())
        signal.signal(signal.SIGINT, lambda *_: self.flag.set())


def job_spec(rng, name, side_log, run_id):
    """One job of the mix: (spec, kind)."""
    draw = rng.random()
    kind, gpus, nodes, code = "1gpu", 1, 1, 0
    if draw < 0.1:
        kind, code = "fails", 1
    elif draw < 0.2:
        kind, nodes = "gang", 2
    elif draw < 0.45:
        kind, gpus = "half", 0.5
    elif draw < 0.6:
        kind, gpus = "2gpu", 2
    spec = {
        "name": name,
        "command": ["/bin/sh", "-c", TASK_SCRIPT],
        "num_nodes": nodes,
        "resources": {"gpus": gpus},
        "node_selector": {"fleet": FLEET},
        "env": {
            "SOAK_LOG": side_log,
            "SOAK_SLEEP": f"{rng.uniform(1, 3):.1f}",
            "SOAK_EXIT": str(code),
            "SOAK_RUN": run_id,
        },
    }
    if rng.random() < 1 / 3:
        spec["retry"] = {"max_attempts": 3, "on": ["node_lost", "failed"]}
    return spec, kind


def role_submitter(args):
    """Submit jobs at --rate per second until --seconds pass or SIGTERM; every 201 is written at
    once."""
    stopping = Stopping()
    rng = random.Random(args.seed)
    api = Api(args.url, args.token, timeout=30)
    out = pathlib.Path(args.out)
    counts = {"acknowledged": 0, "refused": 0, "ambiguous": 0, "skipped": 0, "statuses": {}}
    ambiguous = []
    interval = 1.0 / args.rate
    deadline = time.monotonic() + args.seconds
    next_at = time.monotonic()
    with open(out / f"acked-{args.index}.txt", "a") as acked:
        for seq in range(int(args.seconds * args.rate) + 1):
            now = time.monotonic()
            if stopping.flag.is_set() or now >= deadline:
                break
            if next_at > now:
                stopping.flag.wait(next_at - now)
                if stopping.flag.is_set():
                    break
            name = f"soak-s{args.index}-{seq}"
            spec, kind = job_spec(rng, name, args.side_log, args.run_id)
            try:
                status, answer = api.request("POST", "/api/v1/jobs", spec)
            except OSError as exc:
                # Refused: never reached fleetd. Anything else may have been stored without an
                # answer.
                if isinstance(exc.__cause__, ConnectionRefusedError):
                    counts["refused"] += 1
                else:
                    counts["ambiguous"] += 1
                    ambiguous.append(name)
                status = None
            if status == 201:
                counts["acknowledged"] += 1
                acked.write(
                    f"{answer['id']} {name} {kind} {spec['env']['SOAK_SLEEP']} "
                    f"{int('retry' in spec)}\n"
                )
                acked.flush()
            elif status is not None:
                counts["statuses"][str(status)] = counts["statuses"].get(str(status), 0) + 1
            next_at += interval
            if (
                next_at < time.monotonic() - 1.0
            ):  # more than a second behind: drop the backlog, keep the rate
                skipped = int((time.monotonic() - next_at) / interval)
                counts["skipped"] += skipped
                next_at += skipped * interval
    counts["ambiguous_names"] = ambiguous
    (out / f"submitter-{args.index}.json").write_text(json.dumps(counts))
    api.close()


def _wait_instance(api, instance_id, states, seconds, stopping=None):
    """Wait until the instance is in one of `states` (404 counts as deleted); returns (state, waited
    s)."""
    t0 = time.monotonic()
    state = None
    for _ in range(int(seconds) + 10):
        left = seconds - (time.monotonic() - t0)
        if left <= 0 or (stopping is not None and stopping.flag.is_set()):
            break
        try:
            status, answer = api.request(
                "GET", f"/api/v1/instances/{instance_id}?wait_seconds={max(1, min(10, int(left)))}"
            )
        except OSError:
            time.sleep(1)
            continue
        state = (
            "deleted"
            if status == 404
            else answer.get("state")
            if isinstance(answer, dict)
            else None
        )
        if state in states:
            break
        if status >= 500:
            time.sleep(1)
    return state, round(time.monotonic() - t0, 1)


def role_instances(args):
    """Create, stop, resume and delete an instance in a loop until --seconds pass or SIGTERM."""
    stopping = Stopping()
    api = Api(args.url, args.token, timeout=40)
    spec = {
        "command": ["/bin/sh", "-c", "sleep 900"],
        "resources": {"gpus": 1},
        "restart": "never",
        "node_selector": {"fleet": FLEET},
        "env": {"SOAK_RUN": args.run_id},
    }
    steps, current = [], None
    deadline = time.monotonic() + args.seconds
    step_limit = 120

    def step(cycle, what, instance_id, call, states):
        t0 = time.monotonic()
        try:
            if call:
                api.call(*call, retry_seconds=60)
            state, waited = _wait_instance(api, instance_id, states, step_limit)
        except (OSError, RuntimeError) as exc:
            state, waited = f"error: {exc}", round(time.monotonic() - t0, 1)
        steps.append(
            {
                "cycle": cycle,
                "step": what,
                "instance": instance_id,
                "state": state,
                "seconds": waited,
                "ok": state in states,
            }
        )
        return state in states

    for cycle in range(int(args.seconds) // 10 + 1):
        if stopping.flag.is_set() or time.monotonic() >= deadline:
            break
        try:
            made = api.call(
                "POST", "/api/v1/instances", dict(spec, name=f"soak-nb-{cycle}"), retry_seconds=60
            )
        except (OSError, RuntimeError) as exc:
            steps.append(
                {
                    "cycle": cycle,
                    "step": "create",
                    "instance": None,
                    "state": f"error: {exc}",
                    "seconds": 0,
                    "ok": False,
                }
            )
            stopping.flag.wait(5)
            continue
        current = made["id"]
        ok = step(cycle, "running", current, None, ("running",))
        if ok and not stopping.flag.wait(3):
            ok = step(
                cycle, "stop", current, ("POST", f"/api/v1/instances/{current}/stop"), ("stopped",)
            )
            if ok and not stopping.flag.is_set():
                ok = step(
                    cycle,
                    "resume",
                    current,
                    ("POST", f"/api/v1/instances/{current}/resume", {}),
                    ("running",),
                )
                stopping.flag.wait(3)
        if step(cycle, "delete", current, ("DELETE", f"/api/v1/instances/{current}"), ("deleted",)):
            current = None
    if (
        current is not None
    ):  # a delete that did not finish: once more, so that nothing is left running
        step(-1, "delete", current, ("DELETE", f"/api/v1/instances/{current}"), ("deleted",))
    summary = {
        "cycles": len({s["cycle"] for s in steps if s["step"] == "delete" and s["ok"]}),
        "steps": steps,
        "left": current,
    }
    (pathlib.Path(args.out) / "instances.json").write_text(json.dumps(summary))
    api.close()


# --- the processes under test ---------------------------------------------------------------------


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def proc_rss(pid):
    """VmRSS of a process in bytes, or None."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def stop_process(proc, grace=30.0):
    """SIGTERM one process we started, SIGKILL after `grace`; waits for it."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class Soak:
    """The run: fleetd, agents, load, chaos, drain and the verdict, with every process it
    started."""

    def __init__(self, args, top):
        self.args = args
        self.top = pathlib.Path(top)
        self.run_id = secrets.token_hex(6)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.fleetd = None
        self.fleetd_log = self.top / "fleetd.log"
        self.agents = [None] * AGENTS
        self.agent_dirs = []
        self.loaders = []
        self.side_dir = self.top / "side"
        self.side_log = self.side_dir / "runs.log"
        self.load_dir = self.top / "load"
        self.admin = None
        self.api = None
        self.timeline = []
        self.rss = []
        self.leak_metric = {}  # fleetd pid -> the counter's latest value in that process
        self.phase = "idle"  # idle, load, drain, verdict: RSS samples are told apart by it
        self.t0 = time.monotonic()
        self.wall0 = time.time()

    def note(self, what, **extra):
        entry = dict(at=round(time.monotonic() - self.t0, 1), what=what, **extra)
        self.timeline.append(entry)
        log(f"{what} {extra if extra else ''}")

    # fleetd

    def start_fleetd(self):
        """`fleetd serve` on the fixed port; waits until it listens."""
        logfile = open(self.fleetd_log, "a")
        logfile.write(f"==== soak: fleetd starting at {time.strftime('%H:%M:%S')}\n")
        logfile.flush()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetd",
                "serve",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--data-dir",
                str(self.top / "fleetd"),
            ],
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            start_new_session=True,
        )
        self.fleetd = proc
        deadline = time.monotonic() + 120
        listening = False
        for line in proc.stderr:
            logfile.write(line)
            if "listening on" in line:
                listening = True
                break
            if time.monotonic() > deadline:
                break
        if not listening:
            raise SystemExit(f"fleetd did not start; see {self.fleetd_log}")

        def drain():  # fleetd's log goes to a file: a full pipe would block it
            for line in proc.stderr:
                logfile.write(line)
            logfile.close()

        threading.Thread(target=drain, daemon=True).start()

    def bootstrap(self):
        """`fleetd init`, fleetd, the fleet, three submitter tokens and one for instances."""
        init = subprocess.run(
            [sys.executable, "-m", "fleetd", "init", "--data-dir", str(self.top / "fleetd")],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        self.admin = init.stdout.strip().splitlines()[-1]
        self.start_fleetd()
        self.api = Api(self.url, self.admin, timeout=60)
        self.api.call(
            "POST", "/api/v1/fleets", {"name": FLEET}
        )  # allow_root_tasks: false, the default
        self.tokens = [
            self.api.call(
                "POST", "/api/v1/tokens", {"name": f"soak-submitter-{i}", "role": "submitter"}
            )["token"]
            for i in range(SUBMITTERS)
        ]
        self.instance_token = self.api.call(
            "POST", "/api/v1/tokens", {"name": "soak-instances", "role": "submitter"}
        )["token"]

    # agents

    def join_agents(self):
        join = self.api.call("POST", f"/api/v1/fleets/{FLEET}/join-tokens", {})["token"]
        for i in range(AGENTS):
            root = self.top / f"agent-{i}"
            root.mkdir()
            config = root / "agent.toml"
            config.write_text(
                f'state_dir = "{root / "state"}"\nmachine_id = "soak-{self.run_id}-{i}"\n'
                f'log_level = "info"\n[local_api]\nlisten = "127.0.0.1:0"\n'
                f'[devices]\nbackend = "fake:{SHAPE}"\n'
            )
            env = self.agent_env(i, FLEET_AGENT_JOIN_TOKEN=join)
            joined = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "agent",
                    "join",
                    "--server",
                    self.url,
                    "--config",
                    str(config),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
                cwd=ROOT,
            )
            if joined.returncode != 0:
                raise SystemExit(
                    f"fleet-agent join failed ({joined.returncode}): {joined.stderr.strip()}"
                )
            self.agent_dirs.append(root)
            self.start_agent(i)
        for _ in range(1200):
            nodes = self.api.call("GET", f"/api/v1/nodes?fleet={FLEET}&limit=1000")["items"]
            if (
                sum(
                    n["status"] == "ready"
                    and (n.get("capabilities") or {}).get("isolation") == "uid"
                    for n in nodes
                )
                == AGENTS
            ):
                return
            time.sleep(0.1)
        raise SystemExit(f"the {AGENTS} agents did not become ready with uid isolation in 120 s")

    def agent_env(self, i, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_AGENT_", "FLEETD_"))}
        return dict(env, FLEET_AGENT_MACHINE_ID=f"soak-{self.run_id}-{i}", **extra)

    def start_agent(self, i):
        root = self.agent_dirs[i]
        with open(root / "agent.log", "a") as logfile:
            logfile.write(f"==== soak: agent {i} starting at {time.strftime('%H:%M:%S')}\n")
            logfile.flush()
            self.agents[i] = subprocess.Popen(
                [sys.executable, "-m", "agent", "run", "--config", str(root / "agent.toml")],
                stdout=logfile,
                stderr=subprocess.STDOUT,
                env=self.agent_env(i),
                cwd=ROOT,
                start_new_session=True,
            )

    # the load

    def start_load(self):
        common = [
            sys.executable,
            str(pathlib.Path(__file__).resolve()),
            "--url",
            self.url,
            "--out",
            str(self.load_dir),
            "--seconds",
            str(self.args.seconds),
            "--run-id",
            self.run_id,
        ]
        for i in range(SUBMITTERS):
            self.loaders.append(
                subprocess.Popen(
                    common
                    + [
                        "--role",
                        "submitter",
                        "--token",
                        self.tokens[i],
                        "--index",
                        str(i),
                        "--rate",
                        str(self.args.rate / SUBMITTERS),
                        "--seed",
                        str(self.args.seed + i),
                        "--side-log",
                        str(self.side_log),
                    ],
                    cwd=ROOT,
                    start_new_session=True,
                )
            )
        self.loaders.append(
            subprocess.Popen(
                common + ["--role", "instances", "--token", self.instance_token],
                cwd=ROOT,
                start_new_session=True,
            )
        )

    # chaos and sampling

    def schedule(self):
        """[(seconds after the load began, action, agent index)]: agent kills in turn, one fleetd
        kill."""
        seconds, every = self.args.seconds, self.args.agent_kill_every
        kills, at = [], min(45.0, seconds / 4)
        while at < seconds - 5 and len(kills) < 1000:
            kills.append(at)
            at += every
        events = [(t, "kill_agent", n % AGENTS) for n, t in enumerate(kills)]
        fleetd_at = seconds / 2
        near = [t for t in kills if abs(t - fleetd_at) < 20]
        if near:
            fleetd_at = max(near[0] - every / 2, 5.0)
        if not self.args.no_fleetd_kill:
            events.append((fleetd_at, "kill_fleetd", None))
        return sorted(events, key=lambda e: e[0])

    def sample(self):
        """fleetd's RSS and its leak counter."""
        pid = self.fleetd.pid if self.fleetd else None
        rss = proc_rss(pid) if pid else None
        self.rss.append(
            {
                "at": round(time.monotonic() - self.t0, 1),
                "pid": pid,
                "phase": self.phase,
                "rss_mib": round(rss / 2**20, 1) if rss else None,
            }
        )
        try:
            status, text = Api(self.url, self.admin, timeout=10).request("GET", "/metrics")
        except OSError:
            return
        if status == 200:
            match = re.search(rf"^{LEAK_METRIC} (\S+)$", text, re.M)
            if match:
                self.leak_metric[pid] = float(match.group(1))

    def chaos_loop(self):
        """The load's time: chaos on schedule, samples every 10 s; agents restarted 5 s after they
        ended."""
        events = self.schedule()
        self.note("load started", schedule=[(round(t, 1), a, i) for t, a, i in events])
        load_t0 = time.monotonic()
        restart_at = {}  # agent index -> monotonic time to start it again
        ending = {}  # agent index -> monotonic deadline of its SIGTERM
        next_sample = 0.0
        for _ in range(int(self.args.seconds * 10) + 100):
            now = time.monotonic()
            elapsed = now - load_t0
            if elapsed >= self.args.seconds:
                break
            while events and events[0][0] <= elapsed:
                _, action, i = events.pop(0)
                if (
                    action == "kill_agent"
                    and self.agents[i] is not None
                    and self.agents[i].poll() is None
                ):
                    if self.args.sigterm:
                        self.agents[i].terminate()
                        ending[i] = now + 60
                        self.note("agent SIGTERM", agent=i, pid=self.agents[i].pid)
                    else:
                        self.agents[i].kill()
                        self.agents[i].wait(10)
                        restart_at[i] = now + 5
                        self.note("agent SIGKILL", agent=i, pid=self.agents[i].pid)
                elif action == "kill_fleetd":
                    pid = self.fleetd.pid
                    self.sample()
                    self.fleetd.kill()
                    self.fleetd.wait(10)
                    self.note("fleetd SIGKILL", pid=pid)
                    self.start_fleetd()
                    self.note("fleetd started again", pid=self.fleetd.pid)
            for i, deadline in list(ending.items()):
                if self.agents[i].poll() is not None:
                    self.note("agent ended after SIGTERM", agent=i, rc=self.agents[i].returncode)
                    del ending[i]
                    restart_at[i] = time.monotonic() + 5
                elif time.monotonic() > deadline:
                    self.agents[i].kill()
            for i, at in list(restart_at.items()):
                if time.monotonic() >= at:
                    self.start_agent(i)
                    del restart_at[i]
                    self.note("agent started again", agent=i, pid=self.agents[i].pid)
            if elapsed >= next_sample:
                self.sample()
                next_sample = elapsed + 10
            time.sleep(0.1)
        for i in list(ending):  # the load ended during a graceful stop: finish it
            try:
                self.agents[i].wait(60)
            except subprocess.TimeoutExpired:
                self.agents[i].kill()
                self.agents[i].wait(10)
            restart_at[i] = 0
        for i in restart_at:
            self.start_agent(i)
            self.note("agent started again (end of load)", agent=i, pid=self.agents[i].pid)

    def stop_load(self):
        """SIGTERM to the load processes: submitters stop, the instance loop deletes its
        instance."""
        for proc in self.loaders:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.loaders:
            try:
                proc.wait(timeout=self.args.drain_seconds)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.note("load stopped")

    def drain(self):
        """Wait up to --drain-seconds for no job to be queued, running or cancelling."""
        t0 = time.monotonic()
        left = None
        next_sample = 0.0
        for _ in range(int(self.args.drain_seconds) + 10):
            if time.monotonic() - t0 >= self.args.drain_seconds:
                break
            left = sum(
                len(self.api.pages("/api/v1/jobs", {"state": s}))
                for s in ("queued", "running", "cancelling")
            )
            if time.monotonic() - t0 >= next_sample:
                self.sample()
                next_sample = time.monotonic() - t0 + 10
            if not left:
                break
            time.sleep(2)
        self.note("drain ended", seconds=round(time.monotonic() - t0, 1), not_terminal=left)
        return round(time.monotonic() - t0, 1)

    # the verdict

    def read_acked(self):
        acked = {}
        for path in sorted(self.load_dir.glob("acked-*.txt")):
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 5:
                    acked[parts[0]] = {
                        "name": parts[1],
                        "kind": parts[2],
                        "sleep": float(parts[3]),
                        "retry": parts[4] == "1",
                    }
        return acked

    def read_runs(self):
        """{(job, rank): {(epoch, pid): {start, end, how, exit}}} from the side-effect log."""
        runs = {}
        malformed = 0
        text = self.side_log.read_text() if self.side_log.exists() else ""
        for line in text.splitlines():
            parts = line.split()
            try:
                what, job, epoch, rank, pid, at = (
                    parts[0],
                    parts[1],
                    int(parts[2]),
                    int(parts[3]),
                    int(parts[4]),
                    float(parts[5]),
                )
            except (IndexError, ValueError):
                malformed += 1
                continue
            run = runs.setdefault((job, rank), {}).setdefault(
                (epoch, pid), {"start": None, "end": None, "how": None, "exit": None}
            )
            if what == "S":
                run["start"] = at
            elif what in ("E", "K") and run["end"] is None:
                run["end"], run["how"] = at, what
                run["exit"] = int(parts[6]) if len(parts) > 6 else None
        return runs, malformed, text.count("\n")

    @staticmethod
    def alive(pid, job_id):
        """Whether pid is a live process of that job (its environment names it)."""
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                return f"FLEET_JOB_ID={job_id}".encode() in fh.read().split(b"\0")
        except OSError:
            return False

    def holds(self, jobs_by_id):
        """GPUs cluster/allocation shows held, and those held by nothing alive: ({uuid}, {uuid:
        holders})."""
        allocation = self.api.call("GET", "/api/v1/cluster/allocation", retry_seconds=60)
        runs, _, _ = self.read_runs()
        instance_state = {}
        held, dead = set(), {}
        for alloc in allocation["allocations"]:
            workload = alloc.get("workload") or {}
            live = alloc.get("state") in ACTIVE_TASK
            if workload.get("kind") == "instance":
                if workload["id"] not in instance_state:
                    status, answer = self.api.request("GET", f"/api/v1/instances/{workload['id']}")
                    instance_state[workload["id"]] = (
                        answer.get("state") if status == 200 else "not found"
                    )
                live = live and instance_state[workload["id"]] not in (
                    "deleted",
                    "stopped",
                    "not found",
                )
            else:
                job = jobs_by_id.get(workload.get("id") or alloc.get("job_id"))
                if job is None:
                    status, job = self.api.request("GET", f"/api/v1/jobs/{alloc['job_id']}")
                    job = job if status == 200 else {"state": "not found"}
                live = (
                    live
                    and job["state"] not in TERMINAL
                    and any(
                        r["end"] is None and self.alive(pid, alloc["job_id"])
                        for (_, pid), r in runs.get((alloc["job_id"], alloc["rank"]), {}).items()
                    )
                )
            for gpu in alloc.get("gpus") or []:
                held.add(gpu["uuid"])
                if not live:
                    dead.setdefault(gpu["uuid"], []).append(
                        {
                            "task": alloc.get("task_id"),
                            "job": alloc.get("job_id"),
                            "rank": alloc.get("rank"),
                            "state": alloc.get("state"),
                            "workload": workload,
                        }
                    )
        live_held = {u for u in held if u not in dead}
        return held, {u: h for u, h in dead.items() if u not in live_held}

    def settle_holds(self):
        """Wait (bounded) for GPU holds of ended work to go; returns the jobs listing and the holds
        left."""
        jobs = {}
        for _ in range(20):
            jobs = {j["id"]: j for j in self.api.pages("/api/v1/jobs", {})}
            held, leaked = self.holds(jobs)
            if not leaked:
                break
            self.note("GPU holds not settled yet", held=len(held), dead=len(leaked))
            time.sleep(5)
        return jobs, held, leaked

    def verdict(self, drain_seconds):
        acked = self.read_acked()
        jobs, held, leaked = self.settle_holds()
        runs, malformed, lines = self.read_runs()
        status = self.api.call("GET", "/api/v1/cluster/status", retry_seconds=60)
        self.sample()
        outcomes = {}
        not_found, not_terminal, twice, twice_unsucceeded, at_once, maybe_at_once, stuck = (
            [],
            [],
            [],
            [],
            [],
            [],
            [],
        )
        no_end = 0
        wrong = []
        for job_id, meta in acked.items():
            job = jobs.get(job_id)
            if job is None:
                code, job = self.api.request("GET", f"/api/v1/jobs/{job_id}")
                if code != 200:
                    not_found.append(job_id)
                    continue
            outcomes[job["state"]] = outcomes.get(job["state"], 0) + 1
            # Nobody cancels here, only "fails" jobs exit non-zero: any other ending is a wrong
            # outcome.
            if (
                job["state"] == "cancelled"
                or (job["state"] == "failed") != (meta["kind"] == "fails")
                and job["state"] in TERMINAL
            ):
                wrong.append(
                    {
                        "job": job_id,
                        "kind": meta["kind"],
                        "state": job["state"],
                        "attempt": job.get("attempt"),
                        "tasks": [
                            (t["rank"], t["state"], t["reason"]) for t in job.get("tasks") or []
                        ],
                    }
                )
            if job["state"] not in TERMINAL:
                not_terminal.append(job_id)
            for task in job.get("tasks") or []:
                mine = runs.get((job_id, task["rank"]), {})
                if task["state"] in ACTIVE_TASK and not any(
                    r["end"] is None and self.alive(pid, job_id) for (_, pid), r in mine.items()
                ):
                    stuck.append(
                        {
                            "job": job_id,
                            "task": task["id"],
                            "rank": task["rank"],
                            "state": task["state"],
                            "node": task["node_id"],
                        }
                    )
            for rank in range(2 if meta["kind"] == "gang" else 1):
                mine = runs.get((job_id, rank), {})
                completed = [k for k, r in mine.items() if r["how"] == "E" and r["exit"] == 0]
                if len(completed) > 1:
                    # A gang's rank that completed, then ran again because a peer of that attempt
                    # did not: the documented gang retry, told apart from a single task run twice.
                    peers = [runs.get((job_id, other), {}) for other in range(2) if other != rank]
                    first = min(epoch for epoch, _ in completed)
                    peer_done = any(
                        e == first and r["how"] == "E" and r["exit"] == 0
                        for peer in peers
                        for (e, _), r in peer.items()
                    )
                    (twice if job["state"] == "succeeded" else twice_unsucceeded).append(
                        {
                            "job": job_id,
                            "rank": rank,
                            "runs": sorted(completed),
                            "gang": meta["kind"] == "gang",
                            "peer_completed_in_first_epoch": peer_done if peers else None,
                        }
                    )
                spans = []
                for (epoch, pid), r in mine.items():
                    if r["start"] is None:
                        continue
                    if r["end"] is None:
                        no_end += 1
                    spans.append((r["start"], r["end"], r["end"] is None, epoch, pid))
                for a in spans:
                    for b in spans:
                        if (a[3], a[4]) >= (b[3], b[4]) or a[3] == b[3]:
                            continue
                        a_end = a[1] if not a[2] else a[0] + meta["sleep"] + 0.5
                        b_end = b[1] if not b[2] else b[0] + meta["sleep"] + 0.5
                        if a[0] < b_end and b[0] < a_end:
                            (maybe_at_once if a[2] or b[2] else at_once).append(
                                {
                                    "job": job_id,
                                    "rank": rank,
                                    "runs": [(a[3], a[4]), (b[3], b[4])],
                                    "overlap_s": round(min(a_end, b_end) - max(a[0], b[0]), 2),
                                }
                            )
        ambiguous = self.resolve_ambiguous()
        instances = self.read_json(self.load_dir / "instances.json") or {}
        bad_steps = [s for s in instances.get("steps", []) if not s["ok"]]
        leak_metric = sum(self.leak_metric.values())
        submitters = [
            self.read_json(self.load_dir / f"submitter-{i}.json") or {} for i in range(SUBMITTERS)
        ]
        rss = [s["rss_mib"] for s in self.rss if s["rss_mib"]]
        by_phase = {
            p: [s["rss_mib"] for s in self.rss if s["rss_mib"] and s["phase"] == p]
            for p in ("idle", "load", "drain", "verdict")
        }
        results = {
            "commit": git_commit(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.wall0)),
            "args": {k: v for k, v in vars(self.args).items() if k not in ("token",)},
            "acknowledged": len(acked),
            "by_kind": count_by(acked.values(), "kind"),
            "outcomes": outcomes,
            "lost": len(not_found) + len(not_terminal),
            "lost_not_found": not_found,
            "lost_not_terminal": not_terminal,
            "ran_twice": len({t["job"] for t in twice}),
            "ran_twice_detail": twice,
            "ran_twice_single_node": len({t["job"] for t in twice if not t["gang"]}),
            "ran_twice_gang_rerun": len(
                {t["job"] for t in twice if t["gang"] and not t["peer_completed_in_first_epoch"]}
            ),
            "completed_twice_not_succeeded": twice_unsucceeded,
            "ran_at_once": len({t["job"] for t in at_once}),
            "ran_at_once_detail": at_once,
            "maybe_ran_at_once (an end inferred)": maybe_at_once,
            "wrong_outcome": len(wrong),
            "wrong_outcome_detail": wrong,
            "stuck": len(stuck) + len(bad_steps),
            "stuck_tasks": stuck,
            "instance_steps_not_reached": bad_steps,
            "instance_cycles": instances.get("cycles"),
            "instance_left": instances.get("left"),
            "leaked_gpus": len(leaked),
            "leaked_detail": leaked,
            "gpus_held_at_end": len(held),
            "cluster_status_gpu": status.get("gpu"),
            LEAK_METRIC: leak_metric,
            "leak_metric_by_fleetd_pid": self.leak_metric,
            "side_log": {"lines": lines, "malformed": malformed, "runs_without_end": no_end},
            "submitters": submitters,
            "ambiguous_submissions": ambiguous,
            "drain_seconds": drain_seconds,
            "fleetd_rss_mib": {
                "first": rss[0] if rss else None,
                "max": max(rss) if rss else None,
                "last": rss[-1] if rss else None,
                "max_under_load": max(by_phase["load"], default=None),
                "end_of_drain": (by_phase["drain"] or [None])[-1],
                "after_final_listing": max(by_phase["verdict"], default=None),
                "samples": self.rss,
            },
            "timeline": self.timeline,
            "log_counts": self.log_counts(),
        }
        results["evidence"] = self.evidence(results)
        return results

    def resolve_ambiguous(self):
        """Submissions that got no answer: did fleetd store them? (not counted as acknowledged
        either way)"""
        names = []
        for i in range(SUBMITTERS):
            names += (self.read_json(self.load_dir / f"submitter-{i}.json") or {}).get(
                "ambiguous_names", []
            )
        found = {}
        for name in names[:200]:
            items = self.api.call(
                "GET", f"/api/v1/jobs?name={urllib.parse.quote(name)}", retry_seconds=30
            )["items"]
            found[name] = [(j["id"], j["state"]) for j in items]
        return {
            "count": len(names),
            "stored": sum(bool(v) for v in found.values()),
            "detail": found,
        }

    def log_counts(self):
        """Lines of note in the agents' and fleetd's logs."""
        patterns = {
            "agent: left from before the agent restarted": r"left from before the agent restarted",
            "agent: left from before, exit status unknown": r"exit status is unknown",
            "agent: taken back after a restart": (
                r"left from before the agent restarted; taking it back"
            ),
            "agent: lease ran out (fence)": r"lease ran out|fenced",
            "agent: stale epoch, forgotten": r"stale epoch",
            "agent: tracebacks": r"Traceback",
            "fleetd: reconciled": r"reconciled",
            "fleetd: freed a leaked GPU hold": r"freed a leaked GPU hold",
            "fleetd: cannot go from": r"cannot go from",
            "fleetd: tracebacks": r"Traceback",
        }
        agent_text = "".join(
            (d / "agent.log").read_text(errors="replace")
            for d in self.agent_dirs
            if (d / "agent.log").exists()
        )
        fleetd_text = (
            self.fleetd_log.read_text(errors="replace") if self.fleetd_log.exists() else ""
        )
        return {
            name: len(re.findall(pattern, agent_text if name.startswith("agent") else fleetd_text))
            for name, pattern in patterns.items()
        }

    def evidence(self, results):
        """For up to 10 flagged jobs: fleetd's view, its events, the side-log lines and the log
        lines naming it."""
        flagged = (
            [("not found", j) for j in results["lost_not_found"]]
            + [("not terminal", j) for j in results["lost_not_terminal"]]
            + [("ran twice", t["job"]) for t in results["ran_twice_detail"]]
            + [("ran at once", t["job"]) for t in results["ran_at_once_detail"]]
            + [("stuck", t["job"]) for t in results["stuck_tasks"]]
            + [("wrong outcome", t["job"]) for t in results["wrong_outcome_detail"]]
            + [
                ("leaked", h["job"])
                for holders in results["leaked_detail"].values()
                for h in holders
                if h.get("job")
            ]
        )
        seen, out = set(), []
        side = self.side_log.read_text().splitlines() if self.side_log.exists() else []
        logs = [
            (f"agent-{i}", (d / "agent.log").read_text(errors="replace").splitlines())
            for i, d in enumerate(self.agent_dirs)
            if (d / "agent.log").exists()
        ]
        logs.append(
            (
                "fleetd",
                self.fleetd_log.read_text(errors="replace").splitlines()
                if self.fleetd_log.exists()
                else [],
            )
        )
        for why, job_id in flagged:
            if job_id in seen or len(out) >= 10:
                continue
            seen.add(job_id)
            code, job = self.api.request("GET", f"/api/v1/jobs/{job_id}")
            code_e, events = self.api.request("GET", f"/api/v1/jobs/{job_id}/events?limit=1000")
            ids = (
                [job_id] + [t["id"] for t in (job.get("tasks") or [])] if code == 200 else [job_id]
            )
            lines = {
                name: [ln for ln in text if any(i in ln for i in ids)][:40] for name, text in logs
            }
            out.append(
                {
                    "why": why,
                    "job": job if code == 200 else None,
                    "events": events.get("items") if code_e == 200 else None,
                    "side_log": [ln for ln in side if f" {job_id} " in ln],
                    "log_lines": {k: v for k, v in lines.items() if v},
                }
            )
        return out

    @staticmethod
    def read_json(path):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    # the whole run

    def run(self):
        self.side_dir.mkdir()
        os.chmod(self.side_dir, 0o1777)  # every submitter's uid writes here
        self.side_log.touch()
        os.chmod(self.side_log, 0o666)
        self.load_dir.mkdir()
        self.bootstrap()
        self.note("fleetd up", url=self.url, pid=self.fleetd.pid)
        self.join_agents()
        self.note("agents ready", pids=[a.pid for a in self.agents])
        self.sample()
        self.phase = "load"
        self.start_load()
        self.chaos_loop()
        self.stop_load()
        self.phase = "drain"
        drain_seconds = self.drain()
        # The listings below (every job, 1,000 a page) cost fleetd memory of their own.
        self.phase = "verdict"
        return self.verdict(drain_seconds)

    def cleanup(self):
        """Stop every process this run started, by pid, and what its tasks left running."""
        for proc in self.loaders:
            stop_process(proc, grace=10)
        if self.api is not None and self.fleetd is not None and self.fleetd.poll() is None:
            self.delete_instances()
        for proc in self.agents:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.agents:
            stop_process(proc, grace=40)
        stop_process(self.fleetd, grace=30)
        self.kill_task_processes()
        self.remove_task_cgroups()

    def delete_instances(self):
        try:
            for inst in self.api.pages("/api/v1/instances", {}, retry_seconds=5):
                if inst["state"] != "deleted":
                    self.api.request("DELETE", f"/api/v1/instances/{inst['id']}")
        except (OSError, RuntimeError) as exc:
            log(f"could not delete instances at the end: {exc}")

    def kill_task_processes(self):
        """Tasks and instances of this run still alive (their environment carries this run's id):
        SIGKILL."""
        marker = f"SOAK_RUN={self.run_id}".encode()
        killed = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if marker in fh.read().split(b"\0"):
                        os.kill(int(entry), signal.SIGKILL)
                        killed.append(int(entry))
            except OSError:
                continue
        if killed:
            log(f"killed {len(killed)} task process(es) left running: {killed[:20]}")

    def remove_task_cgroups(self):
        """The task cgroups agents killed with SIGKILL left behind (a restart would remove them)."""
        try:
            from agent.cgroups import Cgroups
            from agent.task.journal import read_state
        except ImportError:
            return
        cgroups = Cgroups("")
        for root in self.agent_dirs:
            for state in (root / "state").glob("tasks/*/task.json"):
                try:
                    path = read_state(state).get("cgroup")
                except (OSError, ValueError):
                    continue
                if path and os.path.isdir(path):
                    cgroups.remove(path, attempts=5)


def count_by(items, key):
    out = {}
    for item in items:
        out[item[key]] = out.get(item[key], 0) + 1
    return out


def git_commit():
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                "fleetd",
                "agent",
                "fleetwire",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=10,
        ).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


FAILING = ("lost", "ran_twice", "ran_at_once", "wrong_outcome", "stuck", "leaked_gpus", LEAK_METRIC)


def print_report(r):
    outcomes = r["outcomes"]
    subs = r["submitters"]
    rss = r["fleetd_rss_mib"]
    rows = [
        ("acknowledged jobs (201)", f"{r['acknowledged']:,}", ""),
        ("  by kind", ", ".join(f"{k} {v}" for k, v in sorted(r["by_kind"].items())), ""),
        (
            "  not acknowledged: refused / no answer / other status",
            f"{sum(s.get('refused', 0) for s in subs)} / {r['ambiguous_submissions']['count']} "
            f"(stored {r['ambiguous_submissions']['stored']}) / "
            f"{sum(sum(s.get('statuses', {}).values()) for s in subs)}",
            "",
        ),
        (
            "succeeded / failed / cancelled",
            " / ".join(str(outcomes.get(s, 0)) for s in TERMINAL),
            "",
        ),
        (
            "lost (not found / not terminal)",
            f"{r['lost']} ({len(r['lost_not_found'])} / {len(r['lost_not_terminal'])})",
            "0",
        ),
        (
            "ran twice (succeeded, a rank completed twice)",
            f"{r['ran_twice']} (single-node "
            f"{r['ran_twice_single_node']}, gang rank rerun {r['ran_twice_gang_rerun']})",
            "0",
        ),
        ("ran at once (two runs of a rank overlapped)", str(r["ran_at_once"]), "0"),
        ("wrong outcome (cancelled, or failed though it exits 0)", str(r["wrong_outcome"]), "0"),
        (
            "stuck (tasks with no process, instance steps)",
            f"{r['stuck']} ({len(r['stuck_tasks'])} / {len(r['instance_steps_not_reached'])})",
            "0",
        ),
        ("leaked GPUs at the end", str(r["leaked_gpus"]), "0"),
        (LEAK_METRIC, f"{r[LEAK_METRIC]:g}", "0"),
        ("instance cycles (create, stop, resume, delete)", str(r["instance_cycles"]), ""),
        ("drain after the load, s", str(r["drain_seconds"]), "<= 180"),
        (
            "fleetd RSS idle / max under load / end of drain, MiB",
            f"{rss['first']} / {rss['max_under_load']} / {rss['end_of_drain']}",
            "",
        ),
        ("fleetd RSS after the bench listed every job, MiB", str(rss["after_final_listing"]), ""),
    ]
    print(f"{'measure':<52}{'value':>28}  want")
    for name, value, want in rows:
        print(f"{name:<52}{value:>28}  {want}")
    print("log lines: " + ", ".join(f"{k} {v}" for k, v in r["log_counts"].items()))
    if r["evidence"]:
        print(f"\n{len(r['evidence'])} flagged job(s), details in the JSON; first ones:")
        for item in r["evidence"][:5]:
            job = item["job"] or {}
            print(
                f"  {item['why']}: job {job.get('id')} {job.get('state')} attempt "
                f"{job.get('attempt')} tasks "
                f"{[(t['rank'], t['state'], t['reason'][:80]) for t in job.get('tasks') or []]}"
            )


def _interrupt(*_):
    raise KeyboardInterrupt


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=600, help="how long the load and the chaos last"
    )
    parser.add_argument(
        "--rate", type=float, default=9.0, help="jobs per second, all submitters together"
    )
    parser.add_argument("--agent-kill-every", type=float, default=90.0)
    parser.add_argument(
        "--sigterm", action="store_true", help="restart agents with SIGTERM instead of SIGKILL"
    )
    parser.add_argument("--no-fleetd-kill", action="store_true")
    parser.add_argument("--drain-seconds", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (logs, state)"
    )
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "soak.json"))
    # The load processes: this file again.
    parser.add_argument(
        "--role", choices=("main", "submitter", "instances"), default="main", help=argparse.SUPPRESS
    )
    for name in ("--url", "--token", "--out", "--side-log", "--run-id"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "submitter":
        return role_submitter(args)
    if args.role == "instances":
        return role_instances(args)
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        raise SystemExit("tasks run as their submitters' uids: run as root, with setpriv installed")

    top = tempfile.mkdtemp(prefix="fleet-soak-")
    os.chmod(top, 0o711)  # the agents' tasks run as other uids: their state dir must be passable
    os.chmod(top, 0o711)  # the agents' task dirs lie below: every task uid must pass
    soak = Soak(args, top)
    signal.signal(signal.SIGTERM, _interrupt)
    results, interrupted = None, False
    try:
        results = soak.run()
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: stopping everything this run started")
    finally:
        soak.cleanup()
    failed = results is None or any(results[k] for k in FAILING)
    if results is not None and (failed or args.keep):
        logs = ROOT / "bench" / "results" / "soak-logs"
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir(parents=True)
        for path in [soak.fleetd_log, soak.side_log] + [d / "agent.log" for d in soak.agent_dirs]:
            if path.exists():
                shutil.copy(
                    path,
                    logs
                    / (
                        path.parent.name + "-" + path.name
                        if "agent" in path.parent.name
                        else path.name
                    ),
                )
        log(f"logs copied to {logs}")
    if args.keep:
        log(f"kept {top}")
    else:
        shutil.rmtree(top, ignore_errors=True)
    if interrupted or results is None:
        return 130
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(
        json.dumps(
            {
                k: results[k]
                for k in (
                    "commit",
                    "acknowledged",
                    "outcomes",
                    "lost",
                    "ran_twice",
                    "ran_at_once",
                    "wrong_outcome",
                    "stuck",
                    "leaked_gpus",
                    LEAK_METRIC,
                    "instance_cycles",
                    "drain_seconds",
                )
            }
            | {
                "fleetd_rss_mib": {
                    k: v for k, v in results["fleetd_rss_mib"].items() if k != "samples"
                }
            }
        )
    )
    print_report(results)
    print(f"\nJSON: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
