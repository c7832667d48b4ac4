#!/usr/bin/env python3
"""Scale: one `fleetd serve` (SQLite) with 2 real agents, then with N simulated nodes heartbeating
and a deep queue of jobs that fit nowhere; and the scheduling pass in-process from 1k to 100k nodes.

Phases, in one run so that the noisy machine affects them alike:
  1. two real `fleet-agent run` processes on fake 8 x H100 hosts in fleet `real`, alone:
     --seq-jobs jobs one at a time (submit -> running latency, from fleetd's timestamps), then
     --jobs jobs from --threads threads (jobs/s, first submit to last end); every job selects
     fleet `real` and asks for --job-gpus GPUs;
  2. --nodes simulated nodes x 8 H100 (bench/scale_sim.py: one gevent process) register through
     the agent API (--register-concurrency at a time) into fleet `sim` and heartbeat at the
     interval fleetd gives them; --backlog jobs that fit nowhere (a GPU type no node has, in
     fleet `sim`; with --unscoped-backlog they name no fleet, as users mostly submit) are submitted
     in batches; the heartbeats run --settle-seconds at full size;
  3. the same two measurements again, heartbeats still running; then no simulated node may
     ever have been declared lost (GET /api/v1/nodes?status=lost, and fleetd's events);
  4. (--inprocess-nodes) for each N, in a fresh process (bench/scale_inprocess.py): N nodes x 8
     GPUs and --backlog unschedulable jobs in a fresh SQLite database, scheduling passes timed
     through fleetd.services.placement.scheduling.run_pass (no HTTP), with the process's memory; the
     first pass reads everything from the database, the later ones are timed as "warm".
fleetd's figures come from its own /metrics (fleetd_scheduling_pass_seconds, the heartbeat
route's latency) and /proc (VmHWM: peak RSS). Prints a table and writes JSON to
bench/results/scale.json (or --json).

    .venv/bin/python bench/scale.py --nodes 500 --backlog 200 --inprocess-nodes 1000  # 2 minutes
    .venv/bin/python bench/scale.py --nodes 2000 --backlog 500 --inprocess-nodes ""
    .venv/bin/python bench/scale.py --skip-fleet  # in-process only: 1k, 10k, 100k nodes
    .venv/bin/python bench/scale.py  # the issue's run: 10,000 nodes, 3,000 queued, 1k..100k
    .venv/bin/python bench/scale.py --unscoped-backlog --inprocess-nodes ""  # no fleet named

Submit -> running is given twice: from fleetd's timestamps (the task's start minus the job's
submit), and on the client's clock: submit, then long-poll GET /jobs/{id}?wait_seconds= as
`fleetd job submit --wait` does, until the job (a `true`) has ended.
"""

import argparse
import datetime as dt
import json
import os
import pathlib
import queue
import re
import resource
import sqlite3
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
MISSING_GPU_TYPE = "NVIDIA B300"  # no node has it: the backlog fits nowhere
GIB = 1 << 30
FAILOVER_GRACE_S = (
    60  # fleetd's default: no node is declared lost this long after start-up (2 x TTL)
)
TARGETS = {  # the targets at 10,000 nodes and 3,000 queued jobs
    "submit_to_running_p50_ms": 100,
    "jobs_per_s_ratio": 0.5,
    "heartbeat_p99_ms": 1000,
    "fleetd_peak_rss_bytes": 2 * GIB,
}


def percentiles(values):
    """{count, p50_ms, p95_ms, p99_ms, max_ms} of seconds."""
    if not values:
        return {"count": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(values)
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)  # noqa: E731
    return {
        "count": len(ordered),
        "p50_ms": pick(0.5),
        "p95_ms": pick(0.95),
        "p99_ms": pick(0.99),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def proc_status(pid):
    """{VmRSS, VmHWM} of a process in bytes, from /proc (what the kernel says, not an estimate)."""
    out = {}
    try:
        for line in open(f"/proc/{pid}/status"):
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def cpu_seconds(pid):
    """User + system CPU seconds of a process, from /proc."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def load_average():
    return os.getloadavg()[0]


def _parse_ts(ts):
    return (
        dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ")
        .replace(tzinfo=dt.timezone.utc)
        .timestamp()
    )


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the fleetd process and its API ----------------------------------------------------------


class Api:
    """The admin's JSON calls on one kept-alive connection (the standard library's client:
    cheap)."""

    def __init__(self, url, token, timeout=120):
        split = urllib.parse.urlsplit(url)
        self.host, self.port, self.timeout = split.hostname, split.port, timeout
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.conn = None

    def call(self, method, path, body=None, expect=(200, 201)):
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(2):  # a kept-alive connection fleetd closed meanwhile: one retry
            if self.conn is None:
                self.conn = HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=data, headers=self.headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                break
            except (ConnectionError, OSError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        if resp.status not in expect:
            raise RuntimeError(f"{method} {path} answered {resp.status}: {raw[:300]!r}")
        if resp.getheader("Content-Type", "").startswith("application/json"):
            return json.loads(raw) if raw else None
        return raw.decode()

    def pages(self, path, params):
        """Every item of a paginated list (bounded: 1,000 pages of 1,000)."""
        items, cursor = [], None
        for _ in range(1000):
            query = dict(params, limit=1000, **({"cursor": cursor} if cursor else {}))
            page = self.call("GET", f"{path}?{urllib.parse.urlencode(query)}")
            items += page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return items

    def close(self):
        if self.conn is not None:
            self.conn.close()


def init_data_dir(data_dir):
    """`fleetd init` of a data dir; returns the first admin token."""
    done = subprocess.run(
        [sys.executable, "-m", "fleetd", "init", "--data-dir", data_dir],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    return done.stdout.strip().splitlines()[-1]


def start_fleetd(data_dir, log_path, bind="127.0.0.1:0", init=True):
    """`fleetd init` (unless `init` is false: a restart) and `fleetd serve` on `bind`; returns
    (process, url, admin token or None)."""
    admin = init_data_dir(data_dir) if init else None
    logfile = open(log_path, "a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetd", "serve", "--bind", bind, "--data-dir", data_dir],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        # Registering the simulated nodes is set-up here, not a measure (bench/storms.py measures
        # the bounded storm): unbounded unless the caller says otherwise.
        env={"FLEETD_MAX_REGISTRATIONS_PER_SECOND": "0", **os.environ},
    )
    url = None
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        logfile.write(line)
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            url = match.group(1)
            break
        if time.monotonic() > deadline:
            break
    if not url:
        proc.kill()
        raise SystemExit(f"fleetd did not start; see {log_path}")

    def drain():  # fleetd's log goes to a file: a full pipe would block it
        for line in proc.stderr:
            logfile.write(line)
        logfile.close()

    threading.Thread(target=drain, daemon=True).start()
    return proc, url, admin


def start_agents(url, join, data_dir, count, fleet):
    """`count` real `fleet-agent run` processes on fake 8 x H100 hosts; returns their Popen
    objects."""
    agents = []
    try:
        for i in range(count):
            root = pathlib.Path(data_dir) / f"agent-{fleet}-{i}"
            root.mkdir()
            config = root / "agent.toml"
            servers = json.dumps(url.split(","))  # replicas: every URL, tried in turn
            config.write_text(
                f'server_url = {servers}\nstate_dir = "{root / "state"}"\n'
                f'machine_id = "bench-{fleet}-{i}"\n'
                f'log_level = "warning"\n[local_api]\nlisten = "127.0.0.1:0"\n'
                f'[devices]\nbackend = "fake:{SHAPE}"\n'
            )
            env = dict(
                os.environ, FLEET_AGENT_JOIN_TOKEN=join, FLEET_AGENT_MACHINE_ID=f"bench-{fleet}-{i}"
            )
            joined = subprocess.run(
                [sys.executable, "-m", "agent", "join", "--config", str(config)],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
                cwd=ROOT,
            )
            if joined.returncode:
                raise SystemExit(f"fleet-agent join failed: {joined.stderr[-2000:]}")
            agents.append(
                subprocess.Popen(
                    [sys.executable, "-m", "agent", "run", "--config", str(config)],
                    stdout=subprocess.DEVNULL,
                    stderr=open(root / "agent.log", "w"),
                    env=env,
                    cwd=ROOT,
                )
            )
    except BaseException:
        stop_processes(agents)
        raise
    return agents


def stop_processes(procs, timeout=30):
    """Terminate each process we started (by its own handle), then kill what is left."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def wait_ready(api, fleet, count, seconds=120):
    for _ in range(int(seconds * 10)):
        nodes = api.call("GET", f"/api/v1/nodes?fleet={fleet}&limit=1000")["items"]
        if sum(n["status"] == "ready" for n in nodes) >= count:
            return
        time.sleep(0.1)
    raise SystemExit(f"fewer than {count} nodes of fleet {fleet} became ready in {seconds} s")


# --- /metrics ----------------------------------------------------------------------------------


def scrape(api):
    """{metric sample name + labels: value} of fleetd's /metrics, for the families this bench
    reads."""
    from prometheus_client.parser import text_string_to_metric_families

    text = api.call("GET", "/metrics")
    out = {}
    for family in text_string_to_metric_families(text):
        if not (
            family.name.startswith("fleetd_scheduling")
            or family.name
            in (
                "fleetd_http_request_duration_seconds",
                "fleetd_heartbeats",
                "fleetd_job_queue_wait_seconds",
            )
        ):
            continue
        for sample in family.samples:
            if (
                family.name == "fleetd_http_request_duration_seconds"
                and "heartbeat" not in sample.labels.get("route", "")
            ):
                continue
            labels = tuple(
                sorted((k, v) for k, v in sample.labels.items() if k not in ("status", "method"))
            )
            key = (sample.name, labels)
            out[key] = out.get(key, 0.0) + sample.value
    return out


def histogram(before, after, name, route=None):
    """Count, mean and quantiles (Prometheus's histogram_quantile: linear in the bucket) of the
    observations of histogram `name` between two scrapes."""

    def pick(scrape_, suffix):
        rows = {}
        for (sample, labels), value in scrape_.items():
            labels = dict(labels)
            if sample != name + suffix or (route and route not in labels.get("route", "")):
                continue
            le = labels.get("le", "")
            rows[le] = rows.get(le, 0.0) + value
        return rows

    buckets = {
        le: v - pick(before, "_bucket").get(le, 0.0) for le, v in pick(after, "_bucket").items()
    }
    count = sum(pick(after, "_count").values()) - sum(pick(before, "_count").values())
    total = sum(pick(after, "_sum").values()) - sum(pick(before, "_sum").values())
    bounds = sorted((float(le), v) for le, v in buckets.items())
    out = {"count": int(count), "mean_ms": round(1000 * total / count, 2) if count else None}
    for q in (0.5, 0.99):
        out[f"p{int(q * 100)}_ms"] = _quantile(q, bounds, count)
    return out


def _quantile(q, bounds, count):
    if not count or not bounds:
        return None
    rank, lower, below = q * count, 0.0, 0.0
    for upper, cumulative in bounds:
        if cumulative >= rank:
            if upper == float("inf"):
                return f">{lower * 1000:g}"  # beyond the last finite bucket: only a bound is known
            inside = cumulative - below
            return round(
                1000 * (lower + (upper - lower) * ((rank - below) / inside if inside else 1)), 2
            )
        lower, below = upper, cumulative
    return None


def counters(before, after, prefix):
    """Counters (not histograms) named `prefix`* that moved between two scrapes."""
    out = {}
    for key, value in after.items():
        name = key[0]
        if name.startswith(prefix) and not name.endswith(("_bucket", "_count", "_sum", "_created")):
            out[name] = value - before.get(key, 0.0)
    return out


# --- the two job measurements ------------------------------------------------------------------


def job_spec(fleet, gpus):
    return {
        "name": "noop",
        "command": ["true"],
        "node_selector": {"fleet": fleet},
        "resources": {"gpus": gpus},
    }


def sequential_jobs(api, spec, count, timeout):
    """`count` jobs one at a time: submit, wait until it ended; submit -> running from fleetd's
    timestamps."""
    starts, placed, client, failures = [], [], [], 0
    deadline = time.monotonic() + timeout
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        job = api.call("POST", "/api/v1/jobs", spec)
        done = job
        for _ in range(20):  # each wait is at most 30 s
            done = api.call("GET", f"/api/v1/jobs/{job['id']}?wait_seconds=30")
            if done["state"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
                break
        client.append(time.perf_counter() - t0)
        task = done["tasks"][0] if done.get("tasks") else {}
        if done["state"] != "succeeded" or not task.get("started_at"):
            failures += 1
            continue
        starts.append(_parse_ts(task["started_at"]) - _parse_ts(done["submitted_at"]))
        if done.get("started_at"):
            placed.append(_parse_ts(done["started_at"]) - _parse_ts(done["submitted_at"]))
    return {
        "submit_to_running": percentiles(starts),
        "job_started_at": percentiles(placed),
        "client_submit_to_end": percentiles(client),
        "failed": failures,
        "jobs": count,
    }


def concurrent_jobs(url, admin, spec, count, threads, timeout):
    """`count` jobs from `threads` threads, each submitting its share then waiting for each to end;
    jobs/s from the first submit to the last end (fleetd's timestamps)."""
    ids, ended, lock, failures = [], {}, threading.Lock(), []
    deadline = time.monotonic() + timeout
    shares = [count // threads + (i < count % threads) for i in range(threads)]
    t0, wall0 = time.perf_counter(), time.time()

    def worker(n):
        api = Api(url, admin)
        mine = []
        try:
            for _ in range(n):
                mine.append(api.call("POST", "/api/v1/jobs", spec)["id"])
            with lock:
                ids.extend(mine)
            for job_id in mine:
                for _ in range(40):
                    if time.monotonic() > deadline:
                        return
                    job = api.call("GET", f"/api/v1/jobs/{job_id}?wait_seconds=30")
                    if job["state"] in ("succeeded", "failed", "cancelled"):
                        with lock:
                            ended[job_id] = job
                        break
        except Exception as exc:  # reported below, the other threads go on
            failures.append(repr(exc))
        finally:
            api.close()

    workers = [threading.Thread(target=worker, args=(n,)) for n in shares if n]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout + 60)
    elapsed = time.perf_counter() - t0
    jobs = list(ended.values())
    succeeded = sum(j["state"] == "succeeded" for j in jobs)
    last_end = max((_parse_ts(j["ended_at"]) for j in jobs if j.get("ended_at")), default=None)
    span = (last_end - wall0) if last_end else elapsed
    return {
        "jobs": count,
        "submitted": len(ids),
        "ended": len(jobs),
        "succeeded": succeeded,
        "seconds": round(span, 2),
        "jobs_per_s": round(succeeded / span, 1) if span > 0 else None,
        "client_seconds": round(elapsed, 2),
        "threads": threads,
        "failures": failures[:5],
    }


def submit_backlog(url, admin, spec, count, batch, threads):
    """`count` jobs that fit nowhere, `batch` at a time from `threads` threads; returns the
    figures."""
    batches, started = [], time.perf_counter()
    failures = []
    for first in range(0, count, batch):
        n = min(batch, count - first)
        shares = [n // threads + (i < n % threads) for i in range(threads)]
        t0 = time.perf_counter()

        def worker(k):
            api = Api(url, admin)
            try:
                for _ in range(k):
                    api.call("POST", "/api/v1/jobs", spec)
            except Exception as exc:
                failures.append(repr(exc))
            finally:
                api.close()

        workers = [threading.Thread(target=worker, args=(k,)) for k in shares if k]
        for w in workers:
            w.start()
        for w in workers:
            w.join(600)
        batches.append(round(n / (time.perf_counter() - t0), 1))
        if failures:
            break
    return {
        "jobs": count,
        "seconds": round(time.perf_counter() - started, 2),
        "batch": batch,
        "per_s_by_batch": batches,
        "failures": failures[:5],
    }


def measure_jobs(api, url, admin, args, label, fleetd_pid):
    """The two measurements on fleet `real`, with fleetd's pass histogram over them."""
    spec = job_spec("real", args.job_gpus)
    before = scrape(api)
    cpu0, t0 = cpu_seconds(fleetd_pid), time.perf_counter()
    log(f"{label}: {args.seq_jobs} sequential jobs")
    seq = sequential_jobs(api, spec, args.seq_jobs, args.phase_timeout)
    log(f"{label}: {args.jobs} jobs from {args.threads} threads")
    conc = concurrent_jobs(url, admin, spec, args.jobs, args.threads, args.phase_timeout)
    after = scrape(api)
    wall = time.perf_counter() - t0
    return {
        "sequential": seq,
        "concurrent": conc,
        "seconds": round(wall, 1),
        "scheduling_pass": histogram(before, after, "fleetd_scheduling_pass_seconds"),
        "scheduling_counters": counters(before, after, "fleetd_scheduling"),
        "heartbeat_route": histogram(
            before, after, "fleetd_http_request_duration_seconds", "heartbeat"
        ),
        "fleetd_cpu_percent": round(100 * (cpu_seconds(fleetd_pid) - cpu0) / wall, 1),
        "fleetd_memory": proc_status(fleetd_pid),
        "load_average": round(load_average(), 2),
    }


# --- simulated nodes -----------------------------------------------------------------------------


class Simulator:
    """bench/scale_sim.py as a child process: JSON lines out, `report`/`stop` in."""

    def __init__(self, url, join, args, log_path):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "scale_sim.py"),
                "--url",
                url,
                "--join",
                join,
                "--nodes",
                str(args.nodes),
                "--register-concurrency",
                str(args.register_concurrency),
                "--connections",
                str(args.sim_connections),
                "--max-seconds",
                str(args.max_seconds),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(log_path, "w"),
            text=True,
            cwd=ROOT,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def next(self, timeout):
        try:
            item = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise SystemExit(f"the simulator said nothing in {timeout:.0f} s") from None
        if item is None:
            raise SystemExit(f"the simulator exited (status {self.proc.poll()})")
        return item

    def send(self, word):
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def report(self, timeout=120):
        self.send("report")
        return self.next(timeout)

    def stop(self, timeout=120):
        if self.proc.poll() is not None:
            return None
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
            return self.next(timeout)
        except (OSError, SystemExit):
            return None
        finally:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


#: Simulated nodes ever declared lost, from fleetd's events (the same SQL on SQLite and PostgreSQL).
EVER_LOST_SQL = (
    "SELECT COUNT(DISTINCT e.subject_id) FROM event e JOIN node n ON n.id = e.subject_id "
    "WHERE e.subject_type = 'node' AND e.to_status = 'lost' AND n.fleet = 'sim'"
)


def lost_nodes(api, data_dir):
    """Simulated nodes lost now (the API) and ever (fleetd's events, read from its database)."""
    now = [n["id"] for n in api.pages("/api/v1/nodes", {"status": "lost", "fleet": "sim"})]
    ever = None
    try:
        db = sqlite3.connect(
            f"file:{os.path.join(data_dir, 'fleetd.db')}?mode=ro", uri=True, timeout=30
        )
        try:
            ever = db.execute(EVER_LOST_SQL).fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error as exc:
        ever = f"unknown ({exc})"
    return {"lost_now": len(now), "ever_lost": ever}


# --- the fleet run -------------------------------------------------------------------------------


def run_fleet(args, data_dir):
    results = {"phases": {}}
    procs = []
    sim = None
    fleetd, url, admin = start_fleetd(data_dir, os.path.join(data_dir, "fleetd.log"))
    fleetd_started = time.monotonic()
    procs.append(fleetd)
    api = Api(url, admin)
    try:
        results["fleetd_pid_memory_at_start"] = proc_status(fleetd.pid)
        for fleet in ("real", "sim"):
            api.call("POST", "/api/v1/fleets", {"name": fleet})
        real_join = api.call("POST", "/api/v1/fleets/real/join-tokens", {})["token"]
        sim_join = api.call("POST", "/api/v1/fleets/sim/join-tokens", {})["token"]
        t0 = time.perf_counter()
        agents = start_agents(url, real_join, data_dir, 2, "real")
        procs.extend(agents)
        wait_ready(api, "real", 2)
        log(f"fleetd at {url}; 2 real agents ready in {time.perf_counter() - t0:.1f} s")

        results["phases"]["empty"] = measure_jobs(api, url, admin, args, "empty fleet", fleetd.pid)

        log(f"registering {args.nodes} simulated nodes ({args.register_concurrency} at a time)")
        sim = Simulator(url, sim_join, args, os.path.join(data_dir, "sim.log"))
        procs.append(sim.proc)
        registered = sim.next(timeout=args.max_seconds)
        registering = sim.next(timeout=120)
        results["register"] = registered
        results["heartbeats_while_registering"] = registering
        log(
            f"registered {registered['nodes']} in {registered['seconds']} s "
            f"({registered['per_s']}/s)"
        )
        if registered["nodes"] < args.nodes:
            log(
                f"WARNING: only {registered['nodes']} of {args.nodes} registered: "
                f"{registered['failures']}"
            )

        log(
            f"submitting {args.backlog} jobs that fit "
            f"nowhere{' (no fleet named)' if args.unscoped_backlog else ''}"
        )
        backlog_spec = dict(
            job_spec("sim", 1),
            name="backlog",
            resources={"gpus": 1, "gpu_types": [MISSING_GPU_TYPE]},
        )
        if args.unscoped_backlog:  # as users mostly submit: any fleet will do
            del backlog_spec["node_selector"]
        results["backlog"] = submit_backlog(
            url, admin, backlog_spec, args.backlog, args.backlog_batch, args.threads
        )
        log(
            f"backlog submitted in {results['backlog']['seconds']} s; settling "
            f"{args.settle_seconds:.0f} s"
        )
        results["heartbeats_while_submitting"] = sim.report()

        settle_before = scrape(api)
        time.sleep(args.settle_seconds)
        settle_after = scrape(api)
        results["heartbeats_settle"] = sim.report()
        results["settle"] = {
            "seconds": args.settle_seconds,
            "scheduling_pass": histogram(
                settle_before, settle_after, "fleetd_scheduling_pass_seconds"
            ),
            "scheduling_counters": counters(settle_before, settle_after, "fleetd_scheduling"),
            "heartbeat_route": histogram(
                settle_before, settle_after, "fleetd_http_request_duration_seconds", "heartbeat"
            ),
            "fleetd_memory": proc_status(fleetd.pid),
        }

        results["phases"]["loaded"] = measure_jobs(
            api, url, admin, args, f"{args.nodes} nodes + backlog", fleetd.pid
        )
        results["heartbeats_loaded"] = sim.report()
        results["lost"] = lost_nodes(api, data_dir)
        # fleetd declares nothing lost during its failover grace after start-up: the check means
        # something only for the time after it.
        results["lost"]["fleetd_up_s"] = round(time.monotonic() - fleetd_started, 1)
        results["heartbeats_final"] = sim.stop()
        log("stopping the agents and fleetd")
        final = results["heartbeats_final"] or {}
        results["heartbeats_after_registration"] = final.get("since_registration")
        results["fleetd_memory_end"] = proc_status(fleetd.pid)
        results["fleetd_url"] = url
    finally:
        api.close()
        if sim is not None:
            sim.stop()
        t0 = time.perf_counter()
        stop_processes([p for p in procs if p is not fleetd])
        t1 = time.perf_counter()
        stop_processes([fleetd])
        log(
            f"stopped: agents and simulator in {t1 - t0:.1f} s, fleetd in "
            f"{time.perf_counter() - t1:.1f} s"
        )
    return results


# --- in-process: the pass at 1k..100k nodes -------------------------------------------------------


def run_inprocess(args):
    """Each N in its own fresh process (clean memory figures), bounded by --inprocess-timeout."""
    rows = []
    for n in args.inprocess_sizes:
        log(f"in-process: {n} nodes, {args.backlog} queued jobs")
        cmd = [
            sys.executable,
            str(ROOT / "bench" / "scale_inprocess.py"),
            "--nodes",
            str(n),
            "--backlog",
            str(args.backlog),
            "--passes",
            str(args.inprocess_passes),
            "--budget",
            str(args.inprocess_timeout),
        ] + (["--unscoped-backlog"] if args.unscoped_backlog else [])
        steps, timed_out = [], False
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
        )
        try:
            out, err = proc.communicate(timeout=args.inprocess_timeout + 120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            timed_out = True
        for line in out.splitlines():
            try:
                steps.append(json.loads(line))
            except ValueError:
                pass
        rows.append(summarize_inprocess(n, steps, timed_out, proc.returncode, err))
        log(f"in-process {n}: {rows[-1]}")
    return rows


def summarize_inprocess(n, steps, timed_out, returncode, stderr):
    by = {}
    passes = []
    for s in steps:
        if s["step"] == "pass":
            passes.append(s)
        else:
            by[s["step"]] = s
    base = by.get("app", {}).get("rss", {}).get("VmRSS")
    after_pass = passes[0]["rss"].get("VmRSS") if passes else None
    last = steps[-1]["rss"] if steps else {}
    warm = sorted(p["seconds"] for p in passes[1:])
    row = {
        "nodes": n,
        "gpus": 8 * n,
        "setup_nodes_s": by.get("nodes", {}).get("seconds"),
        "setup_backlog_s": by.get("backlog", {}).get("seconds"),
        "first_pass_s": passes[0]["seconds"] if passes else None,
        "warm_pass_s": warm[len(warm) // 2] if warm else None,
        "passes": [p["seconds"] for p in passes],
        "pass_outcome": passes[-1]["outcome"] if passes else None,
        "rss_app_bytes": base,
        "rss_after_nodes_bytes": by.get("nodes", {}).get("rss", {}).get("VmRSS"),
        "rss_after_first_pass_bytes": after_pass,
        "peak_rss_bytes": passes[-1]["rss"].get("VmHWM")
        if passes
        else None,  # before the breakdown's own copy
        "peak_rss_whole_worker_bytes": last.get("VmHWM"),
        "tracemalloc_pass_peak_bytes": by.get("tracemalloc", {}).get("pass_peak_bytes"),
        "tracemalloc_pass_kept_bytes": by.get("tracemalloc", {}).get("pass_kept_bytes"),
        "breakdown": {
            k: v for k, v in by.get("breakdown", {}).items() if k not in ("step", "nodes", "rss")
        },
        "probe_outcome": by.get("probe", {}).get("outcome"),  # one job that fits: assigned 1
        "placeable_pass_p50_s": by.get("placeable", {}).get("p50_seconds"),
        "placeable_pass_max_s": by.get("placeable", {}).get("max_seconds"),
        "timed_out": timed_out,
        "total_s": by.get("done", {}).get("seconds"),
    }
    if returncode not in (0, None) and not timed_out:
        row["error"] = (
            stderr.strip().splitlines()[-1][:300] if stderr.strip() else f"exit {returncode}"
        )
    return row


# --- the report -----------------------------------------------------------------------------------


def _fmt(value, unit=""):
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value + unit
    return f"{value:,.1f}{unit}" if isinstance(value, float) else f"{value:,}{unit}"


def _mib(value):
    return "n/a" if value is None else f"{value / 2**20:,.0f} MiB"


def print_report(results, args):
    fleet = results.get("fleet")
    if fleet:
        empty, loaded = fleet["phases"]["empty"], fleet["phases"].get("loaded")
        scope = "naming no fleet" if args.unscoped_backlog else "in fleet sim"
        print(
            f"\nfleet: 2 real agents (fleet real) + {args.nodes:,} simulated nodes x 8 GPUs, "
            f"{args.backlog:,} queued jobs that fit nowhere ({scope}); {os.cpu_count()} cores"
        )
        rows = []

        def both(name, get, target=""):
            rows.append((name, get(empty), get(loaded) if loaded else None, target))

        both(
            "submit -> running p50 ms",
            lambda p: p["sequential"]["submit_to_running"]["p50_ms"],
            "< 100 (loaded)",
        )
        both("submit -> running p99 ms", lambda p: p["sequential"]["submit_to_running"]["p99_ms"])
        both(
            "client: submit -> ended p50 ms (long-poll)",
            lambda p: p["sequential"]["client_submit_to_end"]["p50_ms"],
        )
        both(
            "client: submit -> ended p99 ms (long-poll)",
            lambda p: p["sequential"]["client_submit_to_end"]["p99_ms"],
        )
        both(
            f"jobs/s ({args.jobs} jobs, {args.threads} threads)",
            lambda p: p["concurrent"]["jobs_per_s"],
            ">= 50 % of empty",
        )
        both("scheduling pass p50 ms (/metrics)", lambda p: p["scheduling_pass"]["p50_ms"])
        both(
            "scheduling pass p99 ms (/metrics)",
            lambda p: p["scheduling_pass"]["p99_ms"],
            "reported",
        )
        both("scheduling passes", lambda p: p["scheduling_pass"]["count"])
        both("heartbeat route p99 ms (/metrics)", lambda p: p["heartbeat_route"]["p99_ms"])
        both("fleetd CPU %", lambda p: p["fleetd_cpu_percent"])
        both("fleetd RSS", lambda p: _mib(p["fleetd_memory"].get("VmRSS")))
        print(f"{'measure':<40}{'empty':>14}{'loaded':>14}  target")
        for name, a, b, target in rows:
            print(f"{name:<40}{_fmt(a):>14}{_fmt(b):>14}  {target}")
        reg = fleet["register"]
        hb = fleet["heartbeats_after_registration"]
        settle = fleet["settle"]
        ratio = (
            loaded["concurrent"]["jobs_per_s"] / empty["concurrent"]["jobs_per_s"]
            if loaded and empty["concurrent"]["jobs_per_s"] and loaded["concurrent"]["jobs_per_s"]
            else None
        )
        print(
            f"\nregistration: {reg['nodes']:,} of {reg['wanted']:,} nodes in {reg['seconds']} s "
            f"({reg['per_s']}/s, {reg['concurrency']} at a time), p50 {reg['latency']['p50_ms']} "
            f"ms, p99 {reg['latency']['p99_ms']} ms, failures {reg['failures'] or 'none'}; "
            f"interval given {reg['interval_s']} s"
        )
        bl = fleet["backlog"]
        print(
            f"backlog: {bl['jobs']:,} jobs in {bl['seconds']} s (jobs/s by batch of {bl['batch']}: "
            f"{bl['per_s_by_batch']}){' FAILURES ' + str(bl['failures']) if bl['failures'] else ''}"
        )
        print(
            f"settle {settle['seconds']:.0f} s: pass p50 {settle['scheduling_pass']['p50_ms']} ms, "
            f"p99 {settle['scheduling_pass']['p99_ms']} ms over "
            f"{settle['scheduling_pass']['count']} passes; heartbeat route p99 "
            f"{settle['heartbeat_route']['p99_ms']} ms; counters {settle['scheduling_counters']}"
        )
        if hb:
            print(
                f"heartbeats after registration: {hb['heartbeats']:,} in {hb['seconds']} s "
                f"({hb['per_s']}/s); agent side (due -> reply) p50 {hb['latency']['p50_ms']} ms, "
                f"p99 {hb['latency']['p99_ms']} ms, max {hb['latency']['max_ms']} ms; fleetd side "
                f"(sent -> reply) p99 {hb['service']['p99_ms']} ms; waiting here for a connection "
                f"p99 {hb['late']['p99_ms']} ms (queue up to {hb['max_queue']}); longest silence "
                f"of a node {hb['max_gap_s']} s; failures {hb['failures'] or 'none'}; replies not "
                f"ready {hb['statuses'] or 'none'}; intervals given {hb['intervals']}"
            )
        cpu = [
            w.get("client_cpu_percent")
            for w in (fleet["heartbeats_settle"], fleet["heartbeats_loaded"])
            if w
        ]
        print(
            f"simulator CPU: {cpu} % of one core (settle, loaded); whole run "
            f"{hb.get('client_cpu_percent') if hb else None} %"
        )
        lost = fleet["lost"]
        peak = fleet["fleetd_memory_end"].get("VmHWM")
        print("\ntargets:")
        checks = [
            (
                "submit -> running p50 < 100 ms (loaded)",
                loaded
                and (loaded["sequential"]["submit_to_running"]["p50_ms"] or 1e9)
                < TARGETS["submit_to_running_p50_ms"],
                f"{loaded and loaded['sequential']['submit_to_running']['p50_ms']} ms",
            ),
            (
                "jobs/s loaded >= 50 % of empty",
                ratio is not None and ratio >= TARGETS["jobs_per_s_ratio"],
                f"{ratio:.0%}" if ratio is not None else "n/a",
            ),
            (
                "no simulated node ever lost",
                lost["lost_now"] == 0 and lost["ever_lost"] == 0,
                f"now {lost['lost_now']}, ever {lost['ever_lost']} (fleetd up "
                f"{lost['fleetd_up_s']} s; none can be lost in its first {FAILOVER_GRACE_S} s)",
            ),
            (
                "heartbeat p99 < 1 s (agent side, after registration)",
                bool(hb) and (hb["latency"]["p99_ms"] or 1e9) < TARGETS["heartbeat_p99_ms"],
                f"{hb['latency']['p99_ms'] if hb else None} ms",
            ),
            (
                "fleetd peak RSS < 2 GiB",
                peak is not None and peak < TARGETS["fleetd_peak_rss_bytes"],
                _mib(peak),
            ),
        ]
        if lost["fleetd_up_s"] < FAILOVER_GRACE_S + 5:  # + one liveness sweep
            checks[2] = (checks[2][0], None, checks[2][2] + ": too short a run to tell")
        for name, ok, value in checks:
            print(f"  {'PASS' if ok else 'FAIL' if ok is not None else 'N/A '}  {name}: {value}")
        fleet["targets"] = {
            name: {"ok": None if ok is None else bool(ok), "value": value}
            for name, ok, value in checks
        }
    rows = results.get("inprocess") or []
    if rows:
        print(
            f"\nin-process scheduling pass ({args.backlog:,} queued jobs that fit nowhere; SQLite, "
            f"no HTTP):"
        )
        print(
            f"{'nodes':>8}{'GPUs':>9}{'setup s':>9}{'1st pass ms':>12}{'warm pass ms':>13}"
            f"{'RSS app':>10}{'RSS +nodes':>12}{'RSS 1st pass':>13}{'peak RSS':>10}"
            f"{'pass alloc':>12}{'state ms':>10}{'engine ms':>10}{'place ms/job':>13}"
            f"{'fits: pass ms p50/max':>23}"
        )
        ms = lambda seconds: None if seconds is None else round(1000 * seconds, 1)  # noqa: E731
        for r in rows:
            b = r["breakdown"]
            alloc = r["tracemalloc_pass_peak_bytes"]
            fits = f"{_fmt(ms(r['placeable_pass_p50_s']))} / {_fmt(ms(r['placeable_pass_max_s']))}"
            print(
                f"{r['nodes']:>8,}{r['gpus']:>9,}{_fmt(r['setup_nodes_s']):>9}{_fmt(ms(r['first_pass_s'])):>12}"
                f"{_fmt(ms(r['warm_pass_s'])):>13}{_mib(r['rss_app_bytes']):>10}"
                f"{_mib(r['rss_after_nodes_bytes']):>12}"
                f"{_mib(r['rss_after_first_pass_bytes']):>13}{_mib(r['peak_rss_bytes']):>10}"
                f"{'n/a' if alloc is None else f'{alloc / 2**20:.1f} MiB':>12}"
                f"{_fmt(ms(b.get('state_load_s'))):>10}{_fmt(ms(b.get('engine_build_s'))):>10}"
                f"{_fmt(b.get('place_ms_per_job')):>13}"
                f"{fits:>23}"
                + ("  TIMED OUT" if r["timed_out"] else "")
                + (f"  {r['error']}" if r.get("error") else "")
                + (f"  breakdown: {b['error']}" if b.get("error") else "")
                + (
                    ""
                    if (r.get("probe_outcome") or {}).get("assigned") == 1
                    else f"  WARNING: a job that fits was not placed ({r.get('probe_outcome')})"
                )
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000, help="simulated nodes, 8 GPUs each")
    parser.add_argument("--backlog", type=int, default=3000, help="queued jobs that fit nowhere")
    parser.add_argument(
        "--unscoped-backlog",
        action="store_true",
        help="the backlog names no fleet (as users mostly submit), instead of fleet sim",
    )
    parser.add_argument(
        "--backlog-batch", type=int, default=500, help="backlog jobs submitted per batch"
    )
    parser.add_argument("--seq-jobs", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--job-gpus", type=int, default=1, help="GPUs each measured job asks for")
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=60,
        help="heartbeats at full size before measuring (fleetd declares none lost in its first "
        "2 x TTL anyway: make the whole run outlast that)",
    )
    parser.add_argument("--register-concurrency", type=int, default=16)
    parser.add_argument(
        "--sim-connections", type=int, default=256, help="the simulator's keep-alive connections"
    )
    parser.add_argument(
        "--phase-timeout", type=float, default=900, help="bound on each job measurement"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=7200, help="bound on the simulator's life"
    )
    parser.add_argument("--skip-fleet", action="store_true", help="only the in-process part")
    parser.add_argument(
        "--inprocess-nodes", default="1000,10000,100000", help="comma-separated; empty: skip"
    )
    parser.add_argument("--inprocess-passes", type=int, default=3)
    parser.add_argument(
        "--inprocess-timeout", type=float, default=900, help="bound on each in-process size"
    )
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "scale.json"))
    args = parser.parse_args()
    args.inprocess_sizes = [int(x) for x in args.inprocess_nodes.split(",") if x.strip()]

    results = {
        "args": vars(args),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    try:
        results["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    t0 = time.perf_counter()
    if not args.skip_fleet:
        with tempfile.TemporaryDirectory() as data_dir:
            os.chmod(
                data_dir, 0o711
            )  # the agents' tasks run as other uids: their state dir must be passable
            results["fleet"] = run_fleet(args, data_dir)
        results["fleet_seconds"] = round(time.perf_counter() - t0, 1)
    t1 = time.perf_counter()
    if args.inprocess_sizes:
        results["inprocess"] = run_inprocess(args)
        results["inprocess_seconds"] = round(time.perf_counter() - t1, 1)
    results["bench_cpu_seconds"] = round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1)
    print_report(results, args)
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(
        f"\nJSON: {out}  (fleet {results.get('fleet_seconds', 0)} s, "
        f"in-process {results.get('inprocess_seconds', 0)} s)"
    )


if __name__ == "__main__":
    main()
